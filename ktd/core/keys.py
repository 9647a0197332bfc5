"""Who a request is (pure): the frontend's API keys as policies, found in constant time.

Why: a kt box is one machine a team shares. A key says who sent a request (its
``name``, in the usage ledger and the metrics, never the secret), which models it may
use (``models``: aliases or shell-style patterns), whether it may drive the dashboard
(``admin``), and its terms at the desk (``KeyTerms``: ``max_concurrent``,
``tokens_per_day``, ``priority``; ``ktd.core.admission`` applies them).

The plain ``frontend.api_keys`` list keeps working: each of its keys is a policy of
its own with no limits, every model, and the dashboard's actions (as before named
keys), named ``key-`` and the first 8 hex digits of its SHA-256 (stable across edits
of the list, and no use to anyone without the key).

Secrets are kept as SHA-256 digests only (``key_sha256`` lets the config file hold
no secret at all), and a token is compared with every digest, with
``hmac.compare_digest``, whichever matches: the time taken tells nothing of which
key is close.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ktd.core.admission import KeyTerms
from ktd.core.config import KeyEntry

__all__ = ["KeyRing", "Policy", "bearer", "plain_name"]


@dataclass(frozen=True)
class Policy:
    """One key's policy."""

    terms: KeyTerms
    models: tuple[str, ...] = ("*",)
    admin: bool = False

    @property
    def name(self) -> str:
        return self.terms.name

    def allows(self, model: str) -> bool:
        """May this key use ``model`` (an alias; Ollama's ``:latest`` already dropped)?"""
        return any(fnmatch.fnmatchcase(model, pattern) for pattern in self.models)

    def visible(self, aliases: Iterable[str]) -> list[str]:
        """The aliases this key's model lists show."""
        return [a for a in aliases if self.allows(a)]


def bearer(authorization: bytes | str | None) -> bytes | None:
    """The token of an ``Authorization: Bearer TOKEN`` header (scheme in any case), or
    None when the header is absent, another scheme, or has no token. Raw bytes: a UTF-8
    key survives as it was sent."""
    if not authorization:
        return None
    raw = authorization.encode("utf-8") if isinstance(authorization, str) else authorization
    scheme, _, token = raw.strip().partition(b" ")
    token = token.strip()
    return token if scheme.lower() == b"bearer" and token else None


def plain_name(secret: str) -> str:
    return "key-" + hashlib.sha256(secret.encode()).hexdigest()[:8]


def _digest(token: bytes) -> bytes:
    return hashlib.sha256(token).digest()


class KeyRing:
    """Every key of one frontend. Empty: no authentication (the 127.0.0.1 default)."""

    def __init__(self, plain: Sequence[str] = (), named: Sequence[KeyEntry] = ()) -> None:
        self._keys: list[tuple[bytes, Policy]] = []
        for secret in plain:
            policy = Policy(KeyTerms(plain_name(secret)), admin=True)
            self._keys.append((_digest(secret.encode()), policy))
        for k in named:
            if k.key_sha256 is not None:
                digest = bytes.fromhex(k.key_sha256)
            else:  # the config's check: exactly one of the two
                digest = _digest((k.key or "").encode())
            terms = KeyTerms(k.name, k.max_concurrent, k.tokens_per_day, k.priority)
            self._keys.append((digest, Policy(terms, tuple(k.models), k.admin)))

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    @property
    def policies(self) -> list[Policy]:
        return [p for _, p in self._keys]

    @property
    def digests(self) -> list[tuple[bytes, Policy]]:
        """Each key's SHA-256 digest and policy (what the dashboard's cookies derive from)."""
        return list(self._keys)

    def find(self, token: bytes) -> Policy | None:
        """The policy of the key ``token`` is, or None; every key compared."""
        given = _digest(token)
        found: Policy | None = None
        for digest, policy in self._keys:
            if hmac.compare_digest(given, digest):
                found = policy
        return found

    def unknown_models(self, aliases: Iterable[str]) -> list[str]:
        """``keys[].models`` entries that match no configured alias (warned of at start:
        models come and go, so it is no error)."""
        known = list(aliases)
        return sorted(
            {
                f"{p.name}: {pattern}"
                for p in self.policies
                for pattern in p.models
                if not any(fnmatch.fnmatchcase(a, pattern) for a in known)
            }
        )
