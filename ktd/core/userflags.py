"""``extra_args`` read as argparse reads them, without SGLang's catalogue: the one parser.

Placement (which kt flags the user set), the launch command (which derived flags
the user overrides), the config check and the gateway (``--api-key``) all ask
"which flags did the user write, with which values"; one reader answers all of
them, so they can never disagree on what ``extra_args`` says. (With SGLang's
catalogue known, ``ktd.core.sglang_options`` reads abbreviations too.)
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["flag_names", "is_flag", "user_flags"]


def is_flag(token: str) -> bool:
    """``--x``/``-x`` start a flag; ``-1`` or ``-0.5`` are values (negative numbers)."""
    if not token.startswith("-") or token == "-":
        return False
    try:
        float(token)
    except ValueError:
        return True
    return False


def user_flags(extra_args: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """The flags the user gave, as argparse would read them: ``{flag: values}``.

    ``--flag value``, ``--flag=value`` and multi-value ``--kt-numa-nodes 0 1``
    are all understood; a bare ``--switch`` maps to ``()``. A value never starts
    with ``-`` unless it is a number. ``--flag=value`` takes exactly that one
    value (as argparse does). A repeated flag keeps the last occurrence, which
    is the one SGLang's argparse would use.
    """
    out: dict[str, tuple[str, ...]] = {}
    args = list(extra_args)
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if not is_flag(tok):
            continue  # a stray positional; SGLang would reject it, not our job here
        name, eq, value = tok.partition("=")
        if eq and name.startswith("--"):
            out[name] = (value,)
            continue
        values: list[str] = []
        while i < len(args) and not is_flag(args[i]):
            values.append(args[i])
            i += 1
        out[tok] = tuple(values)
    return out


def flag_names(extra_args: Iterable[str]) -> set[str]:
    """The long flags (``--x``) the user wrote, exactly as written."""
    return {name for name in user_flags(extra_args) if name.startswith("--")}
