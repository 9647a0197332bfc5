"""The one error of the control API: a stable ``code`` (``ktd.protocol.ErrorCode``), a
``message`` for people, and a ``detail`` map for programs.

The daemon raises it to answer a request with an error reply; the frontend's async
client and ktctl raise it (ktctl as its subclass ``KtdError``) when a reply is one.
Pure: importing it costs msgspec and ``ktd.protocol`` only (ktctl relies on that).
"""

from __future__ import annotations

from typing import Any, Self

from ktd import protocol as p

__all__ = ["ControlError"]


class ControlError(Exception):
    def __init__(self, code: str, message: str, detail: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.detail: dict[str, Any] = dict(detail or {})

    @classmethod
    def from_reply(cls, reply: p.Error) -> Self:
        return cls(reply.code, reply.message, reply.detail)

    def to_reply(self) -> p.Error:
        return p.Error(code=self.code, message=self.message, detail=self.detail)
