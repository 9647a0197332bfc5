"""How long each alias took to load, recently: the basis of the load ETA.

A DeepSeek load takes 2-10 minutes depending on disks; "loading..." with no
expected end makes operators kill loads that were nearly done. The durations
live in their own small file in the state dir (``load_history.json``), written
atomically, apart from the engine state file: losing it costs only the ETA.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from ktd import foreign
from ktd.daemon.pool import statefile

__all__ = ["LoadHistory", "expected"]

KEEP = 5


def expected(durations: list[float]) -> float | None:
    """The median of recent loads: one slow cold-cache load does not skew it."""
    return float(statistics.median(durations)) if durations else None


class LoadHistory:
    def __init__(self, path: Path | None, keep: int = KEEP) -> None:
        self.path = path
        self.keep = keep
        self.loads: dict[str, list[float]] = self._read()

    def _read(self) -> dict[str, list[float]]:
        if self.path is None:
            return {}
        try:
            data = foreign.loads(self.path.read_bytes())
        except (OSError, ValueError):
            return {}
        loads = data.get("loads") if isinstance(data, dict) else None
        if not isinstance(loads, dict):
            return {}
        out: dict[str, list[float]] = {}
        for alias, values in loads.items():
            if isinstance(alias, str) and isinstance(values, list):
                nums = [float(v) for v in values if isinstance(v, (int, float)) and v >= 0]
                if nums:
                    out[alias] = nums[-self.keep :]
        return out

    def expected(self, alias: str) -> float | None:
        return expected(self.loads.get(alias, []))

    def record(self, alias: str, seconds: float) -> None:
        """Add one load's duration and write the file (errors cost only the ETA)."""
        recent = [*self.loads.get(alias, []), round(seconds, 3)][-self.keep :]
        self.loads[alias] = recent
        if self.path is None:
            return
        try:
            self._write()
        except OSError:
            pass

    def _write(self) -> None:
        assert self.path is not None
        data = json.dumps({"version": 1, "loads": self.loads}, indent=1).encode()
        statefile.write_bytes(self.path, data)  # whole or not at all, like engines.json
