"""Configuration: the seed's ``config.json`` + ``models.json``, validated and resolved.

Pure (reads files, no sockets or processes). Every error is a ``ConfigError``
naming the file and the field path, because an operator fixing a 600 GB model's
config at 3 a.m. should not have to guess which of thirty entries is wrong.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from ktd import foreign
from ktd.core.secret import SECRET, SECRET_ENV, SECRET_FLAGS
from ktd.protocol import MAX_SECONDS, name_problem

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
    backend: str
    path: str
    served: bool
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
    not_served_reason: str | None = None
    fit: FitPolicy = "check"
    sleep: bool = False
    sleep_ttl: float = 0.0
    catalog: str = ""  # its entry's: its --kt-num-gpu-experts is derived (OOM retry)

    @property
    def env(self) -> dict[str, str]:
        return dict(self.extra_env)

    def launch_key(self) -> tuple[Any, ...]:
        """The fields that shape the engine's argv, env and placement; the rest apply live."""
        return (
            self.path,
            self.kt_weight_path,
            self.host,
            self.port,
            self.ctx,
            self.extra_args,
            self.extra_env,
            self.python,
            self.tp_size,
            self.nnodes,
            self.dist_init_addr,
            self.numa,
            self.gpus,
            # Only when on: the digest of every engine launched before sleep existed stays.
            *(("sleep",) if self.sleep else ()),
        )

    def launch_digest(self) -> str:
        """A stable fingerprint of ``launch_key``, kept in the state file across restarts."""
        return hashlib.sha1(msgspec.json.encode(self.launch_key())).hexdigest()


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


# ---------------------------------------------------------------- parsing helpers

_MSGSPEC_AT = re.compile(r"^(?P<msg>.*) - at `(?P<path>.*)`$", re.S)
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BAD_ALIAS = re.compile(r"[:/\s\x00-\x1f\x7f]")


def _validation_error(file: str, exc: Exception, base: str = "$") -> ConfigError:
    text = str(exc)
    m = _MSGSPEC_AT.match(text)
    if m:
        return ConfigError(file, base + m["path"][1:], m["msg"])
    return ConfigError(file, base, text)


def _decode_json(file: str, data: bytes, type_: Any) -> Any:
    """A config file's bytes as ``type_``; ConfigError naming the file otherwise (not
    JSON, not UTF-8, nested deeper than ``foreign.MAX_DEPTH``: a hand-written file is
    someone else's text, and ``ktd serve`` names it rather than dying of it)."""
    try:
        return foreign.json(data, msgspec.json.Decoder(type_))
    except msgspec.ValidationError as exc:
        raise _validation_error(file, exc) from None
    except msgspec.DecodeError as exc:
        raise ConfigError(file, "", f"not valid JSON: {_json_position(data, exc)}") from None


def _json_position(data: bytes, exc: Exception) -> str:
    text = str(exc)
    m = re.search(r"\(byte (\d+)\)", text)
    if not m:
        return text
    offset = int(m[1])
    head = data[:offset]
    line = head.count(b"\n") + 1
    col = offset - (head.rfind(b"\n") + 1) + 1
    return f"{text} (line {line}, column {col})"


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


#: An alias names files (``<alias>.log.N``, ``keys/<alias>.yml``): a file name has 255
#: bytes, and the suffixes need the rest.
MAX_ALIAS_BYTES = 240


def check_alias(alias: str, file: str, path: str) -> None:
    if not alias:
        raise ConfigError(file, path, "must not be empty")
    problem = name_problem(alias)
    if problem is not None:
        raise ConfigError(file, path, f"{alias[:40]!r}... {problem}")
    if len(alias.encode()) > MAX_ALIAS_BYTES:
        raise ConfigError(
            file,
            path,
            f"is {len(alias.encode())} bytes in UTF-8; an alias names files, "
            f"so {MAX_ALIAS_BYTES} at most",
        )
    if ":" in alias:
        raise ConfigError(
            file, path, f"{alias!r} contains ':' (SGLang reads 'name:adapter' as a LoRA request)"
        )
    if _BAD_ALIAS.search(alias) or alias.startswith("."):
        raise ConfigError(
            file, path, f"{alias!r} must not contain '/', whitespace or control characters"
        )


def _check_port(port: int, file: str, path: str) -> None:
    if not 0 <= port <= 65535:
        raise ConfigError(file, path, f"port {port} is out of range 0-65535")


def _check_nonneg(value: float | int | None, file: str, path: str) -> None:
    if value is not None and value < 0:
        raise ConfigError(file, path, f"must be >= 0, got {value}")
    # A duration (a float field) also goes on the control socket, whose bound it keeps:
    # a ttl of 1e300 made /api/ps fail, a lease_ttl past it made every report refused.
    if isinstance(value, float) and not value <= MAX_SECONDS:
        raise ConfigError(file, path, f"must be at most {MAX_SECONDS:g} seconds, got {value}")


