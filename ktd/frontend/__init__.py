"""The OpenAI-compatible HTTP frontend (``ktd frontend``).

A separate process from the daemon: it never spawns engines, it asks the daemon
for a lease on one (loading it on demand) and proxies bytes to it. Restarting it
does not touch engines. ``create_app`` is the Quart-Trio app factory;
``main`` runs it under Hypercorn.
"""

from __future__ import annotations

__all__ = ["FrontendOptions", "create_app"]

from ktd.frontend.app import create_app
from ktd.frontend.state import FrontendOptions
