"""The control protocol's catalog and pull messages (protocol 1.2, issue 44; ``ktd.protocol``
re-exports them). The pull jobs' own types are ``ktd.pullwire``'s.
"""

from __future__ import annotations

from typing import Any

from ktd.protocol_base import ModelName, Reply, Request
from ktd.pullwire import PullInfo, PullName, PullPlanView, RepoRef

# ---------------------------------------------------------------- requests


class Catalog(Request, tag="catalog"):
    """The model catalog against this machine (issue 44, protocol 1.2): every entry, the
    variant that fits and why each other does not, what is on disk; with ``name`` (a name
    or an alias), that entry alone with its launch flags worked out (docs/catalog.md)."""

    name: ModelName | None = None


# Pulls (protocol 1.2, issue 44): ktd's download jobs; the types are ktd.pullwire's.
class Pull(Request, tag="pull"):
    """Start (or join) the pull of a catalog ``name``, or of ``repo`` (``ORG/NAME[@REV]``);
    ``dry_run``: only its plan; ``force``: fetch even if the plan refuses."""

    name: PullName = ""
    repo: RepoRef = ""
    dry_run: bool = False
    force: bool = False


class Pulls(Request, tag="pulls"):
    """The pull jobs, live and finished."""


class PullCancel(Request, tag="pull_cancel"):
    """End the pull jobs of ``name`` (or ``repo``); what was fetched stays."""

    name: PullName = ""
    repo: RepoRef = ""


# ---------------------------------------------------------------- replies


class CatalogReply(Reply, tag="catalog"):
    report: dict[str, Any]  # files, problems, box, dir, models (docs/catalog.md)


class PullReply(Reply, tag="pull"):
    """The jobs a ``pull`` started or joined (``joined``: already running for someone), or
    with ``dry_run`` their plans."""

    jobs: list[PullInfo] = []
    plans: list[PullPlanView] = []
    joined: bool = False


class PullsReply(Reply, tag="pulls"):
    jobs: list[PullInfo] = []
