"""Why an engine died, in one line: the first real error of its log tail.

SGLang ends a failed start with "Initialization failed. Please see the error
messages above." and kt-kernel or torch print their cause further up; a
reason that quotes the last line tells the operator nothing. Pure: a function
of the tail lines (and the log path to point at).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["first_error", "reason_line", "this_run"]

#: Lines that say something failed without saying what.
_VAGUE = (
    "initialization failed. please see the error messages above",
    "please see the error messages above",
    "triggering sigquit",
    "sleeping",  # "sleep 5s before crash diagnostics"
    "killing",
)

#: Causes worth naming even when they are not the last line, most specific first.
_STRONG = (
    re.compile(r"cuda out of memory|outofmemoryerror|out of memory", re.I),
    re.compile(r"unrecognized arguments?:", re.I),
    re.compile(r"error: argument [^:]+:", re.I),
    re.compile(r"illegal instruction", re.I),
    re.compile(r"address already in use", re.I),
)

#: ``SomeError: message`` as Python prints an exception (also ``pkg.mod.Error: ...``).
_EXCEPTION = re.compile(r"^\s*(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b.*")
_TRACEBACK = "Traceback (most recent call last):"
_KTD_NOTE = "[ktd] "
_MAX = 300


def _clean(line: str) -> str:
    return " ".join(line.split())[:_MAX]


def _vague(line: str) -> bool:
    low = line.lower()
    return any(v in low for v in _VAGUE)


def first_error(tail_lines: Sequence[str]) -> str:
    """The first line of ``tail_lines`` that names a cause, or "" when none does.

    Order of preference: a line matching a known cause (out of memory,
    argparse's ``unrecognized arguments``...), then the last line of the first
    Python traceback (the exception itself), then any exception-shaped line,
    then the last non-blank line that is not vague. ktd's own ``[ktd]`` notes
    are skipped: they describe the exit, not its cause.
    """
    lines = [ln for ln in tail_lines if ln.strip() and not ln.startswith(_KTD_NOTE)]
    for pattern in _STRONG:
        for ln in lines:
            if pattern.search(ln):
                return _clean(ln)
    for i, ln in enumerate(lines):
        if ln.strip() == _TRACEBACK:
            # The traceback's last line: the first following line at column 0
            # that is not a "File ..." frame or indented source.
            for later in lines[i + 1 :]:
                if later.startswith((" ", "\t")):
                    continue
                if later.strip() == _TRACEBACK:
                    break
                if not _vague(later):
                    return _clean(later)
            break
    for ln in lines:
        if _EXCEPTION.match(ln) and not _vague(ln):
            return _clean(ln)
    for ln in reversed(lines):
        if not _vague(ln):
            return _clean(ln)
    return ""


def this_run(tail_lines: Sequence[str]) -> Sequence[str]:
    """The lines since ktd's last ``starting:`` note: the tail outlives one attempt, and an
    earlier attempt's error must not be blamed for this one."""
    for i in range(len(tail_lines) - 1, -1, -1):
        if tail_lines[i].startswith(_KTD_NOTE + "starting:"):
            return tail_lines[i + 1 :]
    return tail_lines


def reason_line(how: str, tail_lines: Sequence[str], log_path: str) -> str:
    """``engine exited with code 1 before it was ready: <cause> (log: <path>)``."""
    cause = first_error(this_run(tail_lines))
    text = f"engine {how} before it was ready"
    if cause:
        text += f": {cause}"
    return f"{text} (log: {log_path})"
