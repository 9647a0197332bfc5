"""Bearer API keys, compared in constant time and never logged or echoed."""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from ktd.frontend import errors


class ApiKeys:
    """The configured keys. No keys = no authentication (the 127.0.0.1 default)."""

    def __init__(self, keys: Sequence[str]) -> None:
        # Bytes, because hmac.compare_digest raises TypeError on non-ASCII str:
        # a client must not be able to turn a bad key into a 500.
        self._keys = [k.encode("utf-8") for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def check(self, authorization: bytes | str | None) -> None:
        """Raise ``ApiError`` 401 unless the header carries one of the keys.

        Takes the raw header bytes (ASGI gives bytes; a UTF-8 key survives as is).
        """
        if not self._keys:
            return
        if not authorization:
            raise errors.make("missing_api_key")
        raw = authorization.encode("utf-8") if isinstance(authorization, str) else authorization
        scheme, _, token = raw.strip().partition(b" ")
        given = token.strip()
        if scheme.lower() != b"bearer" or not given:
            raise errors.make("missing_api_key")
        ok = False
        for key in self._keys:
            # Compare against every key so timing does not tell which one is close.
            ok |= hmac.compare_digest(given, key)
        if not ok:
            raise errors.make("wrong_api_key")
