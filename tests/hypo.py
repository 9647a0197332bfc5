"""Hypothesis profiles: the main suite runs every property and state machine at its full
budget; a developer may choose less for a quick loop, and only by saying so.

* ``ci`` (loaded by default, and what CI and the README's command run): each test's own
  ``max_examples`` and ``stateful_step_count``, exactly as written in the test.
* ``dev`` (``--hypothesis-profile=dev``): a tenth of each test's examples (at least
  one), the same steps per example. For the edit loop only; never a reason to commit a
  smaller budget.

A test states its budget with ``budget(...)`` instead of ``settings(...)``, so the
chosen profile can scale it: an explicit ``settings(max_examples=N)`` would ignore
the profile (hypothesis lets a test's own settings win).
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings

#: Hypothesis's own default for ``max_examples``: the ``ci`` profile keeps it, so a
#: test without a budget of its own runs as it always did.
BASE_EXAMPLES = 100

settings.register_profile("ci", max_examples=BASE_EXAMPLES)
settings.register_profile("dev", max_examples=BASE_EXAMPLES // 10)
# Before collection; hypothesis's pytest plugin loads ``--hypothesis-profile`` after this.
settings.load_profile("ci")


def scale() -> float:
    """The loaded profile's share of each test's examples (1.0 under ``ci``)."""
    loaded = settings.default
    assert loaded is not None, "a profile is loaded at import"
    return float(loaded.max_examples) / BASE_EXAMPLES


def budget(max_examples: int, **kw: Any) -> settings:
    """``settings(max_examples=..., **kw)``, the examples scaled by the loaded profile."""
    return settings(max_examples=max(1, round(max_examples * scale())), **kw)
