"""The frontend's options and per-app runtime objects (one place: the app, the request
flow and the metrics collectors all read them, and none of them imports another)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ktd import protocol as p
from ktd.control.aclient import Unreachable
from ktd.core.config import CatalogSection, FrontendSection
from ktd.frontend.auth import ApiKeys
from ktd.frontend.broker import ClaimBroker
from ktd.frontend.catalog import ResponseBook
from ktd.frontend.enginekeys import KeyCache
from ktd.frontend.metrics import Metrics
from ktd.frontend.notpulled import NotPulled
from ktd.frontend.upstream import UpstreamPool
from ktd.frontend.waits import Waits


@dataclass
class FrontendOptions:
    """Everything the app needs; main.py fills it from config.json and flags."""

    frontend: FrontendSection
    control_endpoint: str
    heartbeat_interval: float = 5.0  # daemon.lease_ttl / 3
    loading_interval: float = 2.0  # seconds between ``: loading`` comments
    stream_grace: float = 0.5  # how long a stream may wait before committing to 200
    client_id: str | None = None
    body_timeout: float = 60.0
    ui_sample_interval: float = 10.0  # the dashboard's traffic history: one point per this
    # How long the daemon may take to answer the frontend's report or ping before it is
    # counted as not answering (two in a row: down; a request needing it gets 503).
    ping_timeout: float = 2.0
    # The catalog (issue 44): a request for a catalog name not pulled says so, and pulls
    # it only when ``catalog.http_pulls`` allows; relative files are config.json's dir's.
    catalog: CatalogSection = field(default_factory=CatalogSection)
    config_dir: str = ""

    @property
    def body_bounds(self) -> tuple[int, float]:
        """A request body's bounds: bytes (``max_body_bytes``) and seconds to send it."""
        return self.frontend.max_body_bytes, self.body_timeout


class State:
    """Per-app runtime objects, created at startup inside trio."""

    def __init__(self, options: FrontendOptions) -> None:
        self.options = options
        self.keys = ApiKeys(options.frontend.api_keys, options.frontend.keys)
        self.metrics = Metrics()
        self.broker = ClaimBroker(
            options.control_endpoint,
            client_id=options.client_id,
            heartbeat_interval=options.heartbeat_interval,
            ping_timeout=options.ping_timeout,
            on_unreachable=self.metrics.daemon_errors.inc,
        )
        # The engines' own keys (issue 32): from each claim, else asked of the daemon.
        self.engine_keys = KeyCache(self._ask_engine_keys)
        self.broker.on_engine_key = self.engine_keys.learn
        self.upstream = UpstreamPool(
            read_timeout=options.frontend.read_timeout, keys=self.engine_keys
        )
        self.created = int(time.time())
        self.responses = ResponseBook()
        # Requests waiting for their engine (issue 46): what they are told, and ktd.
        modes = {k.name: k.progress for k in options.frontend.keys if k.progress}
        self.waits = Waits(self.broker, self.metrics, key_modes=modes)
        self.broker.oldest = self.waits.oldest
        self.not_pulled = NotPulled(options.catalog, options.config_dir, self.broker.request)

    async def _ask_engine_keys(self) -> dict[str, str]:
        reply = await self.broker.request(p.EngineKeys())
        if not isinstance(reply, p.EngineKeysReply):
            raise Unreachable(f"unexpected reply: {type(reply).__name__}")
        return reply.keys
