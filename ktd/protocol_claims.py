"""The control protocol's messages of ktd's frontend (``ktd.protocol`` re-exports them):
leases (acquire, release, heartbeat), the claim protocol (claim, sync, return, recalls;
``ktd.daemon.pool.claimtable`` has its race analysis), the engines' keys, and the usage ledger.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from ktd.protocol_base import (
    MAX_MODEL_NAME,
    MAX_REPORTED,
    Id,
    ModelName,
    Reply,
    Request,
    Seconds,
    Url,
)

# ---------------------------------------------------------------- requests


class Acquire(Request, tag="acquire"):
    """Ask for a lease on the engine serving ``model``, loading it if allowed.

    ``client`` names the frontend instance; its leases expire when it stops
    sending heartbeats, so a frontend killed mid-request cannot pin an engine.
    """

    model: ModelName
    client: Id
    autoload: bool = True
    timeout: Seconds | None = None


class Release(Request, tag="release"):
    lease: Id


class Heartbeat(Request, tag="heartbeat"):
    client: Id


# The claim protocol (the frontend's; ``ktd.daemon.pool.claimtable`` has the race analysis).
# A frontend holds one standing claim per engine it has traffic for and counts its
# requests itself; the daemon is off the per-request path.


class Claim(Request, tag="claim"):
    """A standing claim for ``client`` on the engine serving ``model``, loading it if allowed.

    Waits like ``acquire`` (load, swap, queue). Idempotent: a client that holds a
    claim on that engine gets the same claim back.
    """

    model: ModelName
    client: Id
    autoload: bool = True
    timeout: Seconds | None = None


class ClaimState(msgspec.Struct, kw_only=True):
    """One claim as the frontend holding it reports it."""

    claim: Id
    alias: ModelName
    url: Url = ""
    # On the wire still ``inflight``: nothing keeps a frontend and its daemon on one
    # release (``Ping`` only shows the daemon's version; unknown fields are dropped, not
    # refused), and a report under a name the daemon does not know would read as 0
    # requests in flight: busy engines taken for idle by status, eviction and reload.
    in_flight: Annotated[int, msgspec.Meta(ge=0)] = msgspec.field(default=0, name="inflight")
    idle: Seconds = 0.0  # since its last request ended (0 while one is in flight)
    routing: bool = True  # False once recalled: no new request goes there


# The usage ledger (``ktd.core.usage``): a day is UTC, ``YYYY-MM-DD``; a key is named by
# its name in the frontend's config ("" without keys), never by its secret.
Day = Annotated[str, msgspec.Meta(max_length=10, pattern=r"^\d{4}-\d{2}-\d{2}$")]
KeyName = Annotated[str, msgspec.Meta(max_length=MAX_MODEL_NAME)]
Amount = Annotated[int, msgspec.Meta(ge=0, le=2**53)]


class Sync(Request, tag="sync"):
    """The frontend's report of every claim it holds; also its heartbeat.

    With ``wait`` > 0 the daemon parks the reply until it has a recall for this
    client or ``wait`` passes (a long poll: recalls reach the frontend at once,
    without the daemon ever sending unasked). ``daemon``/``seen`` say which of
    the daemon's grants the report already reflects, so a claim granted while
    this report travelled is not taken for given back.
    """

    client: Id
    claims: Annotated[list[ClaimState], msgspec.Meta(max_length=MAX_REPORTED)] = []
    queued: Annotated[
        dict[ModelName, Annotated[int, msgspec.Meta(ge=0)]],
        msgspec.Meta(max_length=MAX_REPORTED),
    ] = {}  # alias -> requests waiting
    # alias -> seconds the oldest request waiting for it here has waited (issue 46)
    oldest: Annotated[dict[ModelName, Seconds], msgspec.Meta(max_length=MAX_REPORTED)] = {}
    wait: Seconds = 0.0
    daemon: Id = ""  # the daemon run whose grants ``seen`` counts
    seen: Annotated[int, msgspec.Meta(ge=0)] = 0  # highest grant number received from it
    # What this frontend counted since its last acknowledged report: batch ``usage_seq``,
    # resent unchanged until a reply acknowledges it, so the ledger adds it once.
    usage: Annotated[list[UsageCount], msgspec.Meta(max_length=MAX_REPORTED)] = []
    usage_seq: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Tokens its requests hold of each key's tokens_per_day (their reservations, and what
    # it counted that is not in this report's batch): the other frontends reserve around them.
    reserved: Annotated[dict[KeyName, Amount], msgspec.Meta(max_length=MAX_REPORTED)] = {}


class UsageCount(msgspec.Struct, kw_only=True):
    """One day's use of one model by one key: what the engines reported."""

    day: Day
    key: KeyName = ""
    model: ModelName
    requests: Amount = 0
    prompt: Amount = 0  # tokens
    completion: Amount = 0
    errors: Amount = 0
    # Requests whose client went away before the answer ended, charged what they received
    # (new in 1.1: absent from an older frontend's report and an older usage.json, so 0).
    cut: Amount = 0


