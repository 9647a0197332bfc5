"""What one pull fetches: the seam between the catalog (which decides it) and the pull
jobs (which fetch it). One job per ``(repo, revision)`` however many ask."""

from __future__ import annotations

import msgspec


class PullSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One hub repository at one pinned revision, the files of it wanted, and where they go.

    ``role`` says what the files are for the engine (``model``: ``--model-path``;
    ``kt-weights``: ``--kt-weight-path``), so a finished pull can be turned into a
    models.json entry without guessing.
    """

    role: str
    repo: str
    revision: str
    patterns: tuple[str, ...] = ()
    dest: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """The job's identity: one download per repo and revision."""
        return (self.repo, self.revision)
