"""The ``catalog`` request (issue 44): the model catalog against this machine and disk.

The daemon answers it because it holds what the answer is judged against: the config
(``catalog.files``, ``catalog.dir``) as last installed, and the machine as placement
reads it (``$KTD_SYSFS_ROOT``, ``$KTD_NVIDIA_SMI``). The files, the machine (nvidia-smi)
and the pulled models' headers are read in a worker thread; the report itself is
``ktd.catalog.report``'s, which gets the header reader injected (the catalog's room
imports nothing of the daemon).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio

from ktd import protocol as p
from ktd.catalog import pullrate
from ktd.catalog.flags import Sizes
from ktd.catalog.load import load
from ktd.catalog.report import Configured, UnknownName, build
from ktd.control.errors import ControlError
from ktd.core.config import BACKEND_KT, Config
from ktd.daemon.engine import weights

__all__ = ["CatalogView", "catalog_dir"]


def catalog_dir(config: Config, state_dir: Path) -> Path:
    """``catalog.dir`` (relative to config.json's directory), else ``<state_dir>/models``."""
    raw = config.catalog.dir
    if not raw:
        return state_dir / "models"
    path = Path(raw).expanduser()
    return path if path.is_absolute() else Path(config.path).parent / path


def _sizes(model_path: str) -> Sizes | None:
    split = weights.weight_split(model_path)
    return None if split is None else Sizes(split.dense, split.replicated, split.experts)


def report(config: Config, state_dir: Path, name: str | None) -> dict[str, Any]:
    """The report (blocking: reads files and runs nvidia-smi)."""
    cat = load(config.catalog.files, base=Path(config.path).parent)
    topo = weights.read_machine()
    base = str(catalog_dir(config, state_dir))
    try:
        mine = {
            alias: Configured(
                path=spec.path,
                kt_weight_path=spec.kt_weight_path,
                extra_args=spec.extra_args,
                numa=spec.numa,
                ctx=spec.ctx,
            )
            for alias, spec in config.models.items()
            if spec.backend == BACKEND_KT
        }
        out = build(cat, topo, base, name, sizes=_sizes, configured=mine)
    except UnknownName:
        known = sorted(e.name for e in cat.entries)
        raise ControlError(
            p.ErrorCode.UNKNOWN_MODEL,
            f"no catalog entry is called {name!r}; the catalog knows: {', '.join(known)}",
            {"known": known},
        ) from None
    rate = pullrate.read(state_dir / pullrate.FILE)
    out["pull_rate"] = None if rate is None else rate.to_dict()
    return out


class CatalogView:
    """Answers ``catalog`` requests with the config the daemon runs now."""

    def __init__(self, config: Callable[[], Config], state_dir: Path) -> None:
        self._config = config
        self._state_dir = state_dir

    async def reply(self, name: str | None) -> p.CatalogReply:
        work = partial(report, self._config(), self._state_dir, name)
        return p.CatalogReply(report=await trio.to_thread.run_sync(work))
