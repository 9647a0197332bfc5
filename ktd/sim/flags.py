"""The sim's flags are real SGLang's: the option catalogue its own argparse declares.

Why data instead of a hand-written parser: a lenient stand-in hid real
failures (upstream ``sglang`` exits 2 on ``--kt-numa-nodes``; both packages
read ``--tp 2`` as ``--tp-size 2``). ``options/*.json`` are what
``ServerArgs.add_cli_args`` declares in upstream ``sglang`` 0.5.23 and in the
kt fork ``sglang-kt`` 0.7.2, dumped by ktd's own probe (``ktd.daemon.engine.probe.PROBE_CODE``)
from the installed packages (``tests/real/install.py`` makes the venvs). The
parser built here is a plain ``argparse.ArgumentParser`` like SGLang's:
unknown flags and bad choices exit 2, unique prefixes are accepted.

``KTD_SIM_SGLANG`` picks the package the sim plays: ``kt`` (default, the fork)
or ``upstream``. Stdlib only: the shim's ``sglang.srt.server_args`` imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from decimal import Decimal
from functools import cache
from pathlib import Path
from typing import Any

FLAVORS = {"kt": "sglang-kt-0.7.2.json", "upstream": "sglang-0.5.23.json"}
ENV = "KTD_SIM_SGLANG"
_SI = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_IEC = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def human_readable_int(value: str) -> int:
    """Upstream SGLang's type for sizes such as ``--context-length``: a plain integer, or
    one with an SI suffix (``25.6k``) or an integral IEC one (``1Ki``); case-sensitive."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in _IEC:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'."
                )
            return int(number) * _IEC[suffix]
        return int(Decimal(number) * _SI[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. Use a plain integer, SI suffixes (1k, 1M), "
            "or IEC suffixes (1Ki, 1Mi). Suffixes are case-sensitive."
        ) from None


_TYPES: dict[str, Any] = {
    "int": int,
    "float": float,
    "str": str,
    "human_readable_int": human_readable_int,
}


def flavor(env: dict[str, str] | None = None) -> str:
    value = (os.environ if env is None else env).get(ENV, "kt").strip().lower() or "kt"
    return value if value in FLAVORS else "kt"


@cache
def catalog(which: str) -> dict[str, Any]:
    """``{"package", "version", "options": [...]}`` for ``which`` (a key of FLAVORS)."""
    path = Path(__file__).resolve().parent / "options" / FLAVORS[which]
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def add_cli_args(parser: argparse.ArgumentParser, which: str | None = None) -> None:
    """Declare every option of the chosen SGLang on ``parser``, as its ServerArgs does."""
    for opt in catalog(which or flavor())["options"]:
        flags: list[str] = list(opt["flags"])
        kw: dict[str, Any] = {"dest": opt["dest"], "default": opt.get("default")}
        action = opt.get("action") or "store"
        nargs = opt.get("nargs")
        if nargs == 0:
            if action == "booleanoptional":
                flags = [f for f in flags if not f.startswith("--no-")]
                kw["action"] = argparse.BooleanOptionalAction
            elif action == "count":
                kw["action"] = "count"
            else:
                kw["action"] = "store_false" if "false" in action else "store_true"
        else:
            type_ = _TYPES.get(opt.get("type") or "str", str)
            kw["type"] = type_
            if nargs is not None:
                kw["nargs"] = nargs
            if opt.get("choices") is not None:
                kw["choices"] = [_convert(type_, c) for c in opt["choices"]]
            if action == "append":
                kw["action"] = "append"
        parser.add_argument(*flags, **kw)


def _convert(type_: Any, value: str) -> Any:
    try:
        return type_(value)
    except (TypeError, ValueError):
        return value
