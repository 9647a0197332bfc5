"""``ktctl``: the command line of ktd (README, "Operate").

Exit codes are a contract for scripts: 0 ok, 1 the operation failed, 2 usage
(argparse), 3 ktd unreachable, 4 unknown model (``unknown_model``/``not_kt``), and
for ``ktctl wait`` alone 5: the state was not reached within ``--timeout``.
Errors are one line on stderr (``ktctl: <code>: <message>``), never a traceback;
with ``--json`` stdout carries ``{"error": {"code", "message", "detail"}}`` too.

The commands are a table (``COMMANDS``, rows of ``ktctl.argtable``): each one's name,
help, options and handler, and what ``main`` does around its run (a usage rule argparse
cannot say, what Ctrl-C means); ``build_parser`` builds argparse from it.

Start-up speed is part of the contract as well: this module imports argparse,
json, zmq, msgspec and ``ktd.protocol``/``ktd.paths`` only. Never import trio,
quart, hypercorn or httpx from here (a test checks ``-X importtime``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from ktctl import (
    catalogcmd,
    configargs,
    discover,
    loadpull,
    planview,
    pullcmd,
    render,
    sleepverify,
)
from ktctl.argtable import Subcommand, add_subcommands, arg, number
from ktctl.client import Client, DaemonUnreachable, KtctlError, KtdError
from ktctl.connection import UsageError
from ktctl.progress import ProgressLine as _ProgressLine
from ktd import __version__
from ktd import protocol as p
from ktd.core import states as S

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_UNKNOWN_MODEL = 4
EXIT_TIMED_OUT = 5  # ktctl wait: not in the state within --timeout
EXIT_INTERRUPTED = 130

UNKNOWN_MODEL_CODES = frozenset({p.ErrorCode.UNKNOWN_MODEL, p.ErrorCode.NOT_KT})

#: Seconds to wait for an ordinary reply; ``$KTCTL_TIMEOUT`` overrides it.
DEFAULT_TIMEOUT = 5.0


def exit_code(exc: BaseException) -> int:
    """The exit code a failure maps to (the table in the module docstring)."""
    if isinstance(exc, DaemonUnreachable):
        return EXIT_UNREACHABLE
    if isinstance(exc, KtdError) and exc.code in UNKNOWN_MODEL_CODES:
        return EXIT_UNKNOWN_MODEL
    return EXIT_FAILED


# ---------------------------------------------------------------- output


def _out(text: str = "", *, flush: bool = False) -> None:
    print(text, file=sys.stdout, flush=flush)


def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


def _emit(args: argparse.Namespace, doc: Any, human: str) -> None:
    """One JSON document with ``--json``, else the human text."""
    _out(render.dumps(doc) if _json(args) else human)


def report_error(
    args: argparse.Namespace, code: str, message: str, detail: dict[str, Any] | None = None
) -> None:
    """Print a failure: one stderr line always; the JSON error document with --json.

    A failed load's log tail (``detail["log_tail"]``) goes to stdout in human
    mode: the reason alone rarely explains why SGLang died.
    """
    detail = detail or {}
    flat = " ".join(message.split())
    if _json(args):
        _out(render.dumps(render.error_doc(code, message, detail)))
    else:
        tail = detail.get("log_tail")
        if isinstance(tail, list) and tail:
            alias = detail.get("alias") or getattr(args, "alias", None) or "the engine"
            _out(render.log_tail_text(str(alias), [str(t) for t in tail]))
    _err(f"ktctl: {code}: {flat}")


# ---------------------------------------------------------------- commands


def cmd_ping(client: Client, args: argparse.Namespace) -> int:
    pong = client.ping()
    doc = {**render.reply_doc(pong), "socket": str(client.socket_path)}
    where = client.socket_path
    _emit(args, doc, f"ktd {pong.version} (pid {pong.pid}, protocol {pong.protocol}) on {where}")
    return EXIT_OK


def cmd_schema(client: Client, args: argparse.Namespace) -> int:
    """The protocol's JSON Schema: the daemon's own (it may be newer than this ktctl), or
    with ``--local`` this ktctl's, without a daemon. JSON either way."""
    from ktd import protocol_schema  # only here: the other commands need none of it

    doc = protocol_schema.document() if args.local else client.schema().schema
    sys.stdout.write(protocol_schema.dumps(doc))
    return EXIT_OK


