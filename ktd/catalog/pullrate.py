"""This box's last measured pull rate: the bytes a finished pull fetched over the seconds
its fetch took, kept in ``<state_dir>/pull-rate.json`` (issue 44 item 5).

Why: ``ktctl load NAME`` for a catalog name not pulled yet says how long a pull would
take here; the hub's speed to this box is the one figure no catalog can know, so it is
measured by the pulls that ran, and the newest finished one speaks for the next.
A pull that fetched nothing (everything was here) measures nothing and is not kept.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

__all__ = ["FILE", "Rate", "read", "record"]

FILE = "pull-rate.json"


@dataclass(frozen=True)
class Rate:
    bytes: int
    seconds: float
    at: float  # the wall clock when the pull ended

    @property
    def per_second(self) -> float:
        return self.bytes / self.seconds

    def to_dict(self) -> dict[str, float]:
        return {
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "bytes_per_second": round(self.per_second, 1),
            "at": round(self.at, 3),
        }


def record(path: Path, fetched: int, seconds: float, *, now: float | None = None) -> Rate | None:
    """Keep a finished pull's rate (replacing the last); None when it measured nothing."""
    if fetched <= 0 or seconds <= 0:
        return None
    rate = Rate(fetched, seconds, time.time() if now is None else now)
    tmp = path.with_suffix(".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_bytes(msgspec.json.encode(rate.to_dict()))
    os.replace(tmp, path)
    return rate


def read(path: Path) -> Rate | None:
    """The kept rate, or None (no pull finished here yet, or the file is not one)."""
    try:
        doc = msgspec.json.decode(path.read_bytes())
        got, secs, at = doc["bytes"], doc["seconds"], doc["at"]
    except (OSError, msgspec.DecodeError, KeyError, TypeError):
        return None
    ok = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (got, secs, at))
    if not ok or got <= 0 or secs <= 0:
        return None
    return Rate(int(got), float(secs), float(at))
