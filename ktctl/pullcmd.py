"""``ktctl pull`` and ``ktctl pulls``: the daemon's pull jobs (issue 44).

``ktctl pull NAME`` (or ``--repo ORG/NAME[@REV]``) asks ktd for the job (one per repo and
revision however many ask) and follows it on the events socket: a progress bar on a
terminal (file, bytes, rate, ETA), JSON lines with ``--json``, a line per change
otherwise. The job is ktd's, not this process's: Ctrl-C asks whether to leave it running
or cancel it. ``--dry-run`` prints the plan (files, bytes, free space) and fetches
nothing; ``--cancel`` ends the job; ``ktctl pulls`` lists them.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
from typing import Any

import msgspec

from ktctl import render
from ktctl.argtable import Subcommand, arg
from ktctl.client import Client
from ktd import protocol as p
from ktd.pullwire import PullInfo, PullPlanView

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130
TERMINAL = frozenset({"done", "failed", "cancelled"})
#: Seconds without an event after which the jobs are read afresh (a missed event).
POLL = 2.0
#: Seconds a finished pull of a catalog name waits for ktd's word on its models.json
#: entry (the desk plans it: the new model's flags are checked by the engine's probe).
ENTRY_WAIT = 120.0


def _out(text: str) -> None:
    print(text, flush=True)


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def duration(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "--:--"
    s = int(s)
    return (
        f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
        if s >= 3600
        else f"{s // 60:02d}:{s % 60:02d}"
    )


def plan_text(plan: PullPlanView) -> str:
    lines = [f"pull {plan.repo}@{plan.revision} (commit {plan.commit[:12]}) into {plan.dest}"]
    width = max((len(f.name) for f in plan.files), default=4)
    for f in plan.files:
        here = "here" if f.present == f.size else (f"{size(f.present)} here" if f.present else "")
        lines.append(f"  {f.name:<{width}}  {size(f.size):>10}  {here}")
    lines.append(
        f"  to fetch {size(plan.to_fetch)} of {size(plan.total)} ({size(plan.present)} here); "
        f"free {size(plan.free)} (margin {size(plan.margin)})"
    )
    lines += [f"  refused: {problem}" for problem in plan.problems]
    if not plan.problems:
        lines.append("  fits: yes")
    return "\n".join(lines)


def job_line(job: PullInfo) -> str:
    name = ",".join(job.names) or job.key
    pct = f"{100 * job.done / job.total:.0f}%" if job.total else "--"
    text = f"{name} ({job.key}) {job.state}"
    if job.state == "running":
        text += f" {job.phase} {pct} {size(job.done)}/{size(job.total)}"
        text += f" {size(job.rate)}/s ETA {duration(job.eta)}"
    elif job.state == "done":
        text += f" {size(job.total)} in {job.dest}"
    if job.kind and job.state != "done":
        text += f": {job.kind}: {job.message}"
        if job.kind == "refused":
            text += " (--force fetches it anyway)"
    if job.restarts:
        text += f" (restarted {job.restarts}x)"
    return text


def bar(job: PullInfo, width: int) -> str:
    """One terminal line: name, bar, percent, bytes, rate, ETA, file."""
    frac = job.done / job.total if job.total else 0.0
    head = f"{(job.names or [job.key])[0]} "
    tail = (
        f" {100 * frac:3.0f}% {size(job.done)}/{size(job.total)} "
        f"{size(job.rate)}/s ETA {duration(job.eta)} {job.file}"
    )
    room = max(10, min(40, width - len(head) - len(tail) - 2))
    filled = int(room * frac)
    return (head + "[" + "#" * filled + "-" * (room - filled) + "]" + tail)[: width - 1]


def cmd_pulls(client: Client, args: argparse.Namespace) -> int:
    reply = client.request(p.Pulls())
    assert isinstance(reply, p.PullsReply)
    if getattr(args, "json", False):
        _out(render.dumps({"pulls": reply.jobs}))
    else:
        _out("\n".join(job_line(j) for j in reply.jobs) or "no pulls")
    return EXIT_OK


def cmd_pull(client: Client, args: argparse.Namespace) -> int:
    name, repo = args.name or "", args.repo or ""
    if bool(name) == bool(repo):
        from ktctl.connection import UsageError

        raise UsageError("pull needs a NAME or --repo ORG/NAME[@REV] (one of them)")
    as_json = bool(getattr(args, "json", False))
    if args.cancel:
        reply = client.request(p.PullCancel(name=name, repo=repo))
        assert isinstance(reply, p.PullsReply)
        _out(
            render.dumps({"pulls": reply.jobs})
            if as_json
            else "\n".join(job_line(j) for j in reply.jobs)
        )
        return EXIT_OK
    if args.dry_run:
        reply = client.request(p.Pull(name=name, repo=repo, dry_run=True), timeout=math.inf)
        assert isinstance(reply, p.PullReply)
        flags = _flags_of(client, name) if name else None
        if as_json:
            _out(render.dumps({"plans": reply.plans, **({"catalog": flags} if flags else {})}))
        else:
            _out("\n\n".join(plan_text(x) for x in reply.plans))
            if flags:
                _out("\n" + flags_text(flags))
        return EXIT_FAILED if any(x.problems for x in reply.plans) else EXIT_OK
    topics = ["pull.", f"models.{name}"] if name else ["pull."]
    with client.subscribe(topics) as sub:
        reply = client.request(p.Pull(name=name, repo=repo, force=args.force))
        assert isinstance(reply, p.PullReply)
        if args.detach:
            _out(
                render.dumps({"pulls": reply.jobs})
                if as_json
                else "\n".join(job_line(j) for j in reply.jobs)
            )
            return EXIT_OK
        if reply.joined and not as_json:
            _out("joining the pull already running")
        try:
            jobs = follow(client, sub, {j.key: j for j in reply.jobs}, as_json)
        except KeyboardInterrupt:
            return interrupted(client, name, repo)
        failed = [j for j in jobs.values() if j.state != "done"]
        if name and not failed:
            entry_word(sub, name, as_json)
    return EXIT_FAILED if failed else EXIT_OK


#: ``ktctl pull`` and ``ktctl pulls``, rows of the CLI's table (``ktctl.argtable``).
COMMANDS = (
    Subcommand(
        "pull",
        "fetch a model as a ktd job (resumable; the plan first, refused if it cannot fit)",
        cmd_pull,
        (
            arg("name", nargs="?", metavar="NAME", help="a catalog name"),
            arg("--repo", metavar="ORG/NAME[@REV]", help="a hub repo instead of a catalog name"),
            arg("--dry-run", action="store_true", help="print the plan; fetch nothing"),
            arg("--force", action="store_true", help="fetch even if the plan refuses"),
            arg("--cancel", action="store_true", help="end the pull (what was fetched stays)"),
            arg("--detach", action="store_true", help="start it and return; do not follow"),
        ),
    ),
    Subcommand("pulls", "list ktd's pull jobs (state, bytes, rate, ETA)", cmd_pulls),
)


def entry_word(sub: Any, name: str, as_json: bool, wait: float = ENTRY_WAIT) -> None:
    """ktd's word on the models.json entry of the pulled name (``models.<name>``): what
    the config desk did (added, merged, unchanged, refused), its plan and notes."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            ev = sub.get(timeout=0.5)
        except KeyboardInterrupt:  # the pull is done: nothing to leave running or cancel
            break
        if ev is None or ev.topic != f"models.{name}":
            continue
        if as_json:
            _out(
                render.dumps(
                    {
                        "models_entry": {
                            "state": ev.state,
                            "alias": ev.alias,
                            "summary": ev.reason,
                            "lines": ev.lines,
                        }
                    }
                )
            )
        else:
            _out(ev.reason or "")
            for line in ev.lines:
                _out(f"  {line}")
            if ev.state != "refused":
                _out(f"`ktctl load {ev.alias}` starts it")
        return
    print(
        f"ktctl: no word from ktd on {name}'s models.json entry yet "
        "(`ktctl config history` shows it when it is written)",
        file=sys.stderr,
        flush=True,
    )


