"""The control protocol's engine messages (``ktd.protocol`` re-exports them): ping and
status, load, evict, sleep and wake, logs, reload, doctor, the machine and an engine's
memory, the schema; the status an engine is shown with; and the events published for
engines (and pulls).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ktd.protocol_base import (
    PROTOCOL_1_0,
    LineCount,
    ModelName,
    OpenState,
    ProtocolVersion,
    Reply,
    Request,
    Seconds,
)
from ktd.pullwire import PullInfo

# ---------------------------------------------------------------- requests


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


class Doctor(Request, tag="doctor"):
    pass


class Shutdown(Request, tag="shutdown"):
    pass


class Machine(Request, tag="machine"):
    """The machine now, as placement sees it: NUMA nodes and GPUs with their free memory,
    which engine holds which, and each alias's recent load durations (the dashboard's
    picture; read afresh each time, nvidia-smi included)."""


class EngineMemory(Request, tag="engine_memory"):
    """Where a running engine's memory is now (``ktctl sleep --verify``): what its
    processes hold on each GPU (nvidia-smi) and on each NUMA node (``numa_maps``), and
    SGLang's own figures (``/v1/loads``' memory section)."""

    alias: ModelName


class Schema(Request, tag="schema"):
    """This daemon's protocol as a JSON Schema document (``docs/protocol/``): a client
    introspects the daemon it talks to (protocol 1.1; a 1.0 daemon answers
    ``bad_request``)."""


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


class SchemaReply(Reply, tag="schema"):
    protocol: ProtocolVersion
    schema: dict[str, Any]  # the JSON Schema document (docs/protocol/ktd-control-*.json)


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
