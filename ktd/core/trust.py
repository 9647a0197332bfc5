"""Who may change the config, and what only ktd's owner may (docs/security.md, issue 43).

Pure: the uid comes from the control socket (``SO_PEERCRED``), names from NSS are
looked up by the caller. Three roles:

* ``owner``: ktd's own uid, or root (who could be ktd's uid anyway). Everything.
* ``admin``: a uid or user name in ``daemon.admins``, and anyone acting through the
  dashboard (its admin keys: the frontend marks its requests ``delegated``). May plan
  and change models.json within ``limits``; sees the config with its secrets marked.
* ``member``: any other uid the socket lets in (``daemon.group``). May read (status,
  the config with its secrets marked) and load, evict, sleep; may not plan or change
  the config.

The limits keep an admin from running a program as ktd's user: a plan runs the
interpreter a model names (SGLang's argparse, through the probe), and an engine runs
with the environment its model sets. What an admin's change may not do, each a plan
error naming the field, found before anything is run:

* name an interpreter that is not already one of the running config's (an engine's,
  or ``ktransformers.python``'s default) or in ``daemon.pythons``;
* set an environment variable that changes what a process loads (``LOADER_ENV``)
  to a value the running config does not already give that model;
* change config.json at all: it holds who is trusted (``daemon.admins``,
  ``daemon.pythons``, ``daemon.group``), the keys, and the paths ktd writes
  (``models_file``, ``daemon.*_dir``, ``catalog.dir``).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Collection
from enum import StrEnum
from typing import Annotated, Any

from ktd import protocol as p
from ktd.core import secret
from ktd.core.config import Config, ConfigFile, ModelEntry, ModelSpec, parse_env
from ktd.core.configplan import field_path

__all__ = [
    "LOADER_ENV",
    "LOADER_ENV_PREFIXES",
    "Role",
    "hidden_argv",
    "hidden_launch",
    "is_loader",
    "is_owner",
    "limits",
    "masked",
    "role_of",
    "secrets_of",
    "shown_plan",
    "unmasked",
]


#: An argv, read as ``extra_args`` is: the values of SGLang's secret flags.
_ARGV = Annotated[list[str], secret.SECRET_FLAGS]


class Role(StrEnum):
    OWNER = "owner"
    ADMIN = "admin"
    MEMBER = "member"


#: Environment names that change what a process (the engine, a compiler it runs, a
#: shell) loads or runs: the dynamic loader's, each interpreter's search paths and
#: start-up hooks, the shells' start-up files, the caches compiled kernels and remote
#: code are loaded from, and SGLang's own plugin imports. One list: the docs cite it.
LOADER_ENV_PREFIXES: tuple[str, ...] = (
    "LD_",  # LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT
    "DYLD_",
    "PYTHON",  # PYTHONPATH, PYTHONHOME, PYTHONSTARTUP, PYTHONUSERBASE, ...
    "PERL5",  # PERL5LIB, PERL5OPT
    "RUBY",  # RUBYOPT, RUBYLIB
    "NODE_",  # NODE_OPTIONS, NODE_PATH
    "TRITON_",  # TRITON_CACHE_DIR: compiled kernels are loaded from it
    "TORCHINDUCTOR_",
    "XDG_",  # XDG_CACHE_HOME, XDG_CONFIG_HOME
)
LOADER_ENV: frozenset[str] = frozenset(
    {
        "PATH",  # the programs the engine runs (ninja, nvcc, its own helpers)
        "HOME",  # Python's user site-packages (~/.local) and every tool's dot files
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "GCONV_PATH",
        "LOCPATH",
        "NLSPATH",
        "OPENSSL_CONF",  # an OpenSSL config loads engines (shared objects)
        "OPENSSL_ENGINES",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "TORCH_EXTENSIONS_DIR",
        "CUDA_CACHE_PATH",
        "HF_HOME",  # remote code is cached (and imported) under it
        "HF_MODULES_CACHE",
        "HF_ENDPOINT",  # where models and their code come from (and the token goes)
        "HTTP_PROXY",  # what every download goes through
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "SGLANG_EXTERNAL_MODEL_PACKAGE",  # SGLang imports these packages
        "SGLANG_EXTERNAL_MM_PROCESSOR_PACKAGE",
        "SGLANG_HTTP_SERVER_APP_PATH",
    }
)


def is_loader(name: str) -> bool:
    return name in LOADER_ENV or name.startswith(LOADER_ENV_PREFIXES)


def role_of(
    uid: int | None,
    *,
    owner: int,
    admins: Collection[str | int],
    name: str | None,
    delegated: bool = False,
) -> Role:
    """The role of the socket's uid (None: ktd itself, a signal). ``delegated`` lowers
    the owner to an admin (the dashboard asks for its keys' holders), never raises."""
    if uid is None or uid == owner or uid == 0:
        return Role.ADMIN if delegated else Role.OWNER
    listed = {str(a) for a in admins}
    if str(uid) in listed or (name is not None and name in listed):
        return Role.ADMIN
    return Role.MEMBER


def _forbidden(file: str, path: str, alias: str, message: str) -> p.ConfigProblem:
    return p.ConfigProblem(
        level="error",
        code=p.ErrorCode.FORBIDDEN,
        file=file,
        path=path,
        alias=alias,
        message=message + " (docs/security.md)",
    )


def allowed_pythons(running: Config) -> set[str]:
    """The interpreters a non-owner's model may name: the running config's own."""
    default = running.file.ktransformers.python or sys.executable
    return {default, *running.daemon.pythons, *(s.python for s in running.models.values())}


def limits(running: Config, new: Config, config_changed: bool) -> list[p.ConfigProblem]:
    """What in a non-owner's change needs ktd's owner (each an error naming its field;
    empty: within an admin's rights). Nothing here runs anything."""
    out: list[p.ConfigProblem] = []
    if config_changed:
        out.append(
            _forbidden(
                new.path,
                "",
                "",
                "config.json is changed by ktd's owner only (it says who is trusted, "
                "holds the keys and names the paths ktd writes); change models.json, or "
                "ask the owner",
            )
        )
    pythons = allowed_pythons(running)
    base_env = set(parse_env(running.file.ktransformers.extra_env, running.path, "").items())
    for spec in new.models.values():
        out += _spec_limits(running, new, spec, pythons, base_env)
    return out


def _spec_limits(
    running: Config,
    new: Config,
    spec: ModelSpec,
    pythons: set[str],
    base_env: set[tuple[str, str]],
) -> list[p.ConfigProblem]:
    out = []
    if spec.python not in pythons:
        file, path, _ = field_path(new, spec, "python")
        out.append(
            _forbidden(
                file,
                path,
                spec.alias,
                f"{spec.python!r} is not an interpreter of the running config nor in "
                "daemon.pythons: only ktd's owner may name a new one (a plan runs it)",
            )
        )
    before = running.models.get(spec.alias)
    had = set(before.extra_env) if before is not None else set()
    for name, value in spec.extra_env:
        if is_loader(name) and (name, value) not in had and (name, value) not in base_env:
            file, path, _ = field_path(new, spec, "extra_env")
            out.append(
                _forbidden(
                    file,
                    f"{path}.{name}",
                    spec.alias,
                    f"{name} changes what the engine loads: only ktd's owner may set it",
                )
            )
    return out


def secrets_of(config_text: str, models_text: str | None) -> list[str]:
    """The secret values of both files, config.json's first (a text that is no JSON
    has none to find: it is withheld instead, ``masked``)."""
    out: list[str] = []
    for text, tp in ((config_text, ConfigFile), (models_text, list[ModelEntry])):
        if text is None:
            continue
        try:
            doc = json.loads(text)
        except ValueError:
            continue
        secret.found(doc, tp, out)
    return out


def masked(reply: p.ConfigReply) -> p.ConfigReply:
    """A ``config_get`` answer as a non-owner sees it: every secret marked; a file that
    is no JSON (its secrets cannot be found) withheld as ""."""
    secrets = secrets_of(reply.config_text, reply.models_text)
    config = secret.mask_text(reply.config_text, ConfigFile, secrets)
    models = reply.models_text
    if models is not None:
        models = secret.mask_text(models, list[ModelEntry], secrets) or ""
    reply.config_text, reply.models_text, reply.redacted = config or "", models, True
    return reply


def _doc(text: str | None) -> Any:
    try:
        return json.loads(text) if text is not None else None
    except ValueError:
        return None


def _by_alias(at: str, doc: Any) -> str:
    """A models.json place named by its entry's alias (``$[2].kt.extra_env.X`` ->
    ``'m1'.kt.extra_env.X``): an edit may move entries, not their secrets."""
    m = _ENTRY.match(at)
    if m is None or not isinstance(doc, list) or int(m[1]) >= len(doc):
        return at
    entry = doc[int(m[1])]
    alias = entry.get("alias") if isinstance(entry, dict) else None
    return f"{alias!r}{at[m.end() :]}"


_ENTRY = re.compile(r"^\$\[(\d+)\]")


def unmasked(
    config_text: str | None, models_text: str | None, disk: tuple[str, str | None]
) -> tuple[str | None, str | None]:
    """A non-owner's texts with each mark back to the secret of the files on disk, and
    only where that secret stood (the same field of the same model, or of config.json):
    a mark moved elsewhere (into another model's environment, next to an endpoint of the
    sender's choosing) is a MarkError, as is one that names no secret."""
    secrets = secrets_of(*disk)
    number = {v: n for n, v in enumerate(secrets, start=1)}
    stood: set[tuple[int, str, str]] = set()
    for value, ats in secret.places(_doc(disk[0]), ConfigFile).items():
        stood |= {(number[value], "config", at) for at in ats if value in number}
    models_doc = _doc(disk[1])
    for value, ats in secret.places(models_doc, list[ModelEntry]).items():
        stood |= {(number[value], "models", _by_alias(at, models_doc)) for at in ats}
    if config_text is not None:
        config_text = secret.unmask_text(
            config_text, ConfigFile, secrets, lambda n, at: (n, "config", at) in stood
        )
    if models_text is not None:
        new_doc = _doc(models_text)
        models_text = secret.unmask_text(
            models_text,
            list[ModelEntry],
            secrets,
            lambda n, at: (n, "models", _by_alias(at, new_doc)) in stood,
        )
    return config_text, models_text


def _hide(value: str, at: str) -> str:
    return secret.HIDDEN


def shown_plan(plan: p.ConfigPlanView) -> p.ConfigPlanView:
    """A plan as a non-owner sees it: the values of each changed field that holds
    secrets (``extra_env``, ``extra_args``) hidden where the types mark them."""
    fields = secret.hints(ModelSpec)
    for engine in plan.engines:
        for change in engine.fields:
            tp = fields.get(change.field.rpartition(".")[2])
            if tp is not None and secret.holds_secret(tp):
                change.old = secret.redact(change.old, tp, _hide)
                change.new = secret.redact(change.new, tp, _hide)
    return plan


def is_owner(uid: int | None, owner: int) -> bool:
    """Whether the socket's uid is ktd's owner (no NSS: answered inside the pump)."""
    return uid is None or uid == owner or uid == 0


def hidden_argv(argv: list[str]) -> list[str]:
    """An engine's argv as a non-owner sees it: SGLang's secret flags' values hidden."""
    out: list[str] = secret.redact(argv, _ARGV, _hide)
    return out


def hidden_launch(plan: dict[str, Any], spec: ModelSpec) -> dict[str, Any]:
    """A ``load --dry-run`` plan as a non-owner sees it: the values of the model's own
    ``extra_env`` (marked ``SECRET_ENV``) and of secret flags hidden."""
    out = dict(plan)
    own = {name for name, _ in spec.extra_env}
    if isinstance(out.get("env"), dict):
        out["env"] = {k: secret.HIDDEN if k in own else v for k, v in out["env"].items()}
    for key in ("argv", "argv_flags"):
        if isinstance(out.get(key), list):
            out[key] = hidden_argv(out[key])
    if isinstance(out.get("flags"), list):
        out["flags"] = [
            {**f, "values": [secret.HIDDEN]}
            if isinstance(f, dict) and f.get("name") in secret.SECRET_FLAG_NAMES
            else f
            for f in out["flags"]
        ]
    return out
