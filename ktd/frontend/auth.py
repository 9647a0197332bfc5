"""Bearer API keys: which key a request carries, as its policy (``ktd.core.keys``).

The secret is never logged or echoed; a token is compared with every key's digest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ktd.core.config import KeyEntry
from ktd.core.keys import KeyRing, Policy, bearer
from ktd.frontend import errors
from ktd.frontend.inbound import header


class ApiKeys:
    """The configured keys (``frontend.api_keys`` and ``frontend.keys``). No keys = no
    authentication (the 127.0.0.1 default)."""

    def __init__(self, plain: Sequence[str], named: Sequence[KeyEntry] = ()) -> None:
        self.ring = KeyRing(plain, named)

    @property
    def enabled(self) -> bool:
        return self.ring.enabled

    def of(self, scope: Mapping[str, Any]) -> Policy | None:
        """The policy of the key an ASGI request shows (``check`` of its Authorization):
        the one key check of every route but the dashboard's (which takes a cookie too)."""
        return self.check(header(scope, b"authorization"))

    def check(self, authorization: bytes | str | None) -> Policy | None:
        """The policy of the key the header carries (None: no keys configured); raise
        ``ApiError`` 401 when it carries none or an unknown one.

        Takes the raw header bytes (ASGI gives bytes; a UTF-8 key survives as is).
        """
        if not self.ring.enabled:
            return None
        given = bearer(authorization)
        if given is None:
            raise errors.make("missing_api_key")
        policy = self.ring.find(given)
        if policy is None:
            raise errors.make("wrong_api_key")
        return policy
