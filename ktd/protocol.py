"""Control-API messages: the contract between ktd, ktctl, the frontend and local tools.

Pure data, msgspec only (ktctl imports this and must start fast). Requests and
replies are two tagged unions encoded as msgpack. Unknown *fields* are tolerated
on the wire so that a newer ktctl can talk to an older ktd and back; an unknown
*op* is a ``bad_request``.

The protocol is public (``docs/protocol.md``): ``PROTOCOL`` is its version, and
``docs/protocol/ktd-control-<major>.<minor>.json`` its JSON Schema, generated from
these types by ``python -m ktd.protocol_schema --write`` (a test fails when they
differ). Every change here follows the compatibility rules written there: a minor
adds optional fields, requests, replies to new requests and values of open
vocabularies (states, steps, error codes); anything else is a new major.

Framing: a client's DEALER sends one frame (the encoded request); the daemon's
ROUTER sees ``[identity, payload]`` and answers ``[identity, reply]``. An empty
delimiter frame, as REQ sockets add, is accepted and echoed.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import msgspec

from ktd import foreign

# Part of this module's names for clients (tests/test_exports.py): the ids of frames the
# daemon will not decode, read in ktd.frameid.
from ktd.frameid import peek_id as peek_id
from ktd.frameid import skim_id as skim_id
from ktd.pullwire import PullInfo, PullName, PullPlanView, RepoRef

# Wire limits. MAX_FRAME is what the daemon decodes; bigger frames get a
# bad_request without being parsed. zmq's MAXMSGSIZE (HARD_MAX_FRAME) drops
# the peer's connection before the bytes reach Python at all.
MAX_FRAME = 1 << 20
HARD_MAX_FRAME = 16 << 20

# The events socket is an XPUB that greets every new subscription with this
# one-frame message (zmq's XPUB_WELCOME_MSG): a subscriber that has it knows its
# subscription is in place, so nothing published from then on is missed.
WELCOME = b"ktd.welcome"

# Seconds: finite and not negative (NaN, inf and -1 are bad_request, never a load
# started with a deadline nobody can reason about). 0 keeps its meaning: no limit.
MAX_SECONDS = 1e9
Seconds = Annotated[float, msgspec.Meta(ge=0, le=MAX_SECONDS)]
LineCount = Annotated[int, msgspec.Meta(ge=0, le=10_000_000)]


class ProtocolVersion(msgspec.Struct, frozen=True, kw_only=True):
    """The control protocol's version: a new ``minor`` only adds (fields, requests,
    values clients must tolerate); a new ``major`` may break (docs/protocol.md)."""

    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


#: The protocol this module speaks. 1.0 is the protocol as it was before it had a
#: number (``Pong`` without ``protocol``); 1.1 added the number, the feature names,
#: the ``schema`` request, and open vocabularies for states; 1.2 the model catalog,
#: the pull jobs and the trust rules.
PROTOCOL = ProtocolVersion(major=1, minor=2)
PROTOCOL_1_0 = ProtocolVersion(major=1, minor=0)

#: What this daemon can do, by name (``Pong.features``): a client tests for a feature
#: rather than for a version. A daemon of 1.0 sends none; it has ``FEATURES_1_0``.
FEATURES_1_0: tuple[str, ...] = (
    "claims",  # the frontend's claim protocol (claim, sync, return)
    "keep_alive",  # Ollama's keep_alive (keep_alive)
    "keys",  # engines' own API keys (engine_keys; acquire and claim replies carry them)
    "machine",  # the machine as placement sees it (machine)
    "sleep",  # sleep and wake, and the states sleeping, asleep, waking
    "usage",  # the usage ledger (usage)
    "welcome",  # the events socket greets each subscription with WELCOME
)
FEATURES: tuple[str, ...] = tuple(
    sorted({*FEATURES_1_0, "schema", "config", "trust", "catalog", "pulls"})
)

#: Requests only ktd's own frontend sends: a tool that sends them takes part in the
#: claim protocol (and its engines' keys) and can stall evictions or leak secrets.
FRONTEND_ONLY: frozenset[str] = frozenset({"claim", "sync", "return", "engine_keys"})


class EngineState(StrEnum):
    """An engine's state, as status, events and the state file carry it (its plain
    name, so scripts see ``"ready"``); ``ktd.core.states`` has the moves between them."""

    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"
    FAILED = "failed"
    # Sleep (SGLang's memory API): drained and releasing its GPU memory; released
    # (its process lives, its experts stay in host RAM, no CPU or GPU of its own);
    # resuming, then checked with one generation before it is ready again.
    SLEEPING = "sleeping"
    ASLEEP = "asleep"
    WAKING = "waking"


# An engine's state as replies and events carry it: a string, not the enum, so that a
# client decodes a state a newer daemon adds (a new value is a minor change; a 1.0
# ktctl, which decoded the enum, failed on one). Known values: ``EngineState``.
OpenState = Annotated[
    str,
    msgspec.Meta(
        description="An engine state (EngineState). Clients must accept values they "
        "do not know: a minor version may add states.",
        examples=[s.value for s in EngineState],
    ),
]

# A model name (alias, or ``alias:adapter``): longer is nobody's model, and a client
# must not make the daemon, its logs, an ``unknown_model`` error or a stream's
# ``: loading`` comments carry megabytes. Every request field naming a model has this type.
MAX_MODEL_NAME = 256
ModelName = Annotated[str, msgspec.Meta(max_length=MAX_MODEL_NAME)]


def name_problem(name: str) -> str | None:
    """Why ``name`` can be no model's name, or None: the one rule for the config's
    aliases and the names clients send. Control and format characters (a U+202E
    turns ``ktctl`` and the dashboard's text around) are never part of one."""
    if len(name) > MAX_MODEL_NAME:
        return f"is {len(name)} characters long; no model name is longer than {MAX_MODEL_NAME}"
    if not name.isprintable():
        return "contains control or format characters"
    return None


# Ids a client makes up or echoes (its client id, a lease, a claim, a daemon run) and
# the URLs it reports: bounded, so a client cannot make the daemon keep megabytes per
# heartbeat (300 heartbeats with 900 KB ids once grew ktd by 430 MB).
MAX_ID = 256
Id = Annotated[str, msgspec.Meta(max_length=MAX_ID)]
Url = Annotated[str, msgspec.Meta(max_length=2048)]
# A frontend's report: no frontend holds more claims or waits on more models than this.
MAX_REPORTED = 10_000


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
    QUEUE_FULL = "queue_full"  # admission: max_queue requests already wait (HTTP 429)
    SHUTTING_DOWN = "shutting_down"
    INTERNAL = "internal"
    # sleep/wake of a model whose config or installed SGLang cannot sleep (issue 28)
    NO_SLEEP = "no_sleep"
    # a config change made against a version of the files that is no longer there
    # (someone changed them since the client read them): read again, plan again (issue 39)
    STALE_CONFIG = "stale_config"
    # the config files (or the history) could not be written (a full disk, permissions):
    # nothing was changed, the running config is kept
    WRITE_FAILED = "write_failed"
    # the socket's uid may not do this (docs/security.md): a config change by a user
    # who is neither ktd's owner, root nor in daemon.admins, or a change only the owner
    # may make (a new interpreter, a loader variable, config.json itself)
    FORBIDDEN = "forbidden"


#: Every code of ``ErrorCode``, as the schema lists them.
ERROR_CODES: tuple[str, ...] = tuple(v for k, v in vars(ErrorCode).items() if k.isupper())


# ---------------------------------------------------------------- requests


class Request(msgspec.Struct, tag_field="op", kw_only=True):
    id: int = 0


class Ping(Request, tag="ping"):
    pass


class Status(Request, tag="status"):
    alias: ModelName | None = None


class Models(Request, tag="models"):
    pass


class Load(Request, tag="load"):
    alias: ModelName
    wait: bool = True
    timeout: Seconds | None = None
    dry_run: bool = False


class Evict(Request, tag="evict"):
    alias: ModelName | None = None
    all: bool = False
    force: bool = False
    timeout: Seconds | None = None


class KeepAlive(Request, tag="keep_alive"):
    """How long ``model``'s engine stays loaded once idle, until it next stops (Ollama's
    ``keep_alive``): ``seconds`` of idle TTL (0: put it to sleep or stop it as soon as
    it is idle), or ``forever``. The config's ``ttl`` applies again at its next load."""

    model: ModelName
    seconds: Seconds = 0.0
    forever: bool = False


class Sleep(Request, tag="sleep"):
    """Put a ready engine to sleep: drain it to zero, take it off the gateway, and
    release its GPU memory (SGLang's ``/release_memory_occupation``); its experts stay
    in host RAM. ``timeout`` bounds the drain (else ``daemon.drain_timeout``)."""

    alias: ModelName
    timeout: Seconds | None = None


class Wake(Request, tag="wake"):
    """Wake an asleep engine (``/resume_memory_occupation``), putting to sleep or
    evicting whoever holds its CPUs and GPUs meanwhile; a ready one is a no-op.
    Waits until ready (``timeout``: give up waiting, the wake goes on)."""

    alias: ModelName
    timeout: Seconds | None = None


class Logs(Request, tag="logs"):
    alias: ModelName
    lines: LineCount = 100
    probes: bool = False  # include the access lines of ktd's own health checks


class Reload(Request, tag="reload"):
    pass


class Acquire(Request, tag="acquire"):
    """Ask for a lease on the engine serving ``model``, loading it if allowed.

    ``client`` names the frontend instance; its leases expire when it stops
    sending heartbeats, so a frontend killed mid-request cannot pin an engine.
    """

    model: ModelName
    client: Id
    autoload: bool = True
    timeout: Seconds | None = None


class Release(Request, tag="release"):
    lease: Id


class Heartbeat(Request, tag="heartbeat"):
    client: Id


# The claim protocol (the frontend's; ``ktd.daemon.claimtable`` has the race analysis).
# A frontend holds one standing claim per engine it has traffic for and counts its
# requests itself; the daemon is off the per-request path.


class Claim(Request, tag="claim"):
    """A standing claim for ``client`` on the engine serving ``model``, loading it if allowed.

    Waits like ``acquire`` (load, swap, queue). Idempotent: a client that holds a
    claim on that engine gets the same claim back.
    """

    model: ModelName
    client: Id
    autoload: bool = True
    timeout: Seconds | None = None


class ClaimState(msgspec.Struct, kw_only=True):
    """One claim as the frontend holding it reports it."""

    claim: Id
    alias: ModelName
    url: Url = ""
    # On the wire still ``inflight``: nothing keeps a frontend and its daemon on one
    # release (``Ping`` only shows the daemon's version; unknown fields are dropped, not
    # refused), and a report under a name the daemon does not know would read as 0
    # requests in flight: busy engines taken for idle by status, eviction and reload.
    in_flight: Annotated[int, msgspec.Meta(ge=0)] = msgspec.field(default=0, name="inflight")
    idle: Seconds = 0.0  # since its last request ended (0 while one is in flight)
    routing: bool = True  # False once recalled: no new request goes there


# The usage ledger (``ktd.core.usage``): a day is UTC, ``YYYY-MM-DD``; a key is named by
# its name in the frontend's config ("" without keys), never by its secret.
Day = Annotated[str, msgspec.Meta(max_length=10, pattern=r"^\d{4}-\d{2}-\d{2}$")]
KeyName = Annotated[str, msgspec.Meta(max_length=MAX_MODEL_NAME)]
Amount = Annotated[int, msgspec.Meta(ge=0, le=2**53)]


class Sync(Request, tag="sync"):
    """The frontend's report of every claim it holds; also its heartbeat.

    With ``wait`` > 0 the daemon parks the reply until it has a recall for this
    client or ``wait`` passes (a long poll: recalls reach the frontend at once,
    without the daemon ever sending unasked). ``daemon``/``seen`` say which of
    the daemon's grants the report already reflects, so a claim granted while
    this report travelled is not taken for given back.
    """

    client: Id
    claims: Annotated[list[ClaimState], msgspec.Meta(max_length=MAX_REPORTED)] = []
    queued: Annotated[
        dict[ModelName, Annotated[int, msgspec.Meta(ge=0)]],
        msgspec.Meta(max_length=MAX_REPORTED),
    ] = {}  # alias -> requests waiting
    # alias -> seconds the oldest request waiting for it here has waited (issue 46)
    oldest: Annotated[dict[ModelName, Seconds], msgspec.Meta(max_length=MAX_REPORTED)] = {}
    wait: Seconds = 0.0
    daemon: Id = ""  # the daemon run whose grants ``seen`` counts
    seen: Annotated[int, msgspec.Meta(ge=0)] = 0  # highest grant number received from it
    # What this frontend counted since its last acknowledged report: batch ``usage_seq``,
    # resent unchanged until a reply acknowledges it, so the ledger adds it once.
    usage: Annotated[list[UsageCount], msgspec.Meta(max_length=MAX_REPORTED)] = []
    usage_seq: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Tokens its requests hold of each key's tokens_per_day (their reservations, and what
    # it counted that is not in this report's batch): the other frontends reserve around them.
    reserved: Annotated[dict[KeyName, Amount], msgspec.Meta(max_length=MAX_REPORTED)] = {}


class UsageCount(msgspec.Struct, kw_only=True):
    """One day's use of one model by one key: what the engines reported."""

    day: Day
    key: KeyName = ""
    model: ModelName
    requests: Amount = 0
    prompt: Amount = 0  # tokens
    completion: Amount = 0
    errors: Amount = 0
    # Requests whose client went away before the answer ended, charged what they received
    # (new in 1.1: absent from an older frontend's report and an older usage.json, so 0).
    cut: Amount = 0


class Return(Request, tag="return"):
    """The frontend gives a claim back (recalled, or no longer wanted)."""

    client: Id
    claim: Id


class Usage(Request, tag="usage"):
    """The usage ledger's rows from ``since`` ("": all it keeps), of one key or all."""

    since: Annotated[str, msgspec.Meta(max_length=10, pattern=r"^(\d{4}-\d{2}-\d{2})?$")] = ""
    key: KeyName | None = None


class Doctor(Request, tag="doctor"):
    pass


class Shutdown(Request, tag="shutdown"):
    pass


class Machine(Request, tag="machine"):
    """The machine now, as placement sees it: NUMA nodes and GPUs with their free memory,
    which engine holds which, and each alias's recent load durations (the dashboard's
    picture; read afresh each time, nvidia-smi included)."""


class EngineKeys(Request, tag="engine_keys"):
    """Every running engine's API key by its URL: what a client of the engines (the
    frontend) sends as ``Authorization: Bearer`` (issue 32). Only on this socket, whose
    directory only ktd's user (and ``daemon.group``) may enter; never in status."""


class EngineMemory(Request, tag="engine_memory"):
    """Where a running engine's memory is now (``ktctl sleep --verify``): what its
    processes hold on each GPU (nvidia-smi) and on each NUMA node (``numa_maps``), and
    SGLang's own figures (``/v1/loads``' memory section)."""

    alias: ModelName


class Schema(Request, tag="schema"):
    """This daemon's protocol as a JSON Schema document (``docs/protocol/``): a client
    introspects the daemon it talks to (protocol 1.1; a 1.0 daemon answers
    ``bad_request``)."""


class Catalog(Request, tag="catalog"):
    """The model catalog against this machine (issue 44, protocol 1.2): every entry, the
    variant that fits and why each other does not, what is on disk; with ``name`` (a name
    or an alias), that entry alone with its launch flags worked out (docs/catalog.md)."""

    name: ModelName | None = None


# The config, changed through the daemon (issue 39): read it with its version id, plan a
# change (what each engine would do; what SGLang or the machine would refuse), apply it
# against the version read (a stale base is refused), keep the versions, go back.
#: A config file's text on the wire: a request frame is at most MAX_FRAME and may carry
#: both files, so each is bounded below half of it (a bigger config is edited by hand).
MAX_CONFIG_TEXT = 480 << 10
ConfigText = Annotated[str, msgspec.Meta(max_length=MAX_CONFIG_TEXT)]
VersionId = Annotated[str, msgspec.Meta(max_length=64, pattern=r"^[0-9a-f]*$")]
Seq = Annotated[int, msgspec.Meta(ge=1, le=2**53)]
# Who made a change, as the client says (ktctl: the login name; the dashboard: the key's
# name): kept as *claimed*, beside the uid the daemon reads off the socket itself.
Claimed = Annotated[str, msgspec.Meta(max_length=128)]


class ConfigGet(Request, tag="config_get"):
    """The config's files as they are on disk now, or version ``seq`` of the history, and
    their version id: the ``base`` of a later ``config_apply``."""

    seq: Seq | None = None
    delegated: bool = False  # asked for someone else (the dashboard): an owner's reply lowered


class ConfigPlan(Request, tag="config_plan"):
    """What applying these texts would do; nothing is changed. A text left ``None`` is
    that file as it is on disk. ``base``: the version they were made from ("" none).
    ``delegated``: the client acts for someone else (the dashboard, for an admin key):
    the daemon gives the request no more than a non-owner's rights (docs/security.md)."""

    config_text: ConfigText | None = None
    models_text: ConfigText | None = None
    base: VersionId = ""
    delegated: bool = False


class ConfigApply(Request, tag="config_apply"):
    """Plan, then (when nothing in the plan is an error, and the files on disk are still
    version ``base``) write the files and apply them as a reload does; recorded in the
    history with ``author`` (claimed) and the socket's uid. ``base`` is required: ""
    (left out) is refused with ``bad_request``."""

    config_text: ConfigText | None = None
    models_text: ConfigText | None = None
    base: VersionId = ""
    author: Claimed = ""
    delegated: bool = False


class ConfigHistory(Request, tag="config_history"):
    """The versions kept, newest first: who (uid, and the author claimed), when, what."""


class ConfigRollback(Request, tag="config_rollback"):
    """Apply version ``seq`` of the history again (None: the one before the files now),
    through the same path as any change; ``dry_run``: only its plan."""

    seq: Seq | None = None
    base: VersionId = ""  # required unless dry_run
    author: Claimed = ""
    dry_run: bool = False
    delegated: bool = False


# Pulls (protocol 1.2, issue 44): ktd's download jobs; the types are ktd.pullwire's.
class Pull(Request, tag="pull"):
    """Start (or join) the pull of a catalog ``name``, or of ``repo`` (``ORG/NAME[@REV]``);
    ``dry_run``: only its plan; ``force``: fetch even if the plan refuses."""

    name: PullName = ""
    repo: RepoRef = ""
    dry_run: bool = False
    force: bool = False


class Pulls(Request, tag="pulls"):
    """The pull jobs, live and finished."""


class PullCancel(Request, tag="pull_cancel"):
    """End the pull jobs of ``name`` (or ``repo``); what was fetched stays."""

    name: PullName = ""
    repo: RepoRef = ""


AnyRequest = (
    Ping
    | Status
    | Models
    | Load
    | Evict
    | Sleep
    | Wake
    | Logs
    | Reload
    | Acquire
    | Release
    | Heartbeat
    | Claim
    | Sync
    | Return
    | Doctor
    | Shutdown
    | Machine
    | EngineKeys
    | KeepAlive
    | Usage
    | EngineMemory
    | Schema
    | ConfigGet
    | ConfigPlan
    | ConfigApply
    | ConfigHistory
    | ConfigRollback
    | Catalog
    | Pull
    | Pulls
    | PullCancel
)

# ---------------------------------------------------------------- replies


class Registration(msgspec.Struct, kw_only=True):
    """An engine's registration on one sglang-router (``ktctl status``'s ``gateway``).

    ``state``: ``registered``, ``unhealthy`` (listed, failing the router's health
    check), ``registering``, ``deregistering``, ``absent``, or ``unknown`` (router
    not reached yet).
    """

    router: str
    state: str
    url: str | None = None
    worker_id: str | None = None


class RouterInfo(msgspec.Struct, kw_only=True):
    """One router as ktd sees it: reachable or not, and what ktd did there."""

    url: str
    up: bool | None = None  # None: not tried yet
    error: str | None = None
    last_sync: float | None = None
    next_try: float | None = None  # while down: when ktd retries (backoff)
    failures: int = 0  # consecutive failed syncs
    workers: int = 0  # workers the router lists
    ours: int = 0  # of them, registered by this ktd
    added: int = 0  # registrations ktd sent (counters since ktd started)
    removed: int = 0
    errors: int = 0


class GatewayInfo(msgspec.Struct, kw_only=True):
    mode: str
    routers: list[RouterInfo] = []
    frontend_url: str | None = None


class EngineInfo(msgspec.Struct, kw_only=True):
    """One engine as ``ktctl status --json`` shows it. Fields are only ever added.

    ``leases`` is the deprecated name of ``in_flight`` (it counts claim holders'
    requests too, not only acquire leases), carried with the same value for the
    scripts that read it and removed in the next release.
    """

    alias: str
    state: OpenState
    pid: int | None = None
    port: int | None = None
    argv: list[str] = []
    numa_nodes: list[int] = []
    gpus: list[int] = []
    since: float = 0.0
    reason: str | None = None
    in_flight: int = 0  # requests in flight: acquire leases plus what claim holders report
    leases: int = 0  # deprecated: ``in_flight``
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
    queued: int = 0  # acquires waiting (admission, load or swap)
    max_concurrent: int | None = None
    max_queue: int | None = None
    evictions: int = 0  # times it was stopped to make room for another engine
    loads: int = 0  # launches that reached ready
    load_seconds: float | None = None  # how long the last one took
    load_seconds_total: float = 0.0
    failures: int = 0  # consecutive failed loads (0 after a success)
    retry_in: float | None = None  # failed: seconds until a request may retry it
    gateway: list[Registration] = []
    # Added for an ``ollama ps``-like status (issue 13); wall-clock seconds since the epoch.
    started_at: float | None = None  # the engine process's start: uptime, kept across adoption
    ttl: float = 0.0  # idle TTL in seconds (0: none)
    expires_at: float | None = None  # when the idle TTL evicts it (None: never / busy)
    load_started: float | None = None  # this load's start, while starting
    load_eta: float | None = None  # expected load duration (median of recent loads)
    load_percent: float | None = None  # how far the engine's own log says the load is
    last_log: str | None = None  # the engine's last log line (never in ``state``/``phase``)
    claims: int = 0  # frontends' standing claims on it (issue 15)
    # The phase as data (``phase`` is its text): programs act on these, never on prose.
    step: str | None = None  # ktd.core.states.Step: "loading", "waiting", "draining", ...
    waiting_for: list[str] = []  # step "waiting": the busy engines this load waits for
    made_room: list[str] = []  # engines this load stopped to make room (kept while it runs)
    # Sleep (issue 28): "on" (sleeps instead of stopping), "off" (not configured), or
    # "unsupported" (configured, but its SGLang lacks --enable-memory-saver: swaps reload).
    sleep: str = "off"
    asleep_since: float | None = None  # wall clock: when it fell asleep (state "asleep")
    sleep_ttl: float = 0.0  # seconds asleep before it is stopped (0: never)
    host_bytes: int | None = None  # host RAM it holds on its NUMA nodes while asleep (estimate)
    # Wall clock: when the oldest request the frontends say wait for it came (issue 46).
    queued_since: float | None = None
    # The --kt-num-gpu-experts it launches with on this host after an out-of-memory load
    # of its derived count retried with fewer (issue 44; None: as written).
    gpu_experts: int | None = None

    def __post_init__(self) -> None:
        # One number under two names, whichever the sender set: an older daemon sends
        # only ``leases``, code that builds one sets ``in_flight``.
        self.in_flight = self.leases = self.in_flight or self.leases


class ModelInfo(msgspec.Struct, kw_only=True):
    alias: str
    backend: str
    served: bool
    path: str
    state: str = "stopped"  # an EngineState, or "not served" (no engine for it)
    reason: str | None = None


class Reply(msgspec.Struct, tag_field="type", kw_only=True):
    id: int = 0


class Pong(Reply, tag="pong"):
    """The daemon's release and pid, and (from 1.1) its protocol and features: absent,
    the daemon speaks 1.0 and has ``FEATURES_1_0``."""

    version: str
    pid: int
    protocol: ProtocolVersion = PROTOCOL_1_0
    features: list[str] = []


class StatusReply(Reply, tag="status"):
    engines: list[EngineInfo]
    gateway: GatewayInfo | None = None


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
    # Lines the engine's log had taken when this tail was read (``Event.upto``): a
    # follower that subscribed first drops the events this tail already holds.
    upto: int = 0


class AcquireReply(Reply, tag="acquire"):
    lease: str
    alias: str
    url: str
    api_key: str | None = None  # the engine's own: send it as ``Authorization: Bearer``


class ClaimReply(Reply, tag="claim"):
    claim: str
    alias: str
    url: str
    daemon: str = ""  # this daemon run (a restarted daemon has another)
    grant: int = 0  # grant number within that run (``Sync.seen``)
    max_concurrent: int | None = None  # admission, applied by the frontend per claim
    max_queue: int | None = None
    api_key: str | None = None  # the engine's own: send it as ``Authorization: Bearer``


class Recall(msgspec.Struct, kw_only=True):
    """Give a claim back.

    ``drain`` (evict, swap, reload of a removed model, shutdown): route nothing new
    there from now on, give it back when its requests have ended. ``idle`` (TTL, a
    restart after a reload): keep routing, give it back the first time it has had
    no request for ``idle`` seconds; a claim busier than that stays, and the next
    report says so.
    """

    claim: str
    alias: str
    # "drain" or "idle"; a kind the frontend does not know is taken as "drain" (give it
    # back, route nothing new there): the safe reading of a newer daemon's recall.
    kind: Annotated[
        str,
        msgspec.Meta(
            description='"drain" or "idle"; an unknown kind is read as "drain"',
            examples=["drain", "idle"],
        ),
    ] = "drain"
    idle: float = 0.0
    reason: str = ""


class Limits(msgspec.Struct, kw_only=True, array_like=True):
    max_concurrent: int | None = None
    max_queue: int | None = None


class SyncReply(Reply, tag="sync"):
    daemon: str = ""
    recalls: list[Recall] = []
    dropped: list[str] = []  # claims this daemon does not hold for you: stop using them
    limits: dict[str, Limits] = {}  # per model with admission limits
    usage_seq: int = 0  # the last usage batch of yours the ledger holds
    day: str = ""  # today (UTC), the day ``spent`` counts
    spent: dict[str, int] = {}  # key name -> tokens today, every frontend's in the ledger
    held: dict[str, int] = {}  # key name -> tokens the other frontends' requests hold today


class DoctorReply(Reply, tag="doctor"):
    report: dict[str, Any]


class NodeInfo(msgspec.Struct, kw_only=True):
    """One NUMA node; memory in bytes. ``mem_available`` counts reclaimable page cache."""

    id: int
    cpus: list[int] = []
    mem_total: int = 0
    mem_free: int = 0
    mem_available: int = 0


class GpuInfo(msgspec.Struct, kw_only=True):
    """One GPU as nvidia-smi numbers it; memory in bytes."""

    index: int
    name: str = ""
    memory_total: int = 0
    memory_used: int = 0


class Holder(msgspec.Struct, kw_only=True):
    """An engine holding NUMA nodes, CPUs and GPUs (starting, ready, draining, stopping)."""

    alias: str
    state: OpenState
    numa_nodes: list[int] = []
    cpus: list[int] = []
    gpus: list[int] = []


class MachineReply(Reply, tag="machine"):
    cpu_model: str = ""
    nodes: list[NodeInfo] = []
    gpus: list[GpuInfo] = []
    gpu_error: str | None = None  # why no GPU is listed (no nvidia-smi, ...)
    reserved_cpus: list[int] = []  # daemon.cpus: kept off engines
    holders: list[Holder] = []
    load_history: dict[str, list[float]] = {}  # alias -> recent load durations (s), oldest first


class GpuUse(msgspec.Struct, kw_only=True):
    gpu: int
    bytes: int


class NodeUse(msgspec.Struct, kw_only=True):
    node: int
    bytes: int


class SglangMemory(msgspec.Struct, kw_only=True):
    """SGLang's own account (``/v1/loads?include=memory``, summed over its DP ranks)."""

    weight_gb: float = 0.0
    kv_cache_gb: float = 0.0
    graph_gb: float = 0.0
    token_capacity: int = 0


class EngineMemoryReply(Reply, tag="engine_memory"):
    alias: str = ""
    state: str = ""
    pid: int | None = None
    taken: float = 0.0  # wall clock
    processes: int = 0  # of the engine, measured
    gpu: list[GpuUse] | None = None  # None: not measured (``gpu_note`` says why)
    gpu_note: str | None = None
    host: list[NodeUse] = []  # resident, by NUMA node (shared pages count once a process)
    sglang: SglangMemory | None = None  # None: /v1/loads did not say
    residue: list[GpuUse] = []  # what it kept on its GPUs at its last release
    host_held: int | None = None  # ktd's estimate of the host memory it holds


class EngineKeysReply(Reply, tag="engine_keys"):
    keys: dict[str, str] = {}  # engine URL -> its API key (engines without one left out)


class UsageReply(Reply, tag="usage"):
    rows: list[UsageCount] = []  # by day, key, model


class FieldChange(msgspec.Struct, kw_only=True):
    """One value a change sets: ``field`` as the file names it (``kt.ctx``, or
    ``ktransformers.ctx`` when the entry takes the section's), JSON values."""

    field: str
    old: Any = None
    new: Any = None


class EnginePlan(msgspec.Struct, kw_only=True):
    """What applying does to one model's engine.

    ``action``: ``unchanged``; ``update`` (applied live: limits, TTL...; nothing
    restarts); ``restart`` (its launch changed: stopped and started again when idle);
    ``add`` (new: stopped until a request or ``ktctl load``); ``remove`` (gone from the
    config, nothing runs); ``stop`` (gone, or asleep with a new launch: drained and
    stopped); ``sleep`` (put to sleep to make room for a restarted engine); ``start``
    (served again). ``fields`` say why (what changed).
    """

    alias: str
    action: str
    state: str = ""  # the engine's state now ("" for a new model)
    fields: list[FieldChange] = []
    note: str = ""  # when, and what else it means, for people


class ConfigProblem(msgspec.Struct, kw_only=True):
    """Something wrong with a change; an ``error`` refuses it, a ``warning`` is told."""

    level: str  # "error" or "warning"; an open vocabulary (docs/protocol.md): tolerate others
    message: str
    file: str = ""
    path: str = ""  # the field: ``$[0].kt.extra_args``
    alias: str = ""
    code: str = ""  # an ErrorCode when it is not the config's fault (``busy``: a load under way)


class SettingChange(msgspec.Struct, kw_only=True):
    """A config.json setting that changes, and when it takes effect (``now``, ``at ktd's
    restart``, ``at the frontend's restart``)."""

    field: str
    old: Any = None
    new: Any = None
    effect: str = "now"


class ConfigPlanView(msgspec.Struct, kw_only=True):
    """What a change would do (``ktd.core.configplan``)."""

    base: str  # the version of the files on disk the plan was made against
    version: str  # the version the change makes
    running: str = ""  # the version the daemon runs (differs from base after a hand edit)
    changed: list[str] = []  # files that would be written
    engines: list[EnginePlan] = []
    settings: list[SettingChange] = []
    problems: list[ConfigProblem] = []
    ok: bool = True  # no problem is an error
    summary: str = ""


class ConfigVersion(msgspec.Struct, kw_only=True):
    """One version of the config in the history."""

    seq: int
    version: str
    time: float  # wall clock
    how: str  # "start", "reload" (a hand edit seen), "apply", "rollback"
    uid: int | None = None  # read off the control socket (SO_PEERCRED): who really asked
    user: str | None = None  # that uid's name
    claimed: str = ""  # who the client said it was (not verified)
    what: str = ""  # the change, in a line
    files: list[str] = []  # files that changed against the version before
    rollback_of: int | None = None


class ConfigReply(Reply, tag="config"):
    version: str
    running: str = ""
    config_path: str = ""
    config_text: str = ""
    models_path: str = ""
    models_text: str | None = None  # None: no models file
    seq: int | None = None  # the history entry with these files, if any
    # Secrets marked (``•••• secret #N (unchanged)``; a change that keeps a mark keeps
    # the secret): every reply but the owner's (docs/security.md)
    redacted: bool = False


class ConfigPlanReply(Reply, tag="config_plan"):
    plan: ConfigPlanView


class ConfigApplyReply(Reply, tag="config_apply"):
    plan: ConfigPlanView
    version: str = ""
    seq: int | None = None  # its entry in the history
    summary: str = ""  # what the reload did


class ConfigHistoryReply(Reply, tag="config_history"):
    versions: list[ConfigVersion] = []  # newest first
    keep: int = 0  # how many the daemon keeps (daemon.config_history)
    running: str = ""
    disk: str = ""  # the version of the files on disk now


class CatalogReply(Reply, tag="catalog"):
    report: dict[str, Any]  # files, problems, box, dir, models (docs/catalog.md)


class PullReply(Reply, tag="pull"):
    """The jobs a ``pull`` started or joined (``joined``: already running for someone), or
    with ``dry_run`` their plans."""

    jobs: list[PullInfo] = []
    plans: list[PullPlanView] = []
    joined: bool = False


class PullsReply(Reply, tag="pulls"):
    jobs: list[PullInfo] = []


class Ok(Reply, tag="ok"):
    message: str = ""


class SchemaReply(Reply, tag="schema"):
    protocol: ProtocolVersion
    schema: dict[str, Any]  # the JSON Schema document (docs/protocol/ktd-control-*.json)


class Error(Reply, tag="error"):
    """A request that failed: ``code`` is stable (``ErrorCode``; scripts match on it, and
    a client must accept codes it does not know), ``message`` is for people,
    ``detail`` for programs."""

    code: Annotated[
        str,
        msgspec.Meta(
            description="An ErrorCode; clients must accept codes they do not know",
            examples=list(ERROR_CODES),
        ),
    ]
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
    | ClaimReply
    | SyncReply
    | DoctorReply
    | MachineReply
    | EngineKeysReply
    | UsageReply
    | EngineMemoryReply
    | SchemaReply
    | ConfigReply
    | ConfigPlanReply
    | ConfigApplyReply
    | ConfigHistoryReply
    | CatalogReply
    | PullReply
    | PullsReply
    | Ok
    | Error
)

