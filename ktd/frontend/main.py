"""``ktd frontend``: run the OpenAI frontend under Hypercorn's trio worker.

SIGTERM/SIGINT start Hypercorn's graceful shutdown: stop accepting, give
in-flight requests ``--graceful-timeout`` seconds, cancel the rest (their
claims are given back on the way out), then stop the control client. The
dashboard's live streams end at once (they would otherwise hold the whole wait).
"""

from __future__ import annotations

import argparse
import functools
import gc
import logging
import os
import resource
import signal
import sys
from pathlib import Path

import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve

from ktd import paths
from ktd.control import endpoint
from ktd.core.config import Config
from ktd.core.keys import KeyRing
from ktd.frontend import patches, ui
from ktd.frontend.app import create_app
from ktd.frontend.state import FrontendOptions
from ktd.runtime import add_common_options, load_or_report, setup_logging

log = logging.getLogger("ktd.frontend")


def control_endpoint(config: Config, socket_override: str | None) -> str:
    """The daemon's control socket, resolved exactly as ``ktd serve`` resolves it."""
    env = dict(os.environ)
    if config.daemon.runtime_dir and not env.get("KTD_RUNTIME_DIR"):
        env["KTD_RUNTIME_DIR"] = config.daemon.runtime_dir
    return paths.endpoint(endpoint.control_path(socket_override, env))


def raise_nofile_limit() -> tuple[int, int]:
    """Soft RLIMIT_NOFILE up to the hard limit: every client and engine hop is a descriptor.

    The usual soft limit (1,024) would turn the 1,025th open connection into
    EMFILE for everybody. Returns the (soft, hard) pair now in force.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError) as exc:
            log.warning("cannot raise RLIMIT_NOFILE from %s to %s: %s", soft, hard, exc)
    return soft, hard


def hypercorn_config(
    bind: str, *, graceful_timeout: float, access_log: bool, idle_timeout: float = 15.0
) -> HyperConfig:
    hc = HyperConfig()
    hc.bind = [bind]
    hc.graceful_timeout = graceful_timeout
    # Loggers, not "-": with "-" Hypercorn adds its own handler and every line
    # shows up twice (once more through the root handler).
    hc.accesslog = logging.getLogger("hypercorn.access") if access_log else None
    hc.errorlog = logging.getLogger("hypercorn.error")
    hc.include_server_header = False
    # Streams can be quiet for minutes during a load (we send comments, but
    # not in the non-streaming case): never let the server read timeout cut them.
    hc.read_timeout = None
    # A connection that sends nothing (before its first request or between
    # keep-alive requests) is closed after this: idle sockets cost descriptors,
    # and a crowd of silent clients must not starve the ones that talk.
    hc.keep_alive_timeout = idle_timeout
    # Hypercorn's default accept backlog (100) drops SYNs when a thousand clients
    # connect at once (the kernel caps this at net.core.somaxconn).
    hc.backlog = 2048
    return hc


async def _serve(options: FrontendOptions, hc: HyperConfig) -> None:
    app = create_app(options)
    stop = trio.Event()

    async def stopping() -> None:
        await stop.wait()
        ui.close(app)  # live dashboard streams end now: the graceful wait is for requests

    async def on_signals(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            task_status.started()
            async for signum in signals:
                log.info("received %s: shutting down", signal.Signals(signum).name)
                stop.set()
                return

    async with trio.open_nursery() as nursery:
        await nursery.start(on_signals)
        binds: list[str] = await nursery.start(
            functools.partial(serve, app, hc, shutdown_trigger=stopping)
        )
        _freeze_startup_objects()
        print(
            f"ktd frontend: serving on {', '.join(binds)} (daemon: {options.control_endpoint})",
            file=sys.stderr,
            flush=True,
        )
        _notify("READY=1")
        await stop.wait()
        _notify("STOPPING=1")
    # serve() returns after its graceful shutdown; the signal task returned too.


def _freeze_startup_objects() -> None:
    """Keep everything that exists at start-up out of the garbage collector's scans.

    Quart, Hypercorn, trio, prometheus_client and friends leave ~5x10^4 tracked
    objects that live forever, and every full collection walked them all: a
    pause of the whole event loop that every open stream's next chunk waits out
    (bench/slow_streams.py, 1,000 streams). Objects made later (requests,
    connections) are still collected as usual; their own full collections
    remain the main source of the slow-stream p99 (bench/RESULTS.md).
    """
    gc.collect()
    gc.freeze()


def _notify(message: str) -> None:
    try:
        from ktd import sdnotify
    except ImportError:  # pragma: no cover
        return
    sdnotify.notify(message)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="ktd frontend", description="Run the OpenAI-compatible HTTP frontend."
    )
    add_common_options(ap)
    ap.add_argument("--bind", help="HOST:PORT or unix:PATH (default: frontend.bind)")
    ap.add_argument(
        "--graceful-timeout",
        type=float,
        default=5.0,
        help="seconds in-flight requests get on SIGTERM (default 5)",
    )
    ap.add_argument("--access-log", action="store_true", help="log each request to stdout")
    args = ap.parse_args(argv)
    setup_logging(args.log_level)
    if args.access_log:
        logging.getLogger("hypercorn.access").setLevel(logging.INFO)
    config = load_or_report(args.config, "ktd frontend")
    if config is None:
        return 2
    try:
        patches.check()
    except patches.UncheckedVersion as exc:
        print(f"ktd frontend: {exc}", file=sys.stderr)
        return 2
    ring = KeyRing(config.frontend.api_keys, config.frontend.keys)
    for unknown in ring.unknown_models(config.models):
        log.warning("frontend.keys: %s matches no model (yet)", unknown)
    options = FrontendOptions(
        frontend=config.frontend,
        control_endpoint=control_endpoint(config, args.socket),
        heartbeat_interval=max(0.2, config.daemon.lease_ttl / 3),
        catalog=config.catalog,
        config_dir=str(Path(config.path).parent),
    )
    bind = args.bind or config.frontend.bind
    hc = hypercorn_config(
        bind,
        graceful_timeout=args.graceful_timeout,
        access_log=args.access_log,
        idle_timeout=config.frontend.idle_timeout,
    )
    raise_nofile_limit()
    try:
        trio.run(_serve, options, hc)
    except KeyboardInterrupt:  # Ctrl-C before the handlers were up, or a second one
        return 130
    except BaseException as exc:
        oserr = _find(exc, OSError)
        if oserr is None:
            raise
        print(f"ktd frontend: cannot serve on {bind}: {oserr}", file=sys.stderr)
        return 1
    return 0


def _find(exc: BaseException, kind: type[OSError]) -> OSError | None:
    """The first ``kind`` inside (possibly nested) exception groups."""
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _find(inner, kind)
            if found is not None:
                return found
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
