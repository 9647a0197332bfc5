"""Ollama's answers made by the frontend (``ktd.frontend.ollama``): error shapes, ``/api/ps``."""

from __future__ import annotations

import json

import msgspec

from ktd import ollama_shapes
from ktd import protocol as p
from ktd.frontend import errors
from ktd.frontend.ollama import ps_entry, ps_rows


def test_ollama_error_shapes_and_ps_rows() -> None:
    err = errors.make(
        "queue_full", model="m1", message="1 request(s) already waiting (max_queue 1)"
    )
    assert json.loads(err.ollama_body()) == {"error": err.message}
    assert err.ndjson().endswith(b"}\n") and err.ndjson().count(b"\n") == 1
    est = {"host_bytes": 100, "gpu_bytes": 30, "gpu_weights_bytes": 20, "ctx": 512}
    now = 1_800_000_000.0
    ready = p.EngineInfo(alias="m1", state="ready", ttl=0.0)
    row = ps_entry(ready, "/models/m1", est, now)
    assert (row["name"], row["size"], row["size_vram"], row["context_length"]) == (
        "m1:latest", 130, 30, 512,
    )  # fmt: skip
    assert row["expires_at"].startswith("2") and int(row["expires_at"][:4]) > 2300  # Forever
    timed = ps_entry(msgspec.structs.replace(ready, ttl=60.0, expires_at=now + 42), "", est, now)
    assert timed["expires_at"] == ollama_shapes.timestamp(now + 42)
    busy = ps_entry(msgspec.structs.replace(ready, ttl=60.0), "", None, now)
    assert busy["expires_at"] == ollama_shapes.timestamp(now + 60) and busy["size"] == 0
    assert row["digest"] == ps_entry(ready, "/models/m1", None, now)["digest"] != busy["digest"]


def test_ps_lists_an_asleep_engine_without_vram_until_its_sleep_ttl() -> None:
    """Asleep: loaded in host RAM, none in VRAM; ``expires_at`` is when ``sleep_ttl``
    stops it. Ready ones are unchanged; engines on their way are not listed."""
    est = {"host_bytes": 100, "gpu_bytes": 30, "ctx": 512}
    now = 1_800_000_000.0
    asleep = p.EngineInfo(
        alias="m1", state="asleep", ttl=60.0, expires_at=now + 5, asleep_since=now - 100
    )
    forever = ps_entry(asleep, "/models/m1", est, now)
    assert (forever["size"], forever["size_vram"], forever["context_length"]) == (130, 0, 512)
    assert int(forever["expires_at"][:4]) > 2300  # no sleep_ttl: Forever, not the idle TTL
    timed = ps_entry(msgspec.structs.replace(asleep, sleep_ttl=600.0), "", est, now)
    assert timed["expires_at"] == ollama_shapes.timestamp(now + 500)
    unknown = msgspec.structs.replace(asleep, sleep_ttl=600.0, asleep_since=None)
    assert ps_entry(unknown, "", est, now)["expires_at"] == ollama_shapes.timestamp(now + 600)
    engines = [
        p.EngineInfo(alias="r", state="ready", ttl=60.0, expires_at=now + 30),
        msgspec.structs.replace(asleep, alias="a", sleep_ttl=600.0),
        p.EngineInfo(alias="w", state="waking"),
        p.EngineInfo(alias="s", state="sleeping"),
        p.EngineInfo(alias="l", state="starting"),
    ]
    rows = ps_rows(engines, {}, {"r": est, "a": est}, now)
    assert [(r["name"], r["size_vram"]) for r in rows] == [("a:latest", 0), ("r:latest", 30)]
