"""What an engine's log lines mean to ktd: load milestones, and ktd's own probe traffic.

Status shows a *phase* ("loading weights"), never a raw log line; SGLang's
milestone lines say which phase a load is in. And ktd's health checks make
uvicorn log an access line every few seconds per engine: kept out of
``ktctl logs`` and the ``log.*`` events unless asked for, they would bury the
lines that matter. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "PROBE_QUERY",
    "Seam",
    "is_probe_access",
    "overlap",
    "percent_of",
    "phase_of",
    "probe_path",
    "split_probe_access",
]

#: (substring of an SGLang line, the phase it starts), checked in order.
_MILESTONES = (
    ("Load weight begin", "loading weights"),
    ("Loading safetensors checkpoint shards", "loading weights"),
    ("Load weight end", "weights loaded"),
    ("KV Cache is allocated", "allocating KV cache"),
    ("Capture cuda graph begin", "capturing CUDA graphs"),
    ("Capture cuda graph end", "CUDA graphs captured"),
    ("Uvicorn running on", "warming up"),
    ("Application startup complete", "warming up"),
)

#: ktd tags its own readiness and health requests with this query string (SGLang's
#: routes ignore it; uvicorn's access line shows it), so a client's ``GET /health``
#: stays in the log and only ktd's own polling is set apart.
PROBE_QUERY = "ktd=probe"
_PROBE = re.compile(r'"GET /[^ "?]*\?' + PROBE_QUERY + r' HTTP/[\d.]+" \d{3}')


def probe_path(path: str) -> str:
    """``/health`` -> ``/health?ktd=probe``: the path ktd's own checks request."""
    return f"{path}?{PROBE_QUERY}"


def phase_of(line: str) -> str | None:
    """The load phase ``line`` announces, or None."""
    for marker, phase in _MILESTONES:
        if marker in line:
            return phase
    return None


#: A progress bar's percentage as SGLang's tqdm bars print it: its own format
#: (``sglang.srt.utils.common.BAR_FORMAT``, "Loading safetensors checkpoint shards:  50%
#: Completed | 1/2 [...]") or tqdm's default ("Capturing batches (bs=8 ...):  50%|###  |").
_PERCENT = re.compile(r"(\d{1,3})% ?(?:Completed \||\|)")


def percent_of(line: str) -> float | None:
    """How far the load step ``line`` reports is (0-100), or None. A tqdm bar redraws
    itself with carriage returns on one line: its last drawing counts."""
    found = _PERCENT.findall(line)
    if not found:
        return None
    value = float(found[-1])
    return value if value <= 100 else None


def is_probe_access(line: str) -> bool:
    return _PROBE.search(line) is not None


def split_probe_access(lines: Iterable[str]) -> tuple[list[str], list[str]]:
    """(ordinary lines, probe access lines), order kept within each."""
    keep: list[str] = []
    probes: list[str] = []
    for line in lines:
        (probes if is_probe_access(line) else keep).append(line)
    return keep, probes


class Seam:
    """Where a log follower's tail ends and the new lines begin.

    A follower subscribes to new lines before it asks for the tail, so the lines
    written in between arrive twice, and their events may come before or after the
    tail's reply (another socket). Each event carries the log's line count after its
    lines (``Event.upto``), the tail the count it was read at (``LogsReply.upto``):
    a batch within the tail's count is dropped, by count and never by text (an
    engine's repeated lines are real). The filter ends at the first newer batch, so
    a restarted daemon's count, which starts again, cannot hide its lines. From a
    daemon that does not count (``upto`` 0), the batches that came before the reply
    are cut by the overlap of text instead (``opening``).
    """

    def __init__(self, tail: list[str] | None = None, upto: int = 0) -> None:
        self.tail = tail or []
        self.upto = upto  # 0: nothing to drop by count (no tail yet, or no count)

    def opening(self, batches: Iterable[tuple[int, list[str]]]) -> list[str]:
        """What the batches (``(upto, lines)``) that arrived with the tail add to it."""
        if not self.upto:
            extra = [line for _, lines in batches for line in lines]
            return extra[overlap(self.tail, extra) :]
        return [line for upto, lines in batches for line in self.fresh(upto, lines)]

    def fresh(self, upto: int, lines: list[str]) -> list[str]:
        """A batch that arrived after the tail: its lines unless the tail holds them."""
        if self.upto and 0 < upto <= self.upto:
            return []
        self.upto = 0
        return lines


def overlap(tail: list[str], extra: list[str]) -> int:
    """How many leading ``extra`` lines repeat the end of ``tail`` (longest such run):
    the seam by text, for a daemon whose events carry no count (``Seam``).
    """
    for k in range(min(len(tail), len(extra)), 0, -1):
        if tail[-k:] == extra[:k]:
            return k
    return 0
