"""The status routes of waiting requests (issue 46), answered by Quart (app.py).

* ``GET /v1/ktd/requests``: the requests waiting at this frontend that the caller's key
  may see: its own; every one for an admin key, or on a frontend without keys.
* ``GET /v1/ktd/requests/{id}``: one of them by the ``X-Request-Id`` it was sent with:
  its phase, place in its model's line and ETA (``ktd.core.waiting``), or a 404 once it
  is not waiting (its answer began, it ended) or is another key's.

A request is listed from the moment it has to wait until its answer's first byte: a
request that is not streamed stays listed, in phase ``prefill``, while the engine
generates its whole answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from quart import Response, request

from ktd.frontend import errors

if TYPE_CHECKING:
    from ktd.frontend.state import State

_JSON = "application/json"


def _seen_as(state: State) -> str | None:
    """Whose requests the caller may see: a key's name, or None for all (an admin key,
    or no keys at all). A missing or bad key raises the 401."""
    policy = state.keys.of(request.scope)
    if policy is None or policy.admin:
        return None
    return policy.name


def views(state: State) -> dict[str, Callable[..., Any]]:
    async def waiting_requests() -> Response:
        listed = state.waits.listing(key=_seen_as(state))
        body = json.dumps({"object": "list", "data": listed})
        return Response(body, status=200, content_type=_JSON)

    async def waiting_request(request_id: str) -> Response:
        found = state.waits.find(request_id, key=_seen_as(state))
        if found is None:
            raise errors.make("request_not_waiting", request_id=request_id)
        return Response(json.dumps(found), status=200, content_type=_JSON)

    return {"waiting_requests": waiting_requests, "waiting_request": waiting_request}