def cmd_wait(client: Client, args: argparse.Namespace) -> int:
    """``ktctl wait ALIAS --state ready --timeout 600``: on the events socket, no polling."""
    alias: str = args.alias
    states = args.state or [S.READY]
    started = time.monotonic()
    try:
        engine = client.wait(alias, states, timeout=args.timeout)
    except KtdError as exc:
        if exc.code != p.ErrorCode.TIMEOUT:
            raise
        report_error(args, exc.code, exc.message, exc.detail)
        return EXIT_TIMED_OUT
    elapsed = time.monotonic() - started
    doc = {"engine": engine, "elapsed": round(elapsed, 3)}
    _emit(args, doc, render.engine_line(engine, elapsed))
    return EXIT_OK


def cmd_status(client: Client, args: argparse.Namespace) -> int:
    reply = client.status_reply(args.alias)
    engines = reply.engines
    doc: dict[str, object] = {"engines": engines}
    text = render.status_table(engines, time.time())
    if reply.gateway is not None:
        doc["gateway"] = reply.gateway
        text += "\n" + render.gateway_text(reply.gateway, time.time())
    _emit(args, doc, text)
    return EXIT_OK


def cmd_models(client: Client, args: argparse.Namespace) -> int:
    models = client.models()
    _emit(args, {"models": models}, render.models_table(models))
    return EXIT_OK


def cmd_load(client: Client, args: argparse.Namespace) -> int:
    alias: str = args.alias
    if args.estimate:
        plan = client.load(alias, timeout=args.timeout, dry_run=True)
        doc = {"alias": alias, "estimate": plan.get("estimate"), "fit": plan.get("fit")}
        human = "\n".join([f"{alias}:", *planview.estimate_lines(plan)])
        _emit(args, doc, human)
        return EXIT_OK
    if args.dry_run:
        plan = client.load(alias, timeout=args.timeout, dry_run=True)
        _emit(args, {"plan": plan}, planview.plan_text(alias, plan))
        return EXIT_OK
    wait = not args.no_wait
    started = time.monotonic()
    progress = None
    if wait and not _json(args) and sys.stderr.isatty():
        progress = _ProgressLine(alias, started)
    try:
        engine = client.load(alias, wait=wait, timeout=args.timeout, progress=progress)
    finally:
        if progress is not None:
            progress.clear()
    elapsed = time.monotonic() - started
    if engine.state == S.FAILED or (wait and engine.state != S.READY):
        why = f": {engine.reason}" if engine.reason else ""
        raise KtdError(
            p.ErrorCode.LOAD_FAILED,
            f"{alias} is {engine.state}{why}",
            {"alias": alias, "engine": render.builtins(engine), "log_tail": engine.log_tail},
        )
    doc = {"engine": engine, "elapsed": round(elapsed, 3)}
    _emit(args, doc, render.engine_line(engine, elapsed if wait else None))
    return EXIT_OK


def cmd_evict(client: Client, args: argparse.Namespace) -> int:
    evicted = client.evict(args.alias, all=args.all, force=args.force, timeout=args.timeout)
    human = f"evicted {', '.join(evicted)}" if evicted else "nothing to evict"
    _emit(args, {"evicted": evicted}, human)
    return EXIT_OK


def _progress(args: argparse.Namespace, state: str) -> _ProgressLine | None:
    """The rewritten progress line of a long wait, on a terminal and without --json."""
    if _json(args) or not sys.stderr.isatty():
        return None
    return _ProgressLine(args.alias, time.monotonic(), state)


def _already(engine: p.EngineInfo, asked: float) -> bool:
    """The engine was in its state before the request was sent (the request was a no-op).

    ``since`` is when ktd saw it enter that state, on the wall clock this host shares."""
    return 0 < engine.since < asked


def _unsettled(alias: str, engine: p.EngineInfo, code: str, wanted: str) -> KtdError:
    why = f": {engine.reason}" if engine.reason else ""
    return KtdError(
        code,
        f"{alias} is {engine.state}, not {wanted}{why}",
        {"alias": alias, "engine": render.builtins(engine), "log_tail": engine.log_tail},
    )


def cmd_sleep(client: Client, args: argparse.Namespace) -> int:
    if args.verify:
        return sleepverify.run(client, args)
    return _memory_command(client.sleep, args, S.SLEEPING, S.ASLEEP, render.sleep_line)


def cmd_wake(client: Client, args: argparse.Namespace) -> int:
    return _memory_command(client.wake, args, S.WAKING, S.READY, render.wake_line)


