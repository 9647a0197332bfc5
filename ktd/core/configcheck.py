"""The checks of a config's values: the sections of config.json, the named keys, the
gateway, and each models.json entry with its alias.

Apart from the schema (``ktd.core.config``) because a value can be of the right type and
still mean nothing (a negative timeout, an alias that cannot name a file, a kt model
across hosts); apart from the resolution because the checks run first, on the files as
written, and the resolution then reads only values that passed. Pure; every error is a
``ConfigError`` naming the file and the field.
"""

from __future__ import annotations

import hashlib
import re

from ktd.core.config import (
    BACKEND_KT,
    ConfigError,
    ConfigFile,
    DaemonSection,
    FrontendSection,
    KtOverrides,
    KtSection,
    ModelEntry,
    parse_env,
    split_args,
)
from ktd.protocol import MAX_SECONDS, name_problem

_BAD_ALIAS = re.compile(r"[:/\s\x00-\x1f\x7f]")


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


def check_sections(file: ConfigFile, name: str) -> None:
    """config.json's sections, each by its own rules (``name``: the file, for errors)."""
    _check_kt(file.ktransformers, name)
    _check_daemon(file.daemon, name)
    _check_frontend(file.frontend, name)
    _check_keys(file.frontend, name)
    _check_browsers(file.frontend, name)
    _check_gateway(file, name)


def _check_kt(kt: KtSection, name: str) -> None:
    _check_port(kt.port, name, "$.ktransformers.port")
    _check_nonneg(kt.ctx, name, "$.ktransformers.ctx")
    check_alias(kt.model_id, name, "$.ktransformers.model_id")
    split_args(kt.extra_args, name, "$.ktransformers.extra_args")
    parse_env(kt.extra_env, name, "$.ktransformers.extra_env")


#: The daemon's settings that are amounts or durations (a negative one means nothing).
_DAEMON_AMOUNTS = (
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
)


def _check_daemon(d: DaemonSection, name: str) -> None:
    for field in _DAEMON_AMOUNTS:
        _check_nonneg(getattr(d, field), name, f"$.daemon.{field}")
    if d.health_interval <= 0:
        raise ConfigError(name, "$.daemon.health_interval", "must be > 0")
    if not 1 <= d.config_history <= 1000:
        raise ConfigError(name, "$.daemon.config_history", "must be within 1..1000")


def _check_frontend(f: FrontendSection, name: str) -> None:
    """The frontend's bounds, its bind and its plain keys (the named ones: ``_check_keys``)."""
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


def _check_browsers(f: FrontendSection, name: str) -> None:
    """What a browser may do: the origins and hosts answered, and the dashboard's actions
    (which need a key: checked after the keys themselves)."""
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


_LABEL_KEY = re.compile(r"^[A-Za-z0-9_.\-/]{1,128}$")
_KEY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _check_keys(f: FrontendSection, name: str) -> None:
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


def _check_gateway(file: ConfigFile, name: str) -> None:
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


def check_entries(
    file: ConfigFile, entries: list[ModelEntry], cfg_name: str, models_name: str
) -> None:
    """models.json's entries, in order: each alias (unique, the section's model's too),
    each entry's own values, its flags and its environment. The first wrong one raises."""
    kt = file.ktransformers
    sources: dict[str, str] = {}
    if kt.model_path:
        sources[kt.model_id] = f"{cfg_name}: $.ktransformers.model_id"
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
        ov = entry.kt or KtOverrides()
        split_args(ov.extra_args, models_name, f"{at}.kt.extra_args")
        parse_env(ov.extra_env, models_name, f"{at}.kt.extra_env")
