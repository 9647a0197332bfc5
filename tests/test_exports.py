"""The public names (``ktctl``, ``ktd.protocol``) and the layout's walls, guarded.

A name here is a promise to scripts and local tools: removing or renaming one must
fail a test, not a user. Adding one is fine: extend the sets.
"""

from __future__ import annotations

import subprocess
import sys
import typing
from pathlib import Path

import msgspec

import ktctl
from ktd import protocol as p
from ktd.core import states
from tests.fixtures.contract import STATUS_FIELDS

REPO = Path(__file__).resolve().parent.parent


def test_ktctl_exports() -> None:
    assert set(ktctl.__all__) == {
        "Client",
        "ConnectionLost",
        "DaemonUnreachable",
        "KtctlError",
        "KtdError",
        "ProtocolError",
        "Subscription",
    }
    for name in ktctl.__all__:
        assert getattr(ktctl, name) is not None


def _tags(union: object) -> set[str]:
    return {c.__struct_config__.tag for c in typing.get_args(union)}


def test_protocol_request_and_reply_tags() -> None:
    assert _tags(p.AnyRequest) == {
        "acquire",
        "catalog",
        "claim",
        "config_apply",
        "config_get",
        "config_history",
        "config_plan",
        "config_rollback",
        "doctor",
        "engine_keys",
        "engine_memory",
        "evict",
        "heartbeat",
        "keep_alive",
        "load",
        "logs",
        "machine",
        "models",
        "ping",
        "pull",
        "pull_cancel",
        "pulls",
        "release",
        "reload",
        "return",
        "schema",
        "shutdown",
        "sleep",
        "status",
        "sync",
        "usage",
        "wake",
    }
    assert _tags(p.AnyReply) == {
        "acquire",
        "catalog",
        "claim",
        "config",
        "config_apply",
        "config_history",
        "config_plan",
        "doctor",
        "engine_keys",
        "engine_memory",
        "error",
        "evict",
        "load",
        "logs",
        "machine",
        "models",
        "ok",
        "plan",
        "pong",
        "pull",
        "pulls",
        "schema",
        "status",
        "sync",
        "usage",
    }


def test_protocol_error_codes_are_stable() -> None:
    codes = {v for k, v in vars(p.ErrorCode).items() if k.isupper()}
    assert codes >= {
        "unknown_model",
        "not_kt",
        "load_failed",
        "busy",
        "timeout",
        "bad_request",
        "not_loaded",
        "config_error",
        "queue_full",
        "shutting_down",
        "internal",
        "no_sleep",
        "stale_config",
        "write_failed",
    }


def test_protocol_names_for_clients() -> None:
    for name in (
        "MAX_FRAME",
        "HARD_MAX_FRAME",
        "ErrorCode",
        "Request",
        "Reply",
        "Event",
        "EngineInfo",
        "ModelInfo",
        "EngineState",
        "encode",
        "decode_request",
        "decode_reply",
        "decode_event",
        "skim_id",
        "peek_id",
        "PROTOCOL",
        "ProtocolVersion",
        "FEATURES",
        "FRONTEND_ONLY",
        "ERROR_CODES",
    ):
        assert hasattr(p, name), name


def test_status_contract_fields() -> None:
    fields = {f.name for f in msgspec.structs.fields(p.EngineInfo)}
    assert fields >= STATUS_FIELDS


def test_protocol_engine_states_are_the_state_machine_s() -> None:
    assert set(p.EngineState) == set(states.ALL)


def _imported_by(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout
    return set(out.split())


def test_the_core_is_pure() -> None:
    """ktd.core imports no trio, socket library, HTTP client or subprocess machinery."""
    names = [f.stem for f in (REPO / "ktd" / "core").glob("*.py") if f.stem != "__init__"]
    mods = _imported_by("\n".join(f"import ktd.core.{n}" for n in sorted(names)))
    assert not mods & {"trio", "zmq", "httpx", "quart", "hypercorn", "h11", "subprocess"}
    assert not {m for m in mods if m.startswith(("ktd.daemon", "ktd.frontend", "ktd.control"))}


def test_ktctl_imports_no_trio_quart_or_httpx() -> None:
    mods = _imported_by("import ktctl, ktctl.cli")
    assert not mods & {"trio", "quart", "httpx", "hypercorn"}