def _flags_of(client: Client, name: str) -> dict[str, Any] | None:
    """The catalog's view of ``name`` for this box: the variant and the flags, each with
    its origin, and the ``--kt-num-gpu-experts`` arithmetic."""
    reply = client.request(p.Catalog(name=name))
    assert isinstance(reply, p.CatalogReply)
    models = reply.report.get("models") or []
    if not models:
        return None
    model = models[0]
    return {"choice": model.get("choice") or {}, "flags": model.get("flags") or {}}


def flags_text(catalog: dict[str, Any]) -> str:
    from ktctl.catalogcmd import flags_lines

    lines = [f"variant: {catalog['choice'].get('why', '')}"]
    if catalog["flags"]:
        lines += flags_lines(catalog["flags"])
    return "\n".join(lines)


def follow(
    client: Client, sub: Any, jobs: dict[str, PullInfo], as_json: bool
) -> dict[str, PullInfo]:
    """The jobs to their ends, drawn as they go."""
    tty = sys.stdout.isatty() and not as_json
    width = shutil.get_terminal_size().columns
    shown: dict[str, str] = {}
    last_poll = time.monotonic()

    def show(job: PullInfo) -> None:
        if as_json:  # JSON lines: one compact object a line
            _out(msgspec.json.encode(job).decode())
            return
        if tty:
            end = "\n" if job.state in TERMINAL else ""
            sys.stdout.write("\r\x1b[K" + (job_line(job) if end else bar(job, width)) + end)
            sys.stdout.flush()
            return
        line = job_line(job)
        # without a terminal: a line per change of state or phase, and the end
        mark = f"{job.state}/{job.phase}/{job.restarts}"
        if shown.get(job.key) != mark:
            shown[job.key] = mark
            _out(line)

    for job in jobs.values():
        show(job)
    while any(j.state not in TERMINAL for j in jobs.values()):
        ev = sub.get(timeout=0.5)
        if ev is not None and ev.pull is not None and ev.pull.key in jobs:
            jobs[ev.pull.key] = ev.pull
            show(ev.pull)
            last_poll = time.monotonic()
        elif time.monotonic() - last_poll > POLL:
            last_poll = time.monotonic()
            reply = client.request(p.Pulls())
            assert isinstance(reply, p.PullsReply)
            for job in reply.jobs:
                if job.key in jobs and (job.state, job.done) != (
                    jobs[job.key].state,
                    jobs[job.key].done,
                ):
                    jobs[job.key] = job
                    show(job)
    return jobs


def ask_leave() -> bool | None:
    """Leave the job running (True) or cancel it (False); None: no terminal to ask on.
    The terminal is opened unbuffered and in bytes: a text-mode ``r+`` on a tty raises
    ``UnsupportedOperation`` (it is not seekable)."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return None
    try:
        os.write(fd, b"\npull interrupted: leave it running in ktd, or cancel it? [L/c] ")
        answer = b""
        while not answer.endswith(b"\n"):
            piece = os.read(fd, 1)
            if not piece:
                break
            answer += piece
    except KeyboardInterrupt:
        return True
    except OSError:
        return None
    finally:
        os.close(fd)
    return not answer.strip().lower().startswith(b"c")


def interrupted(client: Client, name: str, repo: str) -> int:
    leave = ask_leave()
    what = name or repo
    if leave is False:
        client.request(p.PullCancel(name=name, repo=repo))
        print(
            f"ktctl: pull of {what} cancelled (what was fetched stays)", file=sys.stderr, flush=True
        )
    else:
        print(
            f"ktctl: stopped following; ktd goes on pulling {what} "
            f"(`ktctl pulls` shows it, `ktctl pull --cancel {what}` ends it)",
            file=sys.stderr,
            flush=True,
        )
    return EXIT_INTERRUPTED