def _memory_command(
    call: Callable[..., p.EngineInfo],
    args: argparse.Namespace,
    during: str,
    wanted: str,
    line: Callable[..., str],
) -> int:
    """``ktctl sleep`` / ``ktctl wake``: progress on a terminal, then the engine in its
    ``wanted`` state (or why not), and whether it already was."""
    alias: str = args.alias
    asked, started = time.time(), time.monotonic()
    progress = _progress(args, during)
    try:
        engine = call(alias, timeout=args.timeout, progress=progress)
    finally:
        if progress is not None:
            progress.clear()
    elapsed = time.monotonic() - started
    if engine.state != wanted:
        # A sleep still (or again) serving was called off; anything else went down.
        serving = wanted == S.ASLEEP and engine.state in (S.READY, S.WAKING, S.STARTING, S.SLEEPING)
        code = p.ErrorCode.BUSY if serving else p.ErrorCode.LOAD_FAILED
        raise _unsettled(alias, engine, code, wanted)
    already = _already(engine, asked)
    doc = {"engine": engine, "elapsed": round(elapsed, 3), "already": already}
    _emit(args, doc, line(engine, elapsed, already=already))
    return EXIT_OK


def cmd_logs(client: Client, args: argparse.Namespace) -> int:
    alias: str = args.alias
    if not args.follow:
        lines = client.logs(alias, args.lines, probes=args.probes)
        _emit(
            args, {"alias": alias, "lines": lines}, "\n".join(line.rstrip("\n") for line in lines)
        )
        return EXIT_OK
    for line in client.follow_logs(alias, args.lines, probes=args.probes):
        if _json(args):
            _out(render.dumps({"alias": alias, "line": line}, stream=True), flush=True)
        else:
            _out(line.rstrip("\n"), flush=True)
    return EXIT_OK


def cmd_events(client: Client, args: argparse.Namespace) -> int:
    for ev in client.events(args.topics or ("",)):
        if ev.topic.startswith("probe.") and not (args.probes or args.topics):
            continue  # ktd's own health-check lines: asked for by topic or --probes
        if _json(args):
            _out(render.dumps(ev, stream=True), flush=True)
        else:
            _out("\n".join(render.event_lines(ev)), flush=True)
    return EXIT_OK


def cmd_reload(client: Client, args: argparse.Namespace) -> int:
    reply = client.reload()
    if isinstance(reply, p.ModelsReply):
        human = render.models_table(reply.models)
    elif isinstance(reply, p.Ok):
        human = reply.message or "configuration reloaded"
    else:
        human = render.dumps(render.reply_doc(reply))
    _emit(args, render.reply_doc(reply), human)
    return EXIT_OK


def _local_doctor(args: argparse.Namespace, why: DaemonUnreachable) -> dict[str, Any]:
    """Run the checks in this process when the daemon cannot (it may be why it is down).

    ``ktd.checkup`` is imported only here: it may pull in heavier modules,
    and ktctl's other commands must not pay for them.
    """
    import importlib

    from ktd.paths import default_config_path

    try:
        module = importlib.import_module("ktd.checkup")
        local_report = module.local_report
    except (ImportError, AttributeError) as exc:
        raise DaemonUnreachable(
            f"{why}; local checks are not available in this install ({exc})"
        ) from None
    config: str | None = args.config  # None: local_report picks the default path
    if not _json(args):
        shown = config or default_config_path()
        _err(f"ktctl: ktd is not running; running the checks locally (config {shown})")
    try:
        report = local_report(config)
    except Exception as exc:
        raise KtctlError(f"local doctor failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(report, dict):
        raise KtctlError(f"local doctor returned {type(report).__name__}, not a report")
    return report


def cmd_doctor(client: Client, args: argparse.Namespace) -> int:
    try:
        report = client.doctor()
    except DaemonUnreachable as exc:
        report = _local_doctor(args, exc)
    _emit(args, report, render.doctor_text(report))
    return EXIT_FAILED if render.doctor_failed(report) else EXIT_OK


def cmd_usage(client: Client, args: argparse.Namespace) -> int:
    key = "" if args.key == "-" else args.key  # "-": requests on a frontend without keys
    rows = client.usage(args.since or "", key)
    if args.csv:
        _out(render.usage_csv(rows))
    else:
        _emit(args, {"usage": rows}, render.usage_table(rows))
    return EXIT_OK


def cmd_shutdown(client: Client, args: argparse.Namespace) -> int:
    message = client.shutdown() or "ktd is shutting down"
    _emit(args, {"ok": True, "message": message}, message)
    return EXIT_OK


# ---------------------------------------------------------------- the table


_seconds = number(
    float,
    "not a number of seconds",
    lambda s: s > 0 and s != float("inf"),
    "must be a positive number of seconds",
)
_count = number(int, "not a whole number", lambda n: n >= 0, "must be 0 or more")


def _since(text: str) -> str:
    """A day (``YYYY-MM-DD``), ``today``, or ``Nd`` (N days back), as the ledger's UTC day."""
    today = dt.datetime.now(dt.UTC).date()
    if text == "today":
        return today.isoformat()
    if text.endswith("d") and text[:-1].isdigit():
        return (today - dt.timedelta(days=int(text[:-1]))).isoformat()
    try:
        return dt.date.fromisoformat(text).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a day: {text!r} (YYYY-MM-DD, today, or 7d for a week back)"
        ) from None


