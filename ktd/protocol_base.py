"""The control protocol's ground (``ktd.protocol`` re-exports it all): framing limits,
the version and its features, the bounded types every message uses, the error codes,
and the two tagged unions' bases (``Request`` tags ``op``, ``Reply`` tags ``type``) with
the replies any request may get (``Ok``, ``Error``).

Every message area builds on this one and on nothing else of the protocol's.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import msgspec

# Wire limits. MAX_FRAME is what the daemon decodes; bigger frames get a
# bad_request without being parsed. zmq's MAXMSGSIZE (HARD_MAX_FRAME) drops
# the peer's connection before the bytes reach Python at all.
MAX_FRAME = 1 << 20
HARD_MAX_FRAME = 16 << 20

# The events socket is an XPUB that greets every new subscription with this
# one-frame message (zmq's XPUB_WELCOME_MSG): a subscriber that has it knows its
# subscription is in place, so nothing published from then on is missed.
WELCOME = b"ktd.welcome"

# Seconds: finite and not negative (NaN, inf and -1 are bad_request, never a load
# started with a deadline nobody can reason about). 0 keeps its meaning: no limit.
MAX_SECONDS = 1e9
Seconds = Annotated[float, msgspec.Meta(ge=0, le=MAX_SECONDS)]
LineCount = Annotated[int, msgspec.Meta(ge=0, le=10_000_000)]


class ProtocolVersion(msgspec.Struct, frozen=True, kw_only=True):
    """The control protocol's version: a new ``minor`` only adds (fields, requests,
    values clients must tolerate); a new ``major`` may break (docs/protocol.md)."""

    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


#: The protocol this module speaks. 1.0 is the protocol as it was before it had a
#: number (``Pong`` without ``protocol``); 1.1 added the number, the feature names,
#: the ``schema`` request, and open vocabularies for states; 1.2 the model catalog,
#: the pull jobs and the trust rules.
PROTOCOL = ProtocolVersion(major=1, minor=2)
PROTOCOL_1_0 = ProtocolVersion(major=1, minor=0)

#: What this daemon can do, by name (``Pong.features``): a client tests for a feature
#: rather than for a version. A daemon of 1.0 sends none; it has ``FEATURES_1_0``.
FEATURES_1_0: tuple[str, ...] = (
    "claims",  # the frontend's claim protocol (claim, sync, return)
    "keep_alive",  # Ollama's keep_alive (keep_alive)
    "keys",  # engines' own API keys (engine_keys; acquire and claim replies carry them)
    "machine",  # the machine as placement sees it (machine)
    "sleep",  # sleep and wake, and the states sleeping, asleep, waking
    "usage",  # the usage ledger (usage)
    "welcome",  # the events socket greets each subscription with WELCOME
)
FEATURES: tuple[str, ...] = tuple(
    sorted({*FEATURES_1_0, "schema", "config", "trust", "catalog", "pulls"})
)

#: Requests only ktd's own frontend sends: a tool that sends them takes part in the
#: claim protocol (and its engines' keys) and can stall evictions or leak secrets.
FRONTEND_ONLY: frozenset[str] = frozenset({"claim", "sync", "return", "engine_keys"})


class EngineState(StrEnum):
    """An engine's state, as status, events and the state file carry it (its plain
    name, so scripts see ``"ready"``); ``ktd.core.states`` has the moves between them."""

    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    STOPPING = "stopping"
    FAILED = "failed"
    # Sleep (SGLang's memory API): drained and releasing its GPU memory; released
    # (its process lives, its experts stay in host RAM, no CPU or GPU of its own);
    # resuming, then checked with one generation before it is ready again.
    SLEEPING = "sleeping"
    ASLEEP = "asleep"
    WAKING = "waking"


# An engine's state as replies and events carry it: a string, not the enum, so that a
# client decodes a state a newer daemon adds (a new value is a minor change; a 1.0
# ktctl, which decoded the enum, failed on one). Known values: ``EngineState``.
OpenState = Annotated[
    str,
    msgspec.Meta(
        description="An engine state (EngineState). Clients must accept values they "
        "do not know: a minor version may add states.",
        examples=[s.value for s in EngineState],
    ),
]

# A model name (alias, or ``alias:adapter``): longer is nobody's model, and a client
# must not make the daemon, its logs, an ``unknown_model`` error or a stream's
# ``: loading`` comments carry megabytes. Every request field naming a model has this type.
MAX_MODEL_NAME = 256
ModelName = Annotated[str, msgspec.Meta(max_length=MAX_MODEL_NAME)]


def name_problem(name: str) -> str | None:
    """Why ``name`` can be no model's name, or None: the one rule for the config's
    aliases and the names clients send. Control and format characters (a U+202E
    turns ``ktctl`` and the dashboard's text around) are never part of one."""
    if len(name) > MAX_MODEL_NAME:
        return f"is {len(name)} characters long; no model name is longer than {MAX_MODEL_NAME}"
    if not name.isprintable():
        return "contains control or format characters"
    return None


# Ids a client makes up or echoes (its client id, a lease, a claim, a daemon run) and
# the URLs it reports: bounded, so a client cannot make the daemon keep megabytes per
# heartbeat (300 heartbeats with 900 KB ids once grew ktd by 430 MB).
MAX_ID = 256
Id = Annotated[str, msgspec.Meta(max_length=MAX_ID)]
Url = Annotated[str, msgspec.Meta(max_length=2048)]
# A frontend's report: no frontend holds more claims or waits on more models than this.
MAX_REPORTED = 10_000


class ErrorCode:
    """Stable error codes: scripts match on these strings, never rename one."""

    UNKNOWN_MODEL = "unknown_model"
    NOT_KT = "not_kt"
    LOAD_FAILED = "load_failed"
    BUSY = "busy"
    TIMEOUT = "timeout"
    BAD_REQUEST = "bad_request"
    NOT_LOADED = "not_loaded"
    CONFIG_ERROR = "config_error"
    QUEUE_FULL = "queue_full"  # admission: max_queue requests already wait (HTTP 429)
    SHUTTING_DOWN = "shutting_down"
    INTERNAL = "internal"
    # sleep/wake of a model whose config or installed SGLang cannot sleep (issue 28)
    NO_SLEEP = "no_sleep"
    # a config change made against a version of the files that is no longer there
    # (someone changed them since the client read them): read again, plan again (issue 39)
    STALE_CONFIG = "stale_config"
    # the config files (or the history) could not be written (a full disk, permissions):
    # nothing was changed, the running config is kept
    WRITE_FAILED = "write_failed"
    # the socket's uid may not do this (docs/security.md): a config change by a user
    # who is neither ktd's owner, root nor in daemon.admins, or a change only the owner
    # may make (a new interpreter, a loader variable, config.json itself)
    FORBIDDEN = "forbidden"


#: Every code of ``ErrorCode``, as the schema lists them.
ERROR_CODES: tuple[str, ...] = tuple(v for k, v in vars(ErrorCode).items() if k.isupper())


class Request(msgspec.Struct, tag_field="op", kw_only=True):
    id: int = 0


class Reply(msgspec.Struct, tag_field="type", kw_only=True):
    id: int = 0


class Ok(Reply, tag="ok"):
    message: str = ""


class Error(Reply, tag="error"):
    """A request that failed: ``code`` is stable (``ErrorCode``; scripts match on it, and
    a client must accept codes it does not know), ``message`` is for people,
    ``detail`` for programs."""

    code: Annotated[
        str,
        msgspec.Meta(
            description="An ErrorCode; clients must accept codes they do not know",
            examples=list(ERROR_CODES),
        ),
    ]
    message: str
    detail: dict[str, Any] = {}
