"""Configuration: the schema of the seed's ``config.json`` + ``models.json``, and a
model's resolution (an entry with the section's defaults under it).

Three modules, one job each: this one says what the files may hold and what a model
means once resolved; ``ktd.core.configcheck`` says which values are wrong;
``ktd.core.configload`` reads the files (bounded) and runs both. Every error is a
``ConfigError`` naming the file and the field path, because an operator fixing a 600 GB
model's config at 3 a.m. should not have to guess which of thirty entries is wrong.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import sys
from typing import Annotated, Any, Literal

import msgspec

from ktd.core import modelfields
from ktd.core.secret import SECRET, SECRET_ENV, SECRET_FLAGS

BACKEND_KT = "kt"
DEFAULT_MODEL_ID = "ktransformers"


class ConfigError(Exception):
    """A config problem, rendered as ``<file>: <path>: <message>``."""

    def __init__(self, file: str, path: str, message: str) -> None:
        self.file = file
        self.path = path
        self.message = message
        super().__init__(f"{file}: {path}: {message}" if path else f"{file}: {message}")


# ---------------------------------------------------------------- file schema

ExtraArgs = list[str] | str
ExtraEnv = str | list[str] | dict[str, str]


class KtSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The seed's ``ktransformers`` section, field for field, plus ``python``."""

    enabled: bool = True
    model_path: str | None = None
    kt_weight_path: str | None = None
    model_id: str = DEFAULT_MODEL_ID
    host: str = "127.0.0.1"
    port: int = 0
    ctx: int = 0
    extra_args: Annotated[ExtraArgs, SECRET_FLAGS] = []
    extra_env: Annotated[ExtraEnv, SECRET_ENV] = {}
    auto_build: bool = False
    python: str | None = None