class Return(Request, tag="return"):
    """The frontend gives a claim back (recalled, or no longer wanted)."""

    client: Id
    claim: Id


class Usage(Request, tag="usage"):
    """The usage ledger's rows from ``since`` ("": all it keeps), of one key or all."""

    since: Annotated[str, msgspec.Meta(max_length=10, pattern=r"^(\d{4}-\d{2}-\d{2})?$")] = ""
    key: KeyName | None = None


class EngineKeys(Request, tag="engine_keys"):
    """Every running engine's API key by its URL: what a client of the engines (the
    frontend) sends as ``Authorization: Bearer`` (issue 32). Only on this socket, whose
    directory only ktd's user (and ``daemon.group``) may enter; never in status."""


# ---------------------------------------------------------------- replies


class AcquireReply(Reply, tag="acquire"):
    lease: str
    alias: str
    url: str
    api_key: str | None = None  # the engine's own: send it as ``Authorization: Bearer``


class ClaimReply(Reply, tag="claim"):
    claim: str
    alias: str
    url: str
    daemon: str = ""  # this daemon run (a restarted daemon has another)
    grant: int = 0  # grant number within that run (``Sync.seen``)
    max_concurrent: int | None = None  # admission, applied by the frontend per claim
    max_queue: int | None = None
    api_key: str | None = None  # the engine's own: send it as ``Authorization: Bearer``


class Recall(msgspec.Struct, kw_only=True):
    """Give a claim back.

    ``drain`` (evict, swap, reload of a removed model, shutdown): route nothing new
    there from now on, give it back when its requests have ended. ``idle`` (TTL, a
    restart after a reload): keep routing, give it back the first time it has had
    no request for ``idle`` seconds; a claim busier than that stays, and the next
    report says so.
    """

    claim: str
    alias: str
    # "drain" or "idle"; a kind the frontend does not know is taken as "drain" (give it
    # back, route nothing new there): the safe reading of a newer daemon's recall.
    kind: Annotated[
        str,
        msgspec.Meta(
            description='"drain" or "idle"; an unknown kind is read as "drain"',
            examples=["drain", "idle"],
        ),
    ] = "drain"
    idle: float = 0.0
    reason: str = ""


class Limits(msgspec.Struct, kw_only=True, array_like=True):
    max_concurrent: int | None = None
    max_queue: int | None = None


class SyncReply(Reply, tag="sync"):
    daemon: str = ""
    recalls: list[Recall] = []
    dropped: list[str] = []  # claims this daemon does not hold for you: stop using them
    limits: dict[str, Limits] = {}  # per model with admission limits
    usage_seq: int = 0  # the last usage batch of yours the ledger holds
    day: str = ""  # today (UTC), the day ``spent`` counts
    spent: dict[str, int] = {}  # key name -> tokens today, every frontend's in the ledger
    held: dict[str, int] = {}  # key name -> tokens the other frontends' requests hold today


class EngineKeysReply(Reply, tag="engine_keys"):
    keys: dict[str, str] = {}  # engine URL -> its API key (engines without one left out)


class UsageReply(Reply, tag="usage"):
    rows: list[UsageCount] = []  # by day, key, model