# ---------------------------------------------------------------- events


class Event(msgspec.Struct, kw_only=True):
    """Published on the PUB socket as ``[topic, msgpack(Event)]``.

    Topics: ``engine.<alias>`` (state changes), ``log.<alias>`` (log lines),
    ``lease.<alias>`` (``in_flight`` changes), ``pull.<repo>@<revision>`` (a pull job's
    progress and state, ``alias`` its first name), ``probe.<alias>`` (the engine's access
    lines for ktd's own health checks, kept off ``log.`` so they do not bury the rest).
    ``leases`` is the deprecated name of ``in_flight``, as in ``EngineInfo``.
    """

    topic: str
    time: float
    alias: str
    state: OpenState | None = None
    reason: str | None = None
    lines: list[str] = []
    # ``log.``/``probe.`` events: lines the engine's log had taken once these were
    # added (one count per engine per daemon run; 0 from a daemon that does not count).
    upto: int = 0
    in_flight: int | None = None  # ``lease.`` events: requests in flight on the engine
    leases: int | None = None  # deprecated: ``in_flight``
    pid: int | None = None
    port: int | None = None
    phase: str | None = None
    load_started: float | None = None
    load_eta: float | None = None
    load_percent: float | None = None  # as ``EngineInfo.load_percent``
    step: str | None = None  # as ``EngineInfo.step``
    waiting_for: list[str] = []
    pull: PullInfo | None = None  # ``pull.<repo>@<revision>`` events: the job (1.2)

    def __post_init__(self) -> None:
        # As ``EngineInfo``'s: both names carry the number, whichever the sender set.
        if self.in_flight is None:
            self.in_flight = self.leases
        self.leases = self.in_flight


_request_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(AnyRequest)
_reply_decoder = msgspec.msgpack.Decoder(AnyReply)
_event_decoder = msgspec.msgpack.Decoder(Event)


def encode(msg: msgspec.Struct) -> bytes:
    return _request_encoder.encode(msg)


# The three decoders of frames someone else wrote: each raises ``msgspec.DecodeError``
# (``ValidationError``, or ``foreign.Malformed``: nested deeper than ``foreign.MAX_DEPTH``)
# on anything malformed, and nothing else (ktd.foreign).


def decode_request(data: bytes) -> Request:
    """Raise ``msgspec.DecodeError``/``ValidationError`` on anything malformed."""
    return foreign.msgpack(data, _request_decoder)


def decode_reply(data: bytes) -> Reply:
    return foreign.msgpack(data, _reply_decoder)


def decode_event(data: bytes) -> Event:
    return foreign.msgpack(data, _event_decoder)
