"""Control-API messages: the contract between ktd, ktctl, the frontend and local tools.

Pure data, msgspec only (ktctl imports this and must start fast). Requests and
replies are two tagged unions encoded as msgpack. Unknown *fields* are tolerated
on the wire so that a newer ktctl can talk to an older ktd and back; an unknown
*op* is a ``bad_request``.

The protocol is public (``docs/protocol.md``): ``PROTOCOL`` is its version, and
``docs/protocol/ktd-control-<major>.<minor>.json`` its JSON Schema, generated from
these types by ``python -m ktd.protocol_schema --write`` (a test fails when they
differ). Every change here follows the compatibility rules written there: a minor
adds optional fields, requests, replies to new requests and values of open
vocabularies (states, steps, error codes); anything else is a new major.

The messages live in one module per area, all re-exported here (``from ktd import
protocol as p`` is how every part of ktd and every client names them):
``protocol_base`` (framing, version, bounded types, error codes, ``Request``/``Reply``),
``protocol_engines`` (engines, status, the machine, events), ``protocol_claims`` (the
frontend's leases and claims, engine keys, usage), ``protocol_config`` (config changes,
history) and ``protocol_pulls`` (catalog, pulls). The tagged unions of every request
and reply, and the codecs, are here.

Framing: a client's DEALER sends one frame (the encoded request); the daemon's
ROUTER sees ``[identity, payload]`` and answers ``[identity, reply]``. An empty
delimiter frame, as REQ sockets add, is accepted and echoed.
"""

from __future__ import annotations

import msgspec

from ktd import foreign

# Part of this module's names for clients (tests/test_exports.py): the ids of frames the
# daemon will not decode, read in ktd.frameid.
from ktd.frameid import peek_id as peek_id
from ktd.frameid import skim_id as skim_id

# Every name of every area is this module's too (clients and ktd say ``p.Load``).
from ktd.protocol_base import *  # noqa: F403
from ktd.protocol_base import Error, Ok, Reply, Request
from ktd.protocol_claims import *  # noqa: F403
from ktd.protocol_claims import (
    Acquire,
    AcquireReply,
    Claim,
    ClaimReply,
    EngineKeys,
    EngineKeysReply,
    Heartbeat,
    Release,
    Return,
    Sync,
    SyncReply,
    Usage,
    UsageReply,
)
from ktd.protocol_config import *  # noqa: F403
from ktd.protocol_config import (
    ConfigApply,
    ConfigApplyReply,
    ConfigGet,
    ConfigHistory,
    ConfigHistoryReply,
    ConfigPlan,
    ConfigPlanReply,
    ConfigReply,
    ConfigRollback,
)
from ktd.protocol_engines import *  # noqa: F403
from ktd.protocol_engines import (
    Doctor,
    DoctorReply,
    EngineMemory,
    EngineMemoryReply,
    Event,
    Evict,
    EvictReply,
    KeepAlive,
    Load,
    LoadReply,
    Logs,
    LogsReply,
    Machine,
    MachineReply,
    Models,
    ModelsReply,
    Ping,
    PlanReply,
    Pong,
    Reload,
    Schema,
    SchemaReply,
    Shutdown,
    Sleep,
    Status,
    StatusReply,
    Wake,
)
from ktd.protocol_pulls import *  # noqa: F403
from ktd.protocol_pulls import Catalog, CatalogReply, Pull, PullCancel, PullReply, Pulls, PullsReply

AnyRequest = (
    Ping
    | Status
    | Models
    | Load
    | Evict
    | Sleep
    | Wake
    | Logs
    | Reload
    | Acquire
    | Release
    | Heartbeat
    | Claim
    | Sync
    | Return
    | Doctor
    | Shutdown
    | Machine
    | EngineKeys
    | KeepAlive
    | Usage
    | EngineMemory
    | Schema
    | ConfigGet
    | ConfigPlan
    | ConfigApply
    | ConfigHistory
    | ConfigRollback
    | Catalog
    | Pull
    | Pulls
    | PullCancel
)


AnyReply = (
    Pong
    | StatusReply
    | ModelsReply
    | LoadReply
    | PlanReply
    | EvictReply
    | LogsReply
    | AcquireReply
    | ClaimReply
    | SyncReply
    | DoctorReply
    | MachineReply
    | EngineKeysReply
    | UsageReply
    | EngineMemoryReply
    | SchemaReply
    | ConfigReply
    | ConfigPlanReply
    | ConfigApplyReply
    | ConfigHistoryReply
    | CatalogReply
    | PullReply
    | PullsReply
    | Ok
    | Error
)


#: The replies each request may get besides ``Error`` (which any request may get): the
#: one table every client pairs a request with its reply by (ktctl's ``_call``, the Node
#: client's ``replies.json``), emitted into the schema as ``x-ktd-reply-types``. Two
#: where a field picks the answer: ``load`` and ``config_rollback`` with ``dry_run``
#: answer with the plan (``PlanReply``, ``ConfigPlanReply``). A new request adds its
#: line here (a test fails on a request without one).
REPLIES: dict[type[Request], tuple[type[Reply], ...]] = {
    Ping: (Pong,),
    Status: (StatusReply,),
    Models: (ModelsReply,),
    Load: (LoadReply, PlanReply),
    Evict: (EvictReply,),
    Sleep: (LoadReply,),
    Wake: (LoadReply,),
    Logs: (LogsReply,),
    Reload: (Ok,),
    Acquire: (AcquireReply,),
    Release: (Ok,),
    Heartbeat: (Ok,),
    Claim: (ClaimReply,),
    Sync: (SyncReply,),
    Return: (Ok,),
    Doctor: (DoctorReply,),
    Shutdown: (Ok,),
    Machine: (MachineReply,),
    EngineKeys: (EngineKeysReply,),
    KeepAlive: (Ok,),
    Usage: (UsageReply,),
    EngineMemory: (EngineMemoryReply,),
    Schema: (SchemaReply,),
    ConfigGet: (ConfigReply,),
    ConfigPlan: (ConfigPlanReply,),
    ConfigApply: (ConfigApplyReply,),
    ConfigHistory: (ConfigHistoryReply,),
    ConfigRollback: (ConfigApplyReply, ConfigPlanReply),
    Catalog: (CatalogReply,),
    Pull: (PullReply,),
    Pulls: (PullsReply,),
    PullCancel: (PullsReply,),
}


def replies_to(req: Request) -> tuple[type[Reply], ...]:
    """The reply types ``req`` may be answered with, ``Error`` included."""
    return (*REPLIES.get(type(req), ()), Error)


_request_encoder = msgspec.msgpack.Encoder()
_request_decoder = msgspec.msgpack.Decoder(AnyRequest)
_reply_decoder = msgspec.msgpack.Decoder(AnyReply)
_event_decoder = msgspec.msgpack.Decoder(Event)


def encode(msg: msgspec.Struct) -> bytes:
    return _request_encoder.encode(msg)


# The three decoders of frames someone else wrote: each raises ``msgspec.DecodeError``
# (``ValidationError``, or ``foreign.Malformed``: nested deeper than ``foreign.MAX_DEPTH``)
# on anything malformed, and nothing else (ktd.foreign).


def decode_request(data: bytes) -> Request:
    """Raise ``msgspec.DecodeError``/``ValidationError`` on anything malformed."""
    return foreign.msgpack(data, _request_decoder)


def decode_reply(data: bytes) -> Reply:
    return foreign.msgpack(data, _reply_decoder)


def decode_event(data: bytes) -> Event:
    return foreign.msgpack(data, _event_decoder)
