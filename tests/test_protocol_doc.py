"""docs/protocol.md stays true: every JSON example in it is a message of today's protocol
(decoded with ``ktd.protocol``'s types: requests by ``op``, replies by ``type``, events
by ``topic``), its hex is the msgpack of the JSON before it byte for byte, every request
and error code is described, and the frontend-only requests are the protocol's."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any

import msgspec

from ktd import protocol as p

DOC = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"


def blocks() -> list[tuple[str, str]]:
    """(language, text) of every fenced block, in order."""
    return re.findall(r"```(\w+)\n(.*?)```", DOC.read_text(), flags=re.S)


def test_every_json_example_decodes_with_today_s_types() -> None:
    decoded = {"request": 0, "reply": 0, "event": 0}
    for lang, text in blocks():
        if lang != "json":
            continue
        message: dict[str, Any] = json.loads(text)
        data = msgspec.msgpack.encode(message)
        if "op" in message:
            p.decode_request(data)
            decoded["request"] += 1
        elif "type" in message:
            p.decode_reply(data)
            decoded["reply"] += 1
        else:
            assert "topic" in message, text
            p.decode_event(data)
            decoded["event"] += 1
    assert decoded["request"] >= 15 and decoded["reply"] >= 10 and decoded["event"] >= 1


def test_the_hex_is_the_json_before_it_byte_for_byte() -> None:
    found = blocks()
    hexes = [i for i, (lang, _) in enumerate(found) if lang == "hex"]
    assert hexes
    for i in hexes:
        lang, text = found[i - 1]
        assert lang == "json"
        frame = bytes.fromhex(found[i][1])
        assert frame == msgspec.msgpack.encode(json.loads(text))
        assert isinstance(p.decode_request(frame), p.Request)


def test_every_request_and_error_code_is_described() -> None:
    text = DOC.read_text()
    for cls in typing.get_args(p.AnyRequest):
        assert f"**`{cls.__struct_config__.tag}`**" in text or (
            f"`{cls.__struct_config__.tag}`" in text
            and cls.__struct_config__.tag in p.FRONTEND_ONLY
        ), cls
    for code in p.ERROR_CODES:
        assert f"| `{code}` |" in text, code
    for feature in p.FEATURES:
        assert f"| `{feature}` |" in text, feature
    assert f"# ktd's control protocol ({p.PROTOCOL})" in text


def arrows() -> dict[str, set[str]]:
    """Each request's reply types as the page's arrows say (``**`op`** → `type`:``), the
    parenthesised words left out."""
    text = " ".join(DOC.read_text().split())
    out: dict[str, set[str]] = {}
    for ops, replies in re.findall(r"((?:\*\*`[a-z_]+`\*\*(?: \([^()]*\))?,? )+)→ ([^:*]*)", text):
        said = set(re.findall(r"`([a-z_]+)`", re.sub(r"\([^()]*\)", "", replies)))
        for op in re.findall(r"\*\*`([a-z_]+)`\*\*", ops):
            out.setdefault(op, set()).update(said)
    return out


def test_every_arrow_is_the_schema_s_pairing() -> None:
    """The page pairs each request with its replies as the protocol's table does
    (``p.REPLIES``, the schema's ``x-ktd-reply-types``): neither is written twice."""
    table = {
        req.__struct_config__.tag: {r.__struct_config__.tag for r in replies}
        for req, replies in p.REPLIES.items()
        if req.__struct_config__.tag not in p.FRONTEND_ONLY
    }
    assert arrows() == table
