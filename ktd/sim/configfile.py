"""``--config FILE``: a YAML file of options merged into the command line, as SGLang does.

SGLang's ``prepare_server_args`` runs ``ConfigArgumentMerger.merge_config_with_args``
when the token ``--config`` stands alone in argv (``--config=FILE`` is parsed and
ignored); the file's ``key: value`` pairs become ``--key value`` words put *before*
the command line's, so the command line wins. ktd hands each engine its API key this
way (``api-key: "..."``). The two packages differ, and the sim plays the one it is:

* upstream 0.5.23 (``sglang/srt/utils/server_args_config_parser.py``): a key may be
  any long spelling of a flag or its dest; a flag that is ``store_true`` gets
  ``--key`` for true and nothing for false; valued flags (``store`` or ``nargs``
  unset) take ``--key value``; anything else is refused ("Unsupported config
  option"); a mapping value is passed as JSON.
* the kt fork 0.7.2 (``sglang/srt/server_args_config_parser.py``): the same keyed by
  dest only, and only ``store_true`` and ``store`` supported; a mapping is ``str()``-ed.

The actions are judged as SGLang's classes are, from the catalogue the sim's
argparse is built from (``ktd.sim.flags``: the real action's class name): SGLang's
own actions (``LoRAPathAction``, ``DeprecatedStoreTrueAction``, ...) subclass
neither ``_StoreAction`` nor ``_StoreTrueAction``, whatever the sim's parser made of
them. In both: the file must end in ``.yaml``/``.yml`` and exist, its root must be a
mapping (empty: nothing), a list value becomes ``--key v1 v2`` (empty: nothing),
another bool ``--key true|false``, one ``--config`` only, and none at the end.
Each refusal is SGLang's ``ValueError`` (a traceback and exit 1 there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from ktd.sim import flags

__all__ = ["ConfigFileError", "merge"]


class ConfigFileError(ValueError):
    """What SGLang raises (``ValueError``) for a config file it will not read."""


def _keys(option: dict[str, Any], which: str) -> set[str]:
    dest: str = option["dest"]
    if which != "upstream":
        return {dest}
    return {dest} | {f[2:].replace("-", "_") for f in option["flags"] if f.startswith("--")}


def _supported(option: dict[str, Any], which: str) -> bool:
    if (option.get("action") or "store") in ("store", "storetrue"):
        return True
    return which == "upstream" and option.get("nargs") is None


def _tables(which: str) -> tuple[set[str], dict[str, str]]:
    """(store_true keys, unsupported keys -> their action), as the merger builds them."""
    options: list[dict[str, Any]] = flags.catalog(which)["options"]
    store_true = {k for o in options if o.get("action") == "storetrue" for k in _keys(o, which)}
    supported = [o for o in options if _supported(o, which)]
    supported_keys = {k for o in supported for k in _keys(o, which)}
    unsupported: dict[str, str] = {}
    for o in options:
        if o in supported or {"--config", "--help", "-h"} & set(o["flags"]):
            continue
        for k in _keys(o, which):
            if which != "upstream" or k not in supported_keys:
                unsupported[k] = o.get("action") or "store"
    return store_true, unsupported


def _read(path: str) -> dict[str, Any]:
    p = Path(path)
    if p.suffix.lower() not in (".yaml", ".yml"):
        raise ConfigFileError(f"Config file must be YAML format, got: {p.suffix}")
    if not p.exists():
        raise ConfigFileError(f"Config file not found: {path}")
    with open(path) as f:
        data = yaml.safe_load(f)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigFileError("Config file must contain a dictionary at root level")
    return data


def _to_args(config: dict[str, Any], which: str) -> list[str]:
    store_true, unsupported = _tables(which)
    args: list[str] = []
    for key, value in config.items():
        norm = str(key).replace("-", "_")
        if norm in unsupported:
            kind = unsupported[norm]
            raise ConfigFileError(f"Unsupported config option '{norm}' with action '{kind}'")
        if isinstance(value, bool):
            if norm in store_true:
                if value:
                    args.append(f"--{key}")
            else:
                args += [f"--{key}", str(value).lower()]
        elif isinstance(value, list):
            if value:
                args += [f"--{key}", *(str(v) for v in value)]
        elif isinstance(value, dict) and which == "upstream":
            args += [f"--{key}", json.dumps(value)]
        else:
            args += [f"--{key}", str(value)]
    return args


def merge(argv: list[str], which: str) -> list[str]:
    """``argv`` with the config file's options put first (SGLang's merge)."""
    if "--config" not in argv:
        return argv
    at = [i for i, a in enumerate(argv) if a == "--config"]
    if len(at) > 1:
        raise ConfigFileError("Multiple config files specified! Only one allowed.")
    i = at[0]
    if i == len(argv) - 1:
        raise ConfigFileError("No config file specified after --config flag!")
    config = _to_args(_read(argv[i + 1]), which)
    return config + argv[:i] + argv[i + 2 :]