def _goes_on(what: str) -> Callable[[argparse.Namespace], str]:
    """Ctrl-C in a wait ktd carries on with: ``what`` it does (``{0}``: the alias), and how
    to take it back."""

    def line(args: argparse.Namespace) -> str:
        return f"ktctl: interrupted: stopped waiting; ktd goes on {what.format(args.alias)}"

    return line


def _load_interrupted(args: argparse.Namespace) -> str:
    if args.dry_run or args.estimate:
        return "ktctl: interrupted"  # nothing was started
    return _goes_on("loading {0} (`ktctl evict {0}` stops it)")(args)


def _evict_check(args: argparse.Namespace) -> str | None:
    return (
        "evict needs an ALIAS or --all (not both)"
        if (args.alias is None) == (not args.all)
        else None
    )


def _usage_check(args: argparse.Namespace) -> str | None:
    return "usage prints --csv or --json, not both" if args.csv and _json(args) else None


_ALIAS = arg("alias", metavar="ALIAS")
_GIVE_UP = arg("--timeout", type=_seconds, metavar="S", help="give up after S seconds")
_DRAIN = arg("--timeout", type=_seconds, metavar="S", help="bound the drain to S seconds")

#: Every subcommand, in ``ktctl --help``'s order: the CLI's reference (``ktctl.argtable``).
COMMANDS: tuple[Subcommand, ...] = (
    Subcommand("ping", "check that ktd answers; print its version and pid", cmd_ping),
    Subcommand("status", "show engines (state, pid, port, placement, requests in flight)",
        cmd_status, (arg("alias", nargs="?", metavar="ALIAS", help="only this engine"),)),
    Subcommand("models", "list the models of models.json and whether ktd serves them",
        cmd_models),
    Subcommand("load", "start an engine and wait until it is ready",
        lambda client, args: loadpull.cmd_load(client, args, cmd_load), (
            _ALIAS,
            arg("--no-wait", action="store_true", help="return once the launch has begun"),
            _GIVE_UP,
            *loadpull.ARGS,  # --dry-run, --estimate, --pull
        ), interrupted=_load_interrupted),
    Subcommand("evict", "stop an engine (drain in-flight requests, then terminate)",
        cmd_evict, (
            arg("alias", nargs="?", metavar="ALIAS"),
            arg("--all", action="store_true", help="evict every engine"),
            arg("--force", action="store_true", help="do not wait for in-flight requests"),
            _DRAIN,
        ), check=_evict_check),
    Subcommand("sleep", "put an engine to sleep: drain it and release its GPU memory "
        "(the process lives on, its experts stay in host RAM)", cmd_sleep, (
            _ALIAS,
            _DRAIN,
            arg("--verify", action="store_true",
                help="sleep and wake it once, printing where its memory was at each step "
                "(GPU per process, host per NUMA node, SGLang's own figures)"),
        ), interrupted=_goes_on("putting {0} to sleep (`ktctl wake {0}` wakes it)")),
    Subcommand("wake", "wake an asleep engine and wait until it is ready", cmd_wake, (
            _ALIAS,
            arg("--timeout", type=_seconds, metavar="S",
                help="stop waiting after S seconds (ktd goes on waking it)"),
        ), interrupted=_goes_on("waking {0} (`ktctl sleep {0}` puts it back to sleep)")),
    Subcommand("logs", "print an engine's log", cmd_logs, (
            _ALIAS,
            arg("-n", "--lines", type=_count, default=100, metavar="N",
                help="last N lines (default 100)"),
            arg("-f", "--follow", action="store_true", help="keep printing new lines"),
            arg("--probes", action="store_true", help="also show the access lines of ktd's "
                "own health checks (GET /health, /v1/models)"),
        ), streaming=lambda args: bool(args.follow)),
    Subcommand("events",
        "print ktd's events as they happen (state changes, logs, in-flight counts)",
        cmd_events, (
            arg("topics", nargs="*", metavar="TOPIC",
                help="topic prefixes, e.g. engine. or log.ALIAS (default: all)"),
            arg("--probes", action="store_true",
                help="with no TOPIC: include ktd's own health-check lines"),
        ), streaming=lambda args: True),
    Subcommand("reload", "re-read config.json and models.json", cmd_reload),
    Subcommand("doctor", "check the installation; runs locally when ktd is down", cmd_doctor,
        (arg("--config", metavar="PATH", help="config.json for local checks"),)),
    Subcommand("usage", "the usage ledger: requests, prompt and completion tokens and errors "
        "per day (UTC), API key and model, as the engines reported them", cmd_usage, (
            arg("--since", type=_since, metavar="DAY",
                help="from DAY on: YYYY-MM-DD, today, or Nd (N days back)"),
            arg("--key", metavar="NAME",
                help="only the key named NAME in the config (-: without keys)"),
            arg("--csv", action="store_true", help="CSV with a header line"),
        ), check=_usage_check),
    configargs.COMMAND,
    catalogcmd.COMMAND,
    *pullcmd.COMMANDS,
    Subcommand("shutdown", "stop every engine and the daemon", cmd_shutdown),
    Subcommand("wait",
        "wait until an engine is in a state (starts nothing; on ktd's events, no polling); "
        "exit 1 if it fails meanwhile, 5 if --timeout passes first", cmd_wait, (
            _ALIAS,
            arg("--state", action="append", metavar="STATE", choices=[str(s) for s in S.ALL],
                help="a state to wait for (default ready; repeat for any of several: "
                f"{', '.join(S.ALL)})"),
            _GIVE_UP,
        )),
    Subcommand("schema",
        "print the control protocol's JSON Schema (the daemon's; docs/protocol.md explains it)",
        cmd_schema,
        (arg("--local", action="store_true", help="this ktctl's own schema; no daemon needed"),)),
)  # fmt: skip
BY_NAME = {c.name: c for c in COMMANDS}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, built from ``COMMANDS``; ``--json``/``--socket`` work before or
    after the command."""
    # SUPPRESS defaults: a subcommand that is not given --json must not reset
    # a --json given before the command name (argparse copies sub-namespaces).
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS,
        help="machine-readable output: one JSON document (JSON lines for streams)",
    )  # fmt: skip
    common.add_argument(
        "--socket", metavar="PATH", default=argparse.SUPPRESS,
        help="ktd control socket (default: $KTD_SOCKET, else $KTD_RUNTIME_DIR/control.sock; "
        "with neither set and no ktd there, a running `ktd up`'s, else /run/ktd's)",
    )  # fmt: skip
    parser = argparse.ArgumentParser(
        prog="ktctl",
        parents=[common],
        description="Control ktd, the daemon that owns ktransformers engines.",
        epilog="exit codes: 0 ok, 1 failed, 2 usage, 3 ktd unreachable, 4 unknown model, "
        "5 timed out (wait). "
        "$KTCTL_TIMEOUT sets the reply timeout (default 5 s).",
    )
    parser.add_argument("--version", action="version", version=f"ktctl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_subcommands(sub, COMMANDS, common)
    return parser


def _client_timeout() -> float:
    raw = os.environ.get("KTCTL_TIMEOUT")
    if not raw:
        return DEFAULT_TIMEOUT
    return _seconds(raw)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ktctl`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command = BY_NAME[args.command]
    wrong = command.check(args) if command.check else None
    if wrong:
        parser.error(wrong)
    try:
        timeout = _client_timeout()
    except argparse.ArgumentTypeError as exc:
        parser.error(f"KTCTL_TIMEOUT: {exc}")
    assert command.run is not None  # every command has one; only config's actions have none
    client = Client(
        discover.socket_for(getattr(args, "socket", None), quiet=_json(args)), timeout=timeout
    )
    streaming = command.streaming(args)
    try:
        return command.run(client, args)
    except KeyboardInterrupt:
        if streaming:
            return EXIT_OK
        _err(command.interrupted(args))
        return EXIT_INTERRUPTED
    except KtdError as exc:
        report_error(args, exc.code, exc.message, exc.detail)
        return exit_code(exc)
    except UsageError as exc:
        report_error(args, exc.code, str(exc))
        return EXIT_USAGE
    except KtctlError as exc:
        report_error(args, exc.code, str(exc))
        return exit_code(exc)
    except BrokenPipeError:
        # `ktctl events | head`: the reader left. Point stdout at /dev/null so
        # the interpreter's final flush does not complain, and go quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK if streaming else EXIT_FAILED
    except Exception as exc:
        if os.environ.get("KTCTL_DEBUG"):
            raise
        report_error(
            args, "internal", f"{type(exc).__name__}: {exc} (KTCTL_DEBUG=1 for a traceback)"
        )
        return EXIT_FAILED
    finally:
        client.close()
