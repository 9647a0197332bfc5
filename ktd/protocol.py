"""Control-API messages: the contract between ktd, ktctl, the frontend and local tools.

Pure data, msgspec only (ktctl imports this and must start fast). Requests and
replies are two tagged unions encoded as msgpack. Unknown *fields* are tolerated
on the wire so that a newer ktctl can talk to an older ktd and back; an unknown
*op* is a ``bad_request``.

Framing: a client's DEALER sends one frame (the encoded request); the daemon's
ROUTER sees ``[identity, payload]`` and answers ``[identity, reply]``. An empty
delimiter frame, as REQ sockets add, is accepted and echoed.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

# Wire limits. MAX_FRAME is what the daemon decodes; bigger frames get a
# bad_request without being parsed. zmq's MAXMSGSIZE (HARD_MAX_FRAME) drops
# the peer's connection before the bytes reach Python at all.
MAX_FRAME = 1 << 20
HARD_MAX_FRAME = 16 << 20


class ErrorCode:
    """Stable error codes: scripts match on these strings, never rename one."""

    UNKNOWN_MODEL = "unknown_model"
    NOT_KT = "not_kt"
    LOAD_FAILED = "load_failed"
    BUSY = "busy"
    TIMEOUT = "timeout"
    BAD_REQUEST = "bad_request"
    NOT_LOADED = "not_loaded"
    CONFIG_ERROR = "config_error"
    SHUTTING_DOWN = "shutting_down"
    INTERNAL = "internal"


# ---------------------------------------------------------------- requests


class Request(msgspec.Struct, tag_field="op", kw_only=True):
    id: int = 0


class Ping(Request, tag="ping"):
    pass


class Status(Request, tag="status"):
    alias: str | None = None


class Models(Request, tag="models"):
    pass


class Load(Request, tag="load"):
    alias: str
    wait: bool = True
    timeout: float | None = None
    dry_run: bool = False


class Evict(Request, tag="evict"):
    alias: str | None = None
    all: bool = False
    force: bool = False
    timeout: float | None = None


class Logs(Request, tag="logs"):
    alias: str
    lines: int = 100
    probes: bool = False  # include the access lines of ktd's own health checks


class Reload(Request, tag="reload"):
    pass


class Acquire(Request, tag="acquire"):
    """Ask for a lease on the engine serving ``model``, loading it if allowed.

    ``client`` names the frontend instance; its leases expire when it stops
    sending heartbeats, so a frontend killed mid-request cannot pin an engine.
    """

    model: str
    client: str
    autoload: bool = True
    timeout: float | None = None


class Release(Request, tag="release"):
    lease: str


class Heartbeat(Request, tag="heartbeat"):
    client: str


class Doctor(Request, tag="doctor"):
    pass


class Shutdown(Request, tag="shutdown"):
    pass


AnyRequest = (
    Ping
    | Status
    | Models
    | Load
    | Evict
    | Logs
    | Reload
    | Acquire
    | Release
    | Heartbeat
    | Doctor
    | Shutdown
)

# ---------------------------------------------------------------- replies


class EngineInfo(msgspec.Struct, kw_only=True):
    """One engine as ``ktctl status --json`` shows it. Fields are only ever added."""

    alias: str
    state: str
    pid: int | None = None
    port: int | None = None
    argv: list[str] = []
    numa_nodes: list[int] = []
    gpus: list[int] = []
    since: float = 0.0
    reason: str | None = None
    leases: int = 0
    url: str | None = None
    cpus: list[int] = []
    restarts: int = 0
    last_used: float | None = None
    pinned: bool = False
    stale: bool = False
    log_tail: list[str] = []
    phase: str | None = None
    sglang: str | None = None  # the SGLang it was launched with: "sglang-kt 0.7.2"
    notes: list[str] = []  # what ktd left out of the argv for that SGLang, and why
    # Added for an ``ollama ps``-like status (issue 13); wall-clock seconds since the epoch.
    started_at: float | None = None  # the engine process's start: uptime, kept across adoption
    ttl: float = 0.0  # idle TTL in seconds (0: none)
    expires_at: float | None = None  # when the idle TTL evicts it (None: never / busy)
    load_started: float | None = None  # this load's start, while starting
    load_eta: float | None = None  # expected load duration (median of recent loads)
    last_log: str | None = None  # the engine's last log line (never in ``state``/``phase``)


class ModelInfo(msgspec.Struct, kw_only=True):
    alias: str
    backend: str
    served: bool
    path: str
    state: str = "stopped"
    reason: str | None = None


class Reply(msgspec.Struct, tag_field="type", kw_only=True):
    id: int = 0


class Pong(Reply, tag="pong"):
    version: str
    pid: int


class StatusReply(Reply, tag="status"):
    engines: list[EngineInfo]


class ModelsReply(Reply, tag="models"):
    models: list[ModelInfo]


class LoadReply(Reply, tag="load"):
    engine: EngineInfo


class PlanReply(Reply, tag="plan"):
    plan: dict[str, Any]


class EvictReply(Reply, tag="evict"):
    evicted: list[str]


class LogsReply(Reply, tag="logs"):
    alias: str
    lines: list[str]


class AcquireReply(Reply, tag="acquire"):
    lease: str
    alias: str
    url: str


class DoctorReply(Reply, tag="doctor"):
    report: dict[str, Any]


class Ok(Reply, tag="ok"):
    message: str = ""


class Error(Reply, tag="error"):
    code: str
    message: str
    detail: dict[str, Any] = {}


AnyReply = (
    Pong
    | StatusReply
    | ModelsReply
    | LoadReply
    | PlanReply
    | EvictReply
    | LogsReply
    | AcquireReply
    | DoctorReply
    | Ok
    | Error
)

# ---------------------------------------------------------------- events


class Event(msgspec.Struct, kw_only=True):
    """Published on the PUB socket as ``[topic, msgpack(Event)]``.

    Topics: ``engine.<alias>`` (state changes), ``log.<alias>`` (log lines),
    ``lease.<alias>`` (lease count changes), ``probe.<alias>`` (the engine's access
    lines for ktd's own health checks, kept off ``log.`` so they do not bury the rest).
    """

    topic: str
    time: float
    alias: str
    state: str | None = None
    reason: str | None = None
    lines: list[str] = []
    leases: int | None = None
    pid: int | None = None
    port: int | None = None
    phase: str | None = None
    load_started: float | None = None
    load_eta: float | None = None


EngineState = Literal["stopped", "starting", "ready", "draining", "stopping", "failed"]

_request_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(AnyRequest)
_reply_decoder = msgspec.msgpack.Decoder(AnyReply)
_event_decoder = msgspec.msgpack.Decoder(Event)


def encode(msg: msgspec.Struct) -> bytes:
    return _request_encoder.encode(msg)


def decode_request(data: bytes) -> Request:
    """Raise ``msgspec.DecodeError``/``ValidationError`` on anything malformed."""
    return _request_decoder.decode(data)


def decode_reply(data: bytes) -> Reply:
    return _reply_decoder.decode(data)


def decode_event(data: bytes) -> Event:
    return _event_decoder.decode(data)


def peek_id(data: bytes) -> int:
    """Best-effort request id of a frame that failed to decode, so the error reply matches."""
    try:
        obj = msgspec.msgpack.decode(data)
    except Exception:
        return 0
    if isinstance(obj, dict):
        rid = obj.get("id")
        if isinstance(rid, int) and not isinstance(rid, bool) and -(2**63) <= rid < 2**64:
            return rid
    return 0