class KtOverrides(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    ctx: int | None = None
    kt_weight_path: str | None = None
    extra_args: Annotated[ExtraArgs | None, SECRET_FLAGS] = None
    extra_env: Annotated[ExtraEnv | None, SECRET_ENV] = None
    tp_size: int | None = None
    nnodes: int | None = None
    dist_init_addr: str | None = None
    nodes: list[str] | int | None = None
    port: int | None = None
    python: str | None = None


NumaSpec = Literal["auto", "all", "none"] | list[int]
GpuSpec = Literal["auto"] | list[int] | int
RestartPolicy = Literal["on-failure", "no"]
# "check": refuse a load whose memory estimate does not fit; "ignore": load anyway.
FitPolicy = Literal["check", "ignore"]


class ModelEntry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    path: str
    backend: str
    alias: str
    kt: KtOverrides | None = None
    numa: NumaSpec = "auto"
    gpus: GpuSpec = "auto"
    ttl: float = 0.0
    restart: RestartPolicy = "on-failure"
    pinned: bool = False
    swap: bool = True
    health_timeout: float | None = None
    # Admission: requests served at once (None = no limit), and how many more may
    # wait for a slot, a load or a swap (None = no limit; 0 = never wait).
    max_concurrent: int | None = None
    max_queue: int | None = None
    fit: FitPolicy = "check"
    # Sleep instead of stopping (swaps, the idle TTL): the engine is launched with
    # SGLang's memory saver and releases its GPU memory; ``sleep_ttl`` seconds asleep
    # (0 = never) and it is stopped.
    sleep: bool = False
    sleep_ttl: float = 0.0
    catalog: str = ""  # the catalog entry it was written from (a pull); "": by hand


class DaemonSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    runtime_dir: str | None = None
    state_dir: str | None = None
    log_dir: str | None = None
    group: str | None = None
    cpus: list[int] | None = None
    keep_engines_on_exit: bool = False
    drain_timeout: float = 60.0
    stop_grace: float = 30.0
    health_timeout: float = 1800.0
    health_interval: float = 10.0
    hang_timeout: float = 60.0
    lease_ttl: float = 15.0
    log_max_bytes: int = 64 << 20
    log_backups: int = 3
    restart_backoff: float = 2.0
    restart_max: int = 5
    restart_window: float = 600.0
    cpu_reserve: int = 0
    one_engine_per_machine: bool = False
    # Bound on each of SGLang's memory calls (release, resume) and on the health check
    # after a resume; past it the engine is stopped and the next request reloads it.
    memory_timeout: float = 120.0
    # Versions of the config kept in the state dir (``ktctl config history``): the files
    # now and this many before them.
    config_history: int = 20
    # docs/security.md: users (names or uids) who may change models.json besides ktd's
    # own uid and root; interpreters a non-owner's models may name besides the engines'.
    admins: list[str | int] = []
    pythons: list[str] = []


class KeyEntry(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One named key of ``frontend.keys``: who it is (``name``: in the usage ledger and
    the metrics, never the secret), its secret (``key``, or ``key_sha256`` so the file
    need not hold it), what it may use and how much (ktd.core.keys)."""

    name: str
    key: Annotated[str | None, SECRET] = None
    key_sha256: str | None = None
    models: list[str] = msgspec.field(default_factory=lambda: ["*"])  # aliases, patterns
    admin: bool = False  # the dashboard's actions (with ui_control)
    max_concurrent: int | None = None
    tokens_per_day: int | None = None
    priority: int = 0
    progress: Literal["", "events", "reasoning"] = ""  # waiting streams: reasoning deltas too


class FrontendSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    bind: str = "127.0.0.1:8000"
    api_keys: Annotated[list[str], SECRET] = []
    keys: list[KeyEntry] = []
    max_body_bytes: int = 32 << 20
    load_timeout: float = 1800.0
    read_timeout: float = 600.0
    autoload: bool = True
    # Seconds a client connection may sit idle (before its first request, or
    # between keep-alive requests) before the frontend closes it.
    idle_timeout: float = 15.0
    # Seconds a client may take to accept one chunk of a streamed answer (it stopped
    # reading): then the stream is cut, its slot freed and the engine's request
    # aborted (nginx's send_timeout).
    send_timeout: float = 60.0
    # The dashboard at /ui may load, evict and reload (for a holder of one of api_keys);
    # off: the dashboard is read-only.
    ui_control: bool = False
    # Browsers (ktd.frontend.origin): pages of these origins may use the frontend
    # besides its own ("*": any); bound to loopback, these Host names are answered
    # besides localhost, loopback addresses and this machine's name ("*": any).
    allowed_origins: list[str] = []
    allowed_hosts: list[str] = []
    # /metrics without a key when keys are set (for a Prometheus scraper).
    metrics_public: bool = False


GatewayMode = Literal["engines", "frontend"]


class GatewaySection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Registration with SGLang's gateway (``sglang-router``) for scale-out across hosts.

    ``routers`` empty = off. ``engines`` registers each ready engine's own URL;
    ``frontend`` registers ktd's frontend instead, so on-demand loading keeps
    working behind the router. ``advertise`` is the host (``frontend``: host or
    host:port) the router must reach; by default the bind address. ``api_key``
    is the router's control-plane key (Bearer on ``/workers``); ``worker_api_key``
    is what the router sends to the frontend (default: the frontend's first key); an
    engine is registered with its own key, the only one it accepts (issue 32).
    """

    routers: list[str] = []
    mode: GatewayMode = "engines"
    advertise: str | None = None
    labels: dict[str, str] = {}
    api_key: Annotated[str | None, SECRET] = None
    worker_api_key: Annotated[str | None, SECRET] = None
    model_id: str | None = None  # frontend mode: the model_id to register under
    reconcile_interval: float = 10.0
    timeout: float = 5.0
    deregister_timeout: float = 10.0
    backoff_max: float = 30.0
    health_check_interval: int = 10  # what the router is asked to use for this worker


class CatalogSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The model catalog and pulls (``docs/catalog.md``): which catalog files beside the
    built-in one, where pulled models go, and how many pulls run at once."""

    files: list[str] = []  # the operator's own catalog files (relative to config.json's dir)
    dir: str | None = None  # where pulls put models; default <state_dir>/models
    max_pulls: int = 2  # pull jobs running at once; more wait their turn
    stall_timeout: float = 300.0  # a pull that gets no byte for this long is stalled
    http_pulls: bool = False  # may an HTTP request for a catalog name start a pull


class ConfigFile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    ktransformers: KtSection = msgspec.field(default_factory=KtSection)
    models_file: str | None = None
    daemon: DaemonSection = msgspec.field(default_factory=DaemonSection)
    frontend: FrontendSection = msgspec.field(default_factory=FrontendSection)
    gateway: GatewaySection = msgspec.field(default_factory=GatewaySection)
    catalog: CatalogSection = msgspec.field(default_factory=CatalogSection)


# ---------------------------------------------------------------- resolved model


class ModelSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One model after defaults are merged: everything needed to launch it."""

    alias: str
    path: str
    backend: str
    source: str
    kt_weight_path: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    ctx: int = 0
    extra_args: Annotated[tuple[str, ...], SECRET_FLAGS] = ()
    extra_env: Annotated[tuple[tuple[str, str], ...], SECRET_ENV] = ()
    python: str = sys.executable
    auto_build: bool = False
    tp_size: int | None = None
    nnodes: int | None = None
    dist_init_addr: str | None = None
    numa: NumaSpec = "auto"
    gpus: GpuSpec = "auto"
    ttl: float = 0.0
    restart: RestartPolicy = "on-failure"
    pinned: bool = False
    swap: bool = True
    health_timeout: float = 1800.0
    max_concurrent: int | None = None
    max_queue: int | None = None
    fit: FitPolicy = "check"
    sleep: bool = False
    sleep_ttl: float = 0.0
    catalog: str = ""  # its entry's: its --kt-num-gpu-experts is derived (OOM retry)
    served: bool
    not_served_reason: str | None = None

    @property
    def env(self) -> dict[str, str]:
        return dict(self.extra_env)

    def launch_key(self) -> tuple[Any, ...]:
        """The fields that shape the engine's argv, env and placement (``modelfields``
        marks them ``launch``), in the order declared here; the rest apply live."""
        key = [getattr(self, name) for name in LAUNCH_FIELDS if name != "sleep"]
        # Only when on: the digest of every engine launched before sleep existed stays.
        return (*key, *(("sleep",) if self.sleep else ()))

    def launch_digest(self) -> str:
        """A stable fingerprint of ``launch_key``, kept in the state file across restarts."""
        return hashlib.sha1(msgspec.json.encode(self.launch_key())).hexdigest()


#: ModelSpec's launch fields in its order (``launch_key``'s, so digests stay as they were).
LAUNCH_FIELDS = tuple(name for name in ModelSpec.__struct_fields__ if name in modelfields.LAUNCH)


class Config(msgspec.Struct, kw_only=True):
    path: str
    file: ConfigFile
    models: dict[str, ModelSpec]
    # models.json's entries as written (what each sets itself, not the defaults under it):
    # a plan names a changed value by the field that holds it (``ktd.core.configplan``)
    entries: list[ModelEntry] = []

    @property
    def daemon(self) -> DaemonSection:
        return self.file.daemon

    @property
    def frontend(self) -> FrontendSection:
        return self.file.frontend

    @property
    def gateway(self) -> GatewaySection:
        return self.file.gateway

    @property
    def catalog(self) -> CatalogSection:
        return self.file.catalog

    def served(self) -> list[ModelSpec]:
        return [m for m in self.models.values() if m.served]

    def route(self, model: str) -> ModelSpec | None:
        """The routing rule: exact alias match only, never substring or family."""
        spec = self.models.get(model)
        return spec if spec is not None and spec.served else None


# ---------------------------------------------------------------- values

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def split_args(value: ExtraArgs | None, file: str, path: str) -> tuple[str, ...]:
    """``extra_args`` as the seed allows it: a list, or one string split like a shell would."""
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(value)
    try:
        return tuple(shlex.split(value))
    except ValueError as exc:
        raise ConfigError(file, path, f"cannot split like a shell: {exc}") from None


#: Linux refuses an exec whose one environment string is longer (MAX_ARG_STRLEN, 32
#: pages): the engine could never start ("Argument list too long").
MAX_ENV_STRING = 128 << 10


def parse_env(value: ExtraEnv | None, file: str, path: str) -> dict[str, str]:
    """``extra_env`` as a seed-style ``"K=V K2='v 2'"`` string, a list of words, or an object."""
    env = _parse_env(value, file, path)
    for key, val in env.items():
        if len(key) + len(val.encode()) + 2 > MAX_ENV_STRING:
            raise ConfigError(
                file,
                f"{path}.{key}",
                f"{len(val.encode())} bytes: the kernel passes at most {MAX_ENV_STRING} "
                "bytes per environment variable to a program",
            )
    return env


def _parse_env(value: ExtraEnv | None, file: str, path: str) -> dict[str, str]:
    if value is None:
        return {}
    if isinstance(value, dict):
        for key in value:
            if not _ENV_KEY.match(key):
                raise ConfigError(file, f"{path}.{key}", "not a valid environment variable name")
        return dict(value)
    if isinstance(value, str):
        try:
            words = shlex.split(value)
        except ValueError as exc:
            raise ConfigError(file, path, f"cannot split like a shell: {exc}") from None
        where = [f"{path} word {i + 1}" for i in range(len(words))]
    else:
        words = value
        where = [f"{path}[{i}]" for i in range(len(words))]
    env: dict[str, str] = {}
    for word, at in zip(words, where, strict=True):
        key, sep, val = word.partition("=")
        if not sep or not _ENV_KEY.match(key):
            raise ConfigError(file, at, f"expected KEY=VALUE, got {word!r}")
        env[key] = val
    return env


# ---------------------------------------------------------------- resolution


def _entry_spec(
    entry: ModelEntry,
    file: ConfigFile,
    models_name: str,
    at: str,
    base_args: tuple[str, ...],
    base_env: dict[str, str],
) -> ModelSpec:
    """One models.json entry with the ktransformers section's defaults under it."""
    kt = file.ktransformers
    python = kt.python or sys.executable
    off_reason = None if kt.enabled else "ktransformers.enabled is false"
    ov = entry.kt or KtOverrides()
    args = (
        split_args(ov.extra_args, models_name, f"{at}.kt.extra_args")
        if ov.extra_args is not None
        else base_args
    )
    env = dict(base_env)
    env.update(parse_env(ov.extra_env, models_name, f"{at}.kt.extra_env"))
    is_kt = entry.backend == BACKEND_KT
    reason = off_reason if is_kt else f"backend {entry.backend!r} is not served by ktd"
    return ModelSpec(
        alias=entry.alias,
        backend=entry.backend,
        path=entry.path,
        served=is_kt and kt.enabled,
        not_served_reason=reason,
        source=f"{models_name}: {at}",
        kt_weight_path=ov.kt_weight_path if ov.kt_weight_path is not None else kt.kt_weight_path,
        host=kt.host,
        port=ov.port or 0,
        ctx=ov.ctx if ov.ctx is not None else kt.ctx,
        extra_args=args,
        extra_env=tuple(env.items()),
        python=ov.python or python,
        auto_build=kt.auto_build,
        tp_size=ov.tp_size,
        nnodes=ov.nnodes,
        dist_init_addr=ov.dist_init_addr,
        numa=entry.numa,
        gpus=entry.gpus,
        ttl=entry.ttl,
        restart=entry.restart,
        pinned=entry.pinned,
        swap=entry.swap,
        health_timeout=(
            entry.health_timeout if entry.health_timeout is not None else file.daemon.health_timeout
        ),
        max_concurrent=entry.max_concurrent,
        max_queue=entry.max_queue,
        fit=entry.fit,
        sleep=entry.sleep,
        sleep_ttl=entry.sleep_ttl,
        catalog=entry.catalog,
    )


def resolve_models(
    file: ConfigFile, entries: list[ModelEntry], cfg_name: str, models_name: str
) -> dict[str, ModelSpec]:
    """Merge the section's defaults into each entry; pure, testable without files. The
    values were checked before (``ktd.core.configcheck``: an alias twice, a bad value)."""
    kt = file.ktransformers
    base_args = split_args(kt.extra_args, cfg_name, "$.ktransformers.extra_args")
    base_env = parse_env(kt.extra_env, cfg_name, "$.ktransformers.extra_env")
    python = kt.python or sys.executable
    off_reason = None if kt.enabled else "ktransformers.enabled is false"
    models: dict[str, ModelSpec] = {}

    if kt.model_path:
        spec = ModelSpec(
            alias=kt.model_id,
            backend=BACKEND_KT,
            path=kt.model_path,
            served=kt.enabled,
            not_served_reason=off_reason,
            source=f"{cfg_name}: $.ktransformers",
            kt_weight_path=kt.kt_weight_path,
            host=kt.host,
            port=kt.port,
            ctx=kt.ctx,
            extra_args=base_args,
            extra_env=tuple(base_env.items()),
            python=python,
            auto_build=kt.auto_build,
            health_timeout=file.daemon.health_timeout,
        )
        models[spec.alias] = spec

    for i, entry in enumerate(entries):
        at = f"$[{i}]"
        models[entry.alias] = _entry_spec(entry, file, models_name, at, base_args, base_env)
    return models
