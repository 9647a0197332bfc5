"""Which running processes a starting ktd takes over, and which it kills.

Ownership is proven by the engine marker ktd puts in every engine's environment
(``KTD_ENGINE=<instance>/<alias>@<ns>``, read from ``/proc/<pid>/environ``) of a
process running as ktd's own user (anyone can set a variable in their own
process), never by a pid, start time, cmdline or process group alone: those are in the
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

from ktd.core.command import DIGEST_MARK, ENGINE_MARK
from ktd.daemon.engine import proctree
from ktd.daemon.pool.statefile import EngineRecord


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
    gpus_env: str | None = None  # CUDA_VISIBLE_DEVICES as the engine got it
    cpus: tuple[int, ...] = ()  # its affinity, when ktd pinned it (NUMA nodes known)

    @property
    def port(self) -> int | None:
        return port_of(self.argv)

    @property
    def numa_nodes(self) -> tuple[int, ...]:
        return numa_nodes_of(self.argv)

    @property
    def gpus(self) -> tuple[int, ...]:
        """The GPU plan, back from the environment (ids only; anything else: unknown)."""
        if not self.gpus_env:
            return ()
        try:
            return tuple(int(g) for g in self.gpus_env.split(","))
        except ValueError:
            return ()


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


def numa_nodes_of(argv: Iterable[str]) -> tuple[int, ...]:
    """``--kt-numa-nodes 0 1`` (the placement flag ktd emits) → (0, 1)."""
    args = list(argv)
    if "--kt-numa-nodes" not in args:
        return ()
    out = []
    for arg in args[args.index("--kt-numa-nodes") + 1 :]:
        if not arg.isdigit():
            break
        out.append(int(arg))
    return tuple(out)


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
    for pid, value in proctree.marked(ENGINE_MARK).items():
        info = proctree.read_stat(pid)
        if pid == me or info is None or info.state in ("Z", "X") or not proctree.owned_by_us(pid):
            continue
        marked.append(Marked(pid, info.start, info.ppid, info.sid, value))
    out = {}
    for engine_id, group in group_engines(marked, instance).items():
        alias = alias_of(engine_id, instance)
        assert alias is not None
        main = main_process(group)
        argv = tuple(proctree.cmdline(main.pid))
        cpus: tuple[int, ...] = ()
        if numa_nodes_of(argv):
            try:
                cpus = tuple(sorted(os.sched_getaffinity(main.pid)))
            except OSError:
                pass
        out[engine_id] = Found(
            engine_id=engine_id,
            alias=alias,
            pid=main.pid,
            start=main.start,
            members=tuple(sorted((m.pid, m.start) for m in group)),
            argv=argv,
            digest=proctree.environ_get(main.pid, DIGEST_MARK) or "",
            gpus_env=proctree.environ_get(main.pid, "CUDA_VISIBLE_DEVICES"),
            cpus=cpus,
        )
    return out


def kill(f: Found) -> list[int]:
    """SIGKILL each member that still is that process AND still carries the marker."""
    killed = []
    for pid, start in f.members:
        if (
            proctree.alive((pid, start))
            and proctree.owned_by_us(pid)
            and proctree.environ_has(pid, ENGINE_MARK, f.engine_id)
        ):
            proctree.signal_ident((pid, start), signal.SIGKILL)
            killed.append(pid)
    return killed
