"""The catalog, as the pull jobs see it (issue 44): a name -> its ``PullSpec`` s, and the
fit check of a plan against this box.

``ktd.catalog.pulls.Puller`` takes both injected. Each resolution reads the catalog files
the running config names (``catalog.files``, relative to config.json's directory: a
reload's new files are read at the next pull, nothing is cached across them) and the
machine as placement reads it (``$KTD_SYSFS_ROOT``, ``$KTD_NVIDIA_SMI``): blocking work,
which the Puller runs through its offload. The fit check answers for the specs of the
last resolution of the name that asked for them: the numbers of why this box cannot run
the variant (``ktd.catalog.resolve``), so a pull that cannot run is refused before its
first byte, like one that cannot fit the disk.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ktd import protocol as p
from ktd.catalog.load import load
from ktd.catalog.plan import PullPlan
from ktd.catalog.resolve import Resolved, UnknownName, resolve
from ktd.catalog.spec import PullSpec
from ktd.control.errors import ControlError
from ktd.core.config import Config
from ktd.core.topology import Topology
from ktd.daemon.catalog.view import catalog_dir
from ktd.daemon.engine import weights

__all__ = ["CatalogPulls", "Resolution"]


@dataclass(frozen=True)
class Resolution:
    """A name resolved against the config and the machine of that moment."""

    resolved: Resolved
    config: Config
    topo: Topology


class CatalogPulls:
    def __init__(
        self,
        config: Callable[[], Config],
        state_dir: Path,
        *,
        machine: Callable[[], Topology] = weights.read_machine,
    ) -> None:
        self._config = config
        self._state_dir = state_dir
        self._machine = machine
        self._lock = threading.Lock()  # resolve and fit run on the offload's threads
        self._by_key: dict[tuple[str, str], Resolved] = {}

    def dir(self, config: Config | None = None) -> Path:
        return catalog_dir(config or self._config(), self._state_dir)

    def resolution(self, name: str) -> Resolution:
        """``name`` against the catalog the running config names (blocking)."""
        config = self._config()
        cat = load(config.catalog.files, base=Path(config.path).parent)
        topo = self._machine()
        try:
            r = resolve(cat, topo, self.dir(config), name)
        except UnknownName:
            known = sorted(e.name for e in cat.entries)
            raise ControlError(
                p.ErrorCode.UNKNOWN_MODEL,
                f"no catalog entry is called {name!r} (pull --repo ORG/NAME[@REV] for a repo "
                f"of the hub); the catalog knows: {', '.join(known)}",
                {"known": known},
            ) from None
        return Resolution(r, config, topo)

    def resolve(self, name: str) -> list[PullSpec]:
        """The Puller's resolver (blocking): ``name``'s specs, remembered for the fit check."""
        r = self.resolution(name).resolved
        with self._lock:
            for spec in r.specs:
                self._by_key[spec.key] = r
        return list(r.specs)

    def fit(self, plan: PullPlan) -> list[str]:
        """The Puller's fit check: why this box cannot run what ``plan`` fetches, with the
        numbers (nothing for a ``--repo`` pull: no entry says what it needs)."""
        with self._lock:
            r = self._by_key.get((plan.repo, plan.revision))
        return [] if r is None else list(r.problems)
