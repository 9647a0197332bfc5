"""The catalog as the pull jobs' resolver: a catalog name -> the ``PullSpec`` s of the
variant this box runs (``ktd.catalog.choose`` + ``ktd.catalog.wanted``).

Minimal wiring for issue 44 item 5 (``ktctl load NAME --pull``, a dry run's size): the
jobs put each repository where their own layout says (``ktd.catalog.layout``), so the
specs carry no ``dest``. It reads the catalog files as the ``catalog`` request does, and
the machine as placement knows it (read once, kept: no nvidia-smi per ask); it is used
only when the daemon is not given a resolver of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from msgspec.structs import replace

from ktd import protocol as p
from ktd.catalog.choose import choose
from ktd.catalog.load import load
from ktd.catalog.pulls import Resolver
from ktd.catalog.spec import PullSpec
from ktd.catalog.wanted import pull_specs
from ktd.control.errors import ControlError
from ktd.core.config import Config
from ktd.core.topology import Topology
from ktd.daemon import weights

__all__ = ["catalog_resolver"]


def catalog_resolver(
    config: Callable[[], Config], machine: Callable[[], Topology] = weights.read_machine
) -> Resolver:
    """``machine``: the box as placement knows it (the pool's, read once and kept)."""

    def resolve(name: str) -> list[PullSpec]:
        cfg = config()
        cat = load(cfg.catalog.files, base=Path(cfg.path).parent)
        entry = cat.find(name)
        if entry is None:
            known = ", ".join(sorted(e.name for e in cat.entries))
            raise ControlError(
                p.ErrorCode.UNKNOWN_MODEL,
                f"no catalog entry {name!r}; the catalog knows: {known} "
                "(or pull --repo ORG/NAME[@REV])",
            )
        choice = choose(entry, machine())
        chosen = choice.chosen
        if chosen is None:
            raise ControlError(p.ErrorCode.BAD_REQUEST, f"{entry.name}: {choice.why()}")
        return [replace(s, dest="") for s in pull_specs(entry, chosen.variant, "")]

    return resolve
