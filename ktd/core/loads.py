"""What an SGLang ``GET /v1/loads`` answer says about the requests inside the engine (pure).

Read in one place because ktd decides on it three ways: a sleep's fence
(``ktd.core.lifecycle``), a stop when routers send requests straight to the engine,
and the idle TTL's last look (``ktd.daemon.pool.sweeper``). What SGLang puts there, and
what it leaves out (``docs/sglang.md``, "Sleep"):

* one entry per DP rank with ``num_running_reqs``, ``num_waiting_reqs`` and
  ``num_used_tokens`` (KV tokens held by requests; the prefix cache's evictable tokens
  are not counted, so an idle engine says 0), and ``timestamp``, the wall-clock time
  the rank's figures were taken;
* upstream 0.5.23 answers from a snapshot the scheduler publishes after a prefill, when
  idle, and every ``--load-snapshot-publish-interval`` (15) decode steps: a request
  still being tokenized, or in its first prefill, is in no snapshot yet, and a
  snapshot can be older than the request;
* the kt fork 0.7.2 asks the scheduler between two batches, but counts the running
  batch without the request whose prefill just ended (it sits in the last batch for
  one loop): its KV tokens are counted, its request is not.

So a zero is "quiet" only when requests *and* tokens are zero, and a quiet reading
proves nothing about a request that may have arrived after its ``taken`` time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["EngineLoad", "parse"]


@dataclass(frozen=True)
class EngineLoad:
    """The engine's own count: requests running and waiting, KV tokens in use (summed
    over its DP ranks), and when the oldest rank's figures were taken (wall clock;
    None when SGLang does not say)."""

    requests: int
    tokens: int = 0
    taken: float | None = None

    @property
    def quiet(self) -> bool:
        """Nothing running, waiting or holding KV cache."""
        return self.requests == 0 and self.tokens == 0

    def taken_after(self, when: float) -> bool:
        """Every rank's figures were taken after ``when`` (wall clock)."""
        return self.taken is not None and self.taken > when


def _count(entry: dict[str, Any], key: str) -> int:
    value = entry.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"/v1/loads: {key} is {value!r}")
    return int(value)


def parse(answer: Any) -> EngineLoad:
    """``answer``: the decoded JSON of a ``/v1/loads`` response. Raises ValueError for any
    other shape (the caller then knows nothing: never a zero)."""
    if not isinstance(answer, dict) or not isinstance(answer.get("loads"), list):
        raise ValueError("/v1/loads: no loads list")
    requests = tokens = 0
    taken: float | None = math.inf
    for entry in answer["loads"]:
        if not isinstance(entry, dict):
            raise ValueError("/v1/loads: an entry is not an object")
        requests += _count(entry, "num_running_reqs") + _count(entry, "num_waiting_reqs")
        tokens += _count(entry, "num_used_tokens")
        stamp = entry.get("timestamp")
        if isinstance(stamp, int | float) and not isinstance(stamp, bool) and taken is not None:
            taken = min(taken, float(stamp))
        else:
            taken = None
    return EngineLoad(requests, tokens, None if taken == math.inf else taken)
