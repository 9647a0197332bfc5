"""The dashboard at ``GET /ui``: engines, the machine, loads and traffic, live.

``install`` builds it for the frontend's app (router.py hands it its routes);
docs/ui.md has the data flow and the access rules. The pure parts: ``access`` (keys,
cookie), ``series`` (the hour of traffic), ``view`` (what a page shows), ``wire`` (SSE
framing), ``page`` (the page from ``static/``); the I/O: ``hub`` (events in, streams
out) and ``asgi`` (HTTP).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ktd.frontend.ui.access import Access
from ktd.frontend.ui.asgi import Dashboard
from ktd.frontend.ui.hub import Hub
from ktd.frontend.ui.page import load

if TYPE_CHECKING:
    from quart_trio import QuartTrio

    from ktd.frontend.state import State

__all__ = ["close", "heartbeat_interval", "install"]

_KEY = "ktd.ui"


def heartbeat_interval(idle_timeout: float) -> float:
    """Seconds between a live stream's pings: well inside ``frontend.idle_timeout``, so a
    proxy or the page's own watchdog (three missed pings) never takes it for dead."""
    return min(max(idle_timeout / 2, 1.0), 15.0)


def install(app: QuartTrio, state: State) -> Dashboard:
    """The dashboard, its tasks started and stopped with the app; the router hands it
    its routes."""
    options = state.options
    hub = Hub(
        state.broker,
        state.upstream,
        state.metrics,
        sample_interval=options.ui_sample_interval,
    )
    access = Access(state.keys.ring, control=options.frontend.ui_control)
    dashboard = Dashboard(
        hub,
        access,
        load(),
        heartbeat=heartbeat_interval(options.frontend.idle_timeout),
        waits=state.waits,
    )
    app.extensions[_KEY] = hub

    @app.before_serving
    async def _start_dashboard() -> None:
        await app.nursery.start(hub.run)

    @app.after_serving
    async def _stop_dashboard() -> None:
        hub.close()

    return dashboard


def close(app: QuartTrio) -> None:
    """End every live stream now (at SIGTERM, before Hypercorn waits for requests)."""
    hub = app.extensions.get(_KEY)
    if isinstance(hub, Hub):
        hub.close()