# ---------------------------------------------------------------- loading


#: The largest config.json or models.json ktd reads: a file past it is a mistake (or
#: ``/dev/zero``), and reading it whole would grow the daemon without bound.
MAX_CONFIG_BYTES = 4 << 20


def read_config_file(path: Path) -> bytes:
    """A config file's bytes: a regular file only (a FIFO or a device would block or never
    end; it is opened without blocking to find out), at most ``MAX_CONFIG_BYTES``.
    Raises OSError with a sentence for people."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(f"not a regular file ({_file_kind(st.st_mode)})")
        if st.st_size > MAX_CONFIG_BYTES:
            raise OSError(f"{st.st_size} bytes: more than the {MAX_CONFIG_BYTES} ktd reads")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:
        raise OSError(f"more than the {MAX_CONFIG_BYTES} bytes ktd reads")
    return data


def _file_kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a plain file"


@dataclass(frozen=True)
class ConfigTexts:
    """The two files of a config as bytes, and where they are: what a version of the
    config is (``ktctl config``, the history), read once and parsed from memory."""

    config_name: str
    config: bytes
    models_name: str
    models: bytes | None  # None: no models file
    models_named: bool = False  # config.json names it (``models_file``): it must exist


def models_file_of(cfg_path: Path, config: bytes) -> tuple[Path, bool]:
    """Where a config's models file is, and whether config.json names it. Read leniently
    (a config.json that does not validate still says where its models are; a text that
    is no JSON object means the default ``models.json`` beside it)."""
    try:
        doc = foreign.json_any(config)
    except msgspec.DecodeError:  # foreign.Malformed too: parse_config says what is wrong
        doc = None
    named = doc.get("models_file") if isinstance(doc, dict) else None
    if isinstance(named, str) and named:
        return cfg_path.parent / named, True
    return cfg_path.parent / "models.json", False


def read_config_texts(path: str | Path, *, missing_ok: bool = False) -> ConfigTexts:
    """Both files' bytes (regular files, bounded); ConfigError when one cannot be read.
    ``missing_ok``: a models file config.json names but that does not exist is read as
    none (what is on disk, for ``ktctl config``); parsing refuses it. Blocking (files)."""
    cfg_path = Path(path)
    cfg_name = str(cfg_path)
    try:
        data = read_config_file(cfg_path)
    except OSError as exc:
        raise ConfigError(cfg_name, "", f"cannot read: {exc.strerror or exc}") from None
    mpath, named = models_file_of(cfg_path, data)
    mdata = None
    if mpath.exists() or (named and not missing_ok):
        try:
            mdata = read_config_file(mpath)
        except OSError as exc:
            raise ConfigError(
                cfg_name, "$.models_file", f"cannot read {mpath}: {exc.strerror or exc}"
            ) from None
    return ConfigTexts(cfg_name, data, str(mpath), mdata, named)


def parse_config(texts: ConfigTexts) -> Config:
    """Validate and resolve a config from its files' bytes (pure); ConfigError names the
    file and the field."""
    cfg_name, models_name = texts.config_name, texts.models_name
    file: ConfigFile = _decode_json(cfg_name, texts.config, ConfigFile)
    _validate_sections(file, cfg_name)
    entries: list[ModelEntry] = []
    if texts.models is not None:
        entries = _decode_json(models_name, texts.models, list[ModelEntry])
    elif texts.models_named:
        raise ConfigError(cfg_name, "$.models_file", f"{models_name} does not exist")
    models = resolve_models(file, entries, cfg_name, models_name)
    return Config(path=cfg_name, file=file, models=models, entries=entries)


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> Config:
    """Read, validate and resolve a config; bad input raises ConfigError and nothing else.
    Blocking (files): the daemon calls it from a thread, bounded (``ktd.daemon.main``)."""
    return parse_config(read_config_texts(path))


def _validate_sections(file: ConfigFile, name: str) -> None:
    kt = file.ktransformers
    _check_port(kt.port, name, "$.ktransformers.port")
    _check_nonneg(kt.ctx, name, "$.ktransformers.ctx")
    check_alias(kt.model_id, name, "$.ktransformers.model_id")
    split_args(kt.extra_args, name, "$.ktransformers.extra_args")
    parse_env(kt.extra_env, name, "$.ktransformers.extra_env")
    d = file.daemon
    for field in (
        "drain_timeout",
        "stop_grace",
        "health_timeout",
        "health_interval",
        "hang_timeout",
        "lease_ttl",
        "log_max_bytes",
        "log_backups",
        "restart_backoff",
        "restart_max",
        "restart_window",
        "cpu_reserve",
        "memory_timeout",
    ):
        _check_nonneg(getattr(d, field), name, f"$.daemon.{field}")
    if d.health_interval <= 0:
        raise ConfigError(name, "$.daemon.health_interval", "must be > 0")
    if not 1 <= d.config_history <= 1000:
        raise ConfigError(name, "$.daemon.config_history", "must be within 1..1000")
    f = file.frontend
    _check_nonneg(f.max_body_bytes, name, "$.frontend.max_body_bytes")
    _check_nonneg(f.load_timeout, name, "$.frontend.load_timeout")
    if f.idle_timeout <= 0:
        raise ConfigError(name, "$.frontend.idle_timeout", "must be > 0")
    if f.send_timeout <= 0:
        raise ConfigError(name, "$.frontend.send_timeout", "must be > 0")
    if not f.bind.startswith("unix:") and ":" not in f.bind:
        raise ConfigError(
            name, "$.frontend.bind", f"expected HOST:PORT or unix:PATH, got {f.bind!r}"
        )
    for i, key in enumerate(f.api_keys):
        if not key:
            raise ConfigError(name, f"$.frontend.api_keys[{i}]", "must not be empty")
    _validate_keys(f, name)
    for i, origin in enumerate(f.allowed_origins):
        if origin != "*" and not re.match(r"^[a-z][a-z0-9+.\-]*://[^/\s]+/?$", origin, re.I):
            raise ConfigError(
                name,
                f"$.frontend.allowed_origins[{i}]",
                f"expected SCHEME://HOST[:PORT] or *, got {origin!r}",
            )
    for i, host in enumerate(f.allowed_hosts):
        if not host or any(c in host for c in "/ \t"):
            raise ConfigError(
                name, f"$.frontend.allowed_hosts[{i}]", f"expected a host name or *, got {host!r}"
            )
    if f.ui_control and not (f.api_keys or any(k.admin for k in f.keys)):
        raise ConfigError(
            name,
            "$.frontend.ui_control",
            "needs frontend.api_keys or an admin key in frontend.keys: the dashboard's "
            "actions are only for a holder of a key",
        )
    _validate_gateway(file, name)


_LABEL_KEY = re.compile(r"^[A-Za-z0-9_.\-/]{1,128}$")
_KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _validate_keys(f: FrontendSection, name: str) -> None:
    """Named keys: each names itself and one secret; no name or secret twice (a plain
    ``api_keys`` secret included). An alias in ``models`` that no model has is not an
    error (models come and go): the frontend warns of it at start."""
    names: set[str] = set()
    digests = {hashlib.sha256(k.encode()).hexdigest() for k in f.api_keys}
    for i, k in enumerate(f.keys):
        at = f"$.frontend.keys[{i}]"
        if not _KEY_NAME.match(k.name):
            raise ConfigError(
                name, f"{at}.name", "expected 1-64 of A-Z a-z 0-9 _ . - (it labels metrics)"
            )
        if k.name in names:
            raise ConfigError(name, f"{at}.name", f"{k.name!r} names two keys")
        names.add(k.name)
        if (k.key is None) == (k.key_sha256 is None):
            raise ConfigError(name, at, "needs exactly one of key and key_sha256")
        if k.key is not None and not k.key:
            raise ConfigError(name, f"{at}.key", "must not be empty")
        if k.key_sha256 is not None and not _SHA256.match(k.key_sha256):
            raise ConfigError(name, f"{at}.key_sha256", "expected 64 lowercase hex digits")
        digest = k.key_sha256 or hashlib.sha256((k.key or "").encode()).hexdigest()
        if digest in digests:
            raise ConfigError(name, at, "its secret is another key's too")
        digests.add(digest)
        if not k.models or any(not m for m in k.models):
            raise ConfigError(name, f"{at}.models", "expected aliases or patterns (* for all)")
        for field in ("max_concurrent", "tokens_per_day"):
            value = getattr(k, field)
            if value is not None and value < 1:
                raise ConfigError(name, f"{at}.{field}", "must be >= 1 (omit it: no limit)")
        if abs(k.priority) > 1000:
            raise ConfigError(name, f"{at}.priority", "must be within -1000..1000")


def _validate_gateway(file: ConfigFile, name: str) -> None:
    g = file.gateway
    for i, url in enumerate(g.routers):
        if not re.match(r"^https?://[^/\s]+/?$", url):
            raise ConfigError(
                name, f"$.gateway.routers[{i}]", f"expected http(s)://HOST:PORT, got {url!r}"
            )
    if len(set(u.rstrip("/") for u in g.routers)) != len(g.routers):
        raise ConfigError(name, "$.gateway.routers", "lists a router twice")
    for field in ("reconcile_interval", "timeout", "deregister_timeout", "backoff_max"):
        if getattr(g, field) <= 0:
            raise ConfigError(name, f"$.gateway.{field}", "must be > 0")
    if g.health_check_interval < 1:
        raise ConfigError(name, "$.gateway.health_check_interval", "must be >= 1")
    for key in g.labels:
        if not _LABEL_KEY.match(key):
            raise ConfigError(name, f"$.gateway.labels.{key}", "not a usable label name")
    if g.advertise is not None and (not g.advertise or "/" in g.advertise or " " in g.advertise):
        raise ConfigError(
            name, "$.gateway.advertise", f"expected HOST or HOST:PORT, got {g.advertise!r}"
        )
    if g.model_id is not None:
        check_alias(g.model_id, name, "$.gateway.model_id")
    if g.mode == "frontend" and g.routers and file.frontend.bind.startswith("unix:"):
        raise ConfigError(
            name,
            "$.gateway.mode",
            "frontend mode needs a TCP frontend.bind (a router cannot reach a unix socket)",
        )


SINGLE_HOST = (
    "kt engines cannot span hosts: kt-kernel runs the CPU experts on TP rank 0 only and "
    "stages prefill buffers in this host's shared memory (ktransformers #874). Scale out "
    "by replicas instead: one ktd per host, each registering with sglang-router "
    '(README, "Beyond one host")'
)


def _check_single_host(ov: KtOverrides, file: str, at: str) -> None:
    """Multi-node fields either work end to end or are refused; for kt they cannot work."""
    if ov.nnodes is not None and ov.nnodes != 1:
        raise ConfigError(file, f"{at}.nnodes", f"{ov.nnodes} nodes: {SINGLE_HOST}")
    if ov.dist_init_addr is not None:
        raise ConfigError(file, f"{at}.dist_init_addr", f"multi-node only: {SINGLE_HOST}")
    if ov.nodes is not None:
        raise ConfigError(file, f"{at}.nodes", f"multi-node only: {SINGLE_HOST}")
    if ov.tp_size is not None and ov.tp_size < 1:
        raise ConfigError(file, f"{at}.tp_size", "must be >= 1")


def _check_entry(entry: ModelEntry, name: str, at: str) -> None:
    """One models.json entry's own values (its alias is checked apart, with the others)."""
    _check_nonneg(entry.ttl, name, f"{at}.ttl")
    _check_nonneg(entry.sleep_ttl, name, f"{at}.sleep_ttl")
    if entry.sleep_ttl and not entry.sleep:
        raise ConfigError(name, f"{at}.sleep_ttl", 'needs "sleep": true')
    _check_nonneg(entry.health_timeout, name, f"{at}.health_timeout")
    if isinstance(entry.numa, list) and len(set(entry.numa)) != len(entry.numa):
        raise ConfigError(name, f"{at}.numa", "lists a node twice")
    if isinstance(entry.gpus, int) and entry.gpus < 0:
        raise ConfigError(name, f"{at}.gpus", "must be >= 0")
    if entry.max_concurrent is not None and entry.max_concurrent < 1:
        raise ConfigError(name, f"{at}.max_concurrent", "must be >= 1")
    _check_nonneg(entry.max_queue, name, f"{at}.max_queue")
    ov = entry.kt or KtOverrides()
    if entry.backend == BACKEND_KT:
        _check_single_host(ov, name, f"{at}.kt")
    if ov.ctx is not None:
        _check_nonneg(ov.ctx, name, f"{at}.kt.ctx")
    if ov.port is not None:
        _check_port(ov.port, name, f"{at}.kt.port")


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
    """Merge the section's defaults into each entry; pure, testable without files."""
    kt = file.ktransformers
    base_args = split_args(kt.extra_args, cfg_name, "$.ktransformers.extra_args")
    base_env = parse_env(kt.extra_env, cfg_name, "$.ktransformers.extra_env")
    python = kt.python or sys.executable
    off_reason = None if kt.enabled else "ktransformers.enabled is false"
    models: dict[str, ModelSpec] = {}
    sources: dict[str, str] = {}

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
        sources[spec.alias] = f"{cfg_name}: $.ktransformers.model_id"

    for i, entry in enumerate(entries):
        at = f"$[{i}]"
        check_alias(entry.alias, models_name, f"{at}.alias")
        if entry.alias in sources:
            raise ConfigError(
                models_name,
                f"{at}.alias",
                f"duplicate alias {entry.alias!r} (also at {sources[entry.alias]})",
            )
        sources[entry.alias] = f"{models_name}: {at}.alias"
        _check_entry(entry, models_name, at)
        models[entry.alias] = _entry_spec(entry, file, models_name, at, base_args, base_env)
    return models
