"""Which running processes a starting ktd takes over, and which it kills.

Ownership is proven by the engine marker ktd puts in every engine's environment
(``KTD_ENGINE=<instance>/<alias>@<ns>``, read from ``/proc/<pid>/environ``),
never by a pid, start time, cmdline or process group alone: those are in the
state file, which a full disk can truncate and anyone with write access can
forge. The state file only says which of the marked processes was which engine
and how it was placed.

So an engine whose record is missing or unreadable is still recognised (by its
marker) and re-adopted, not killed; a record naming a process without the
marker is ignored and that process is never signalled. Only marked processes
ktd cannot serve (model no longer configured, a second engine for one alias,
no port to supervise it on) are killed, each one re-checked just before.

``decide`` is pure; ``scan`` and ``kill`` are the /proc edges.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ktd import proctree
from ktd.command import DIGEST_MARK, ENGINE_MARK
from ktd.statefile import EngineRecord


@dataclass(frozen=True)
class Marked:
    """One live process carrying an engine marker of this instance."""

    pid: int
    start: int
    ppid: int
    sid: int
    engine_id: str


@dataclass(frozen=True)
class Found:
    """One engine found running: its main process and every process carrying its marker."""

    engine_id: str
    alias: str
    pid: int
    start: int
    members: tuple[tuple[int, int], ...]
    argv: tuple[str, ...] = ()
    digest: str = ""

    @property
    def port(self) -> int | None:
        return port_of(self.argv)


@dataclass
class Decision:
    adopt: list[tuple[Found, EngineRecord | None]] = field(default_factory=list)
    kill: list[tuple[Found, str]] = field(default_factory=list)
    ignored: list[tuple[EngineRecord, str]] = field(default_factory=list)


def alias_of(engine_id: str, instance: str) -> str | None:
    """``<instance>/<alias>@<ns>`` → alias (None when it is another instance's)."""
    prefix = f"{instance}/"
    if not engine_id.startswith(prefix):
        return None
    alias, sep, _ = engine_id[len(prefix) :].rpartition("@")
    return alias if sep and alias else None


def port_of(argv: Iterable[str]) -> int | None:
    args = list(argv)
    for i, arg in enumerate(args):
        value = None
        if arg == "--port" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--port="):
            value = arg.split("=", 1)[1]
        if value is not None:
            try:
                port = int(value)
            except ValueError:
                return None
            return port if 0 < port < 65536 else None
    return None


def group_engines(marked: Iterable[Marked], instance: str) -> dict[str, list[Marked]]:
    out: dict[str, list[Marked]] = {}
    for m in marked:
        if alias_of(m.engine_id, instance) is not None:
            out.setdefault(m.engine_id, []).append(m)
    return out


def main_process(group: list[Marked]) -> Marked:
    """The engine's main process: a session leader (ktd spawns engines with setsid) whose
    parent is not of the same engine, the earliest started of those."""
    pids = {m.pid for m in group}
    leaders = [m for m in group if m.ppid not in pids and m.sid == m.pid]
    tops = leaders or [m for m in group if m.ppid not in pids] or group
    return min(tops, key=lambda m: (m.start, m.pid))


def decide(
    records: Iterable[EngineRecord],
    found: Mapping[str, Found],
    configured: set[str],
) -> Decision:
    """Records match found engines by engine id *and* main process (pid + start); the
    rest of the found engines are recovered when they can be served, else killed."""
    d = Decision()
    taken: set[str] = set()
    used: set[str] = set()
    for rec in records:
        f = found.get(rec.engine_id)
        if f is None:
            d.ignored.append((rec, "no live process carries its engine marker"))
            continue
        if (f.pid, f.start) != (rec.pid, rec.start):
            d.ignored.append((rec, "its main process is not the recorded one"))
            continue
        if rec.alias != f.alias:
            d.ignored.append((rec, "its alias does not match the engine marker"))
            continue
        if f.alias not in configured or f.alias in taken or f.engine_id in used:
            continue  # handled below with the unrecorded ones
        d.adopt.append((f, rec))
        taken.add(f.alias)
        used.add(f.engine_id)
    # Newest first: of two unrecorded engines for one alias, the later start is the one
    # a daemon launched last.
    for f in sorted(found.values(), key=lambda f: (-f.start, f.engine_id)):
        if f.engine_id in used:
            continue
        if f.alias not in configured:
            d.kill.append((f, f"{f.alias!r} is no longer configured"))
        elif f.alias in taken:
            d.kill.append((f, f"a second engine for {f.alias!r}"))
        elif f.port is None:
            d.kill.append((f, "no --port in its command line: cannot supervise it"))
        else:
            d.adopt.append((f, None))
            taken.add(f.alias)
        used.add(f.engine_id)
    return d


# ---------------------------------------------------------------- /proc edges


def scan(instance: str) -> dict[str, Found]:
    """Every engine of this instance that is running now, by engine id."""
    me = os.getpid()
    marked = []
    for info in proctree.all_procs().values():
        if info.pid == me or info.state in ("Z", "X"):
            continue
        value = proctree.environ_get(info.pid, ENGINE_MARK)
        if value is None:
            continue
        marked.append(Marked(info.pid, info.start, info.ppid, info.sid, value))
    out = {}
    for engine_id, group in group_engines(marked, instance).items():
        alias = alias_of(engine_id, instance)
        assert alias is not None
        main = main_process(group)
        out[engine_id] = Found(
            engine_id=engine_id,
            alias=alias,
            pid=main.pid,
            start=main.start,
            members=tuple(sorted((m.pid, m.start) for m in group)),
            argv=tuple(proctree.cmdline(main.pid)),
            digest=proctree.environ_get(main.pid, DIGEST_MARK) or "",
        )
    return out


def kill(f: Found) -> list[int]:
    """SIGKILL each member that still is that process AND still carries the marker."""
    killed = []
    for pid, start in f.members:
        if proctree.alive((pid, start)) and proctree.environ_has(pid, ENGINE_MARK, f.engine_id):
            proctree.signal_ident((pid, start), signal.SIGKILL)
            killed.append(pid)
    return killed
