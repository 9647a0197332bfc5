"""``ktctl sleep --verify ALIAS``: a sleep and a wake, measured: the check a GPU box runs.

Apart from ``ktctl sleep`` itself (``ktctl.cli``) because it is another kind of command:
not one wait on the daemon but a round trip of four, the engine's memory read at each
step (GPU per process, host per NUMA node, SGLang's own figures), and an exit code that
says whether the same process came back awake.
"""

from __future__ import annotations

import argparse
import json
import time

import msgspec

from ktctl import render
from ktctl.client import Client
from ktd.core import states as S

__all__ = ["run"]


def run(client: Client, args: argparse.Namespace) -> int:
    """``ktctl sleep --verify ALIAS``: the model loaded (or woken) first, then put to
    sleep and woken once, its memory measured awake, asleep and awake again (GPU per
    process, host per NUMA node, SGLang's own figures): the check a GPU box runs."""
    alias: str = args.alias
    [engine] = client.status(alias)
    if engine.state == S.ASLEEP:
        client.wake(alias, timeout=args.timeout)
    elif engine.state != S.READY:
        client.load(alias)
    snaps = [client.engine_memory(alias)]
    started = time.monotonic()
    client.sleep(alias, timeout=args.timeout)
    slept = time.monotonic() - started
    snaps.append(client.engine_memory(alias))
    started = time.monotonic()
    client.wake(alias, timeout=args.timeout)
    woke = time.monotonic() - started
    snaps.append(client.engine_memory(alias))
    if getattr(args, "json", False):
        doc = {
            "alias": alias,
            "sleep_seconds": slept,
            "wake_seconds": woke,
            "awake": msgspec.to_builtins(snaps[0]),
            "asleep": msgspec.to_builtins(snaps[1]),
            "awake_again": msgspec.to_builtins(snaps[2]),
        }
        print(json.dumps(doc, indent=2))
    else:
        print("\n".join(render.verify_lines(snaps, slept, woke)))
    return 0 if snaps[2].pid == snaps[0].pid else 1
