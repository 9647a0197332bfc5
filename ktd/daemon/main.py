"""``ktd serve``: set up paths and sockets, run the pool and the control server, tear down.

Start-up order matters for systemd and for clients: the config is validated
first (a bad config refuses to start, naming file and field), then the runtime
directory and sockets are made under a tight umask, adoption runs, and only
then READY=1 is sent.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import trio
import zmq

from ktd import paths, sdnotify
from ktd.catalog.pulls import Puller
from ktd.control.errors import ControlError
from ktd.core import states as S
from ktd.core.command import LaunchError
from ktd.core.config import Config, ConfigError
from ktd.core.configload import ConfigTexts
from ktd.core.exits import signal_name
from ktd.core.placecheck import check_placements
from ktd.core.topology import Topology
from ktd.daemon import offload, safedir, statelock
from ktd.daemon.catalog.entry import PullEntries
from ktd.daemon.catalog.resolver import CatalogPulls
from ktd.daemon.catalog.view import CatalogView, catalog_dir
from ktd.daemon.config import files as configfiles
from ktd.daemon.config.desk import ConfigDesk, Who
from ktd.daemon.config.history import History
from ktd.daemon.doctor import daemon_report, dry_run_plan
from ktd.daemon.engine import gpuexperts, proctree, weights
from ktd.daemon.inotify import DIR_CHANGES, FileWatch
from ktd.daemon.pool import statefile
from ktd.daemon.pool.controls import Controls
from ktd.daemon.pool.machine import MachineReader
from ktd.daemon.pool.pool import Pool
from ktd.daemon.server import ControlServer
from ktd.gateway.sync import GatewaySync
from ktd.gateway.sync import instance_id as gateway_instance
from ktd.protocol import HARD_MAX_FRAME, WELCOME
from ktd.runtime import add_common_options, load_texts_or_report, setup_logging

log = logging.getLogger("ktd")


class Setup:
    """Resolved paths for one daemon run."""

    def __init__(self, config: Config, socket_override: str | None) -> None:
        d = config.daemon
        env = dict(os.environ)
        if socket_override:
            env["KTD_SOCKET"] = socket_override
        if d.runtime_dir and not env.get("KTD_RUNTIME_DIR"):
            env["KTD_RUNTIME_DIR"] = d.runtime_dir
        if d.state_dir and not env.get("KTD_STATE_DIR"):
            env["KTD_STATE_DIR"] = d.state_dir
        self.control = paths.control_path(env)
        self.events = paths.events_path(self.control)
        self.state_dir = paths.state_dir(env)
        self.log_dir = Path(d.log_dir) if d.log_dir else self.state_dir / "logs"
        self.group = d.group
        self.gid: int | None = None  # the group's, once the runtime dir is made


def prepare_runtime_dir(directory: Path, group: str | None) -> int | None:
    """0700 (0750 with a group), owned by us: the socket's permission is the directory's.
    Checked without following symlinks (``ktd.daemon.safedir``): a planted link is an error.
    Returns the group's gid (None: no group), which the sockets are given too."""
    mode = 0o750 if group else 0o700
    try:
        fd = safedir.ensure_dir(directory, mode, what="runtime dir", fix_mode=True)
    except safedir.UnsafeDir as exc:
        raise SystemExit(f"ktd: {exc}") from None
    try:
        if not group:
            return None
        import grp

        try:
            gid = grp.getgrnam(group).gr_gid
            os.fchown(fd, -1, gid)
        except (KeyError, PermissionError) as exc:
            raise SystemExit(f"ktd: daemon.group {group!r}: {exc}") from None
        return gid
    finally:
        os.close(fd)


def prepare_state_dir(directory: Path, group: str | None) -> int:
    """The state dir, checked like the runtime dir, and this daemon's lock on it.
    Returns the lock fd (kept open for the daemon's life); SystemExit names the holder."""
    try:
        fd = safedir.ensure_dir(
            directory, 0o750 if group else 0o700, what="state dir", fix_mode=False
        )
    except safedir.UnsafeDir as exc:
        raise SystemExit(f"ktd: {exc}") from None
    try:
        return statelock.acquire(directory, dir_fd=fd)
    except statelock.StateDirBusy as exc:
        raise SystemExit(str(exc)) from None
    except OSError as exc:
        raise SystemExit(f"ktd: cannot lock state dir {directory}: {exc}") from None
    finally:
        os.close(fd)


def give_group(path: Path, gid: int | None) -> None:
    """The socket file ``path`` to ``daemon.group`` (``gid``). A new file takes its
    creator's primary group (the runtime dir has no setgid bit): with a group that is not
    ktd's own, the sockets stayed ``root:root 0770`` and the group's members, let into the
    directory, could not connect. The file is ours in a directory only we may write to,
    so the moment between the bind and this is safe (tighter, not looser)."""
    if gid is not None:
        try:
            os.chown(path, -1, gid, follow_symlinks=False)
        except OSError as exc:
            raise SystemExit(f"ktd: daemon.group (gid {gid}): {path}: {exc.strerror}") from None


def check_not_running(path: Path) -> None:
    """A live daemon on this socket → refuse; a stale socket file → remove it."""
    if not path.exists():
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except OSError:
            path.unlink(missing_ok=True)
            return
    raise SystemExit(f"ktd: another ktd is already listening on {path}")


#: Replies the control socket queues for one client that does not read them.
REPLY_HWM = 10_000


def bind_sockets(setup: Setup) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    control = ctx.socket(zmq.ROUTER)
    events = ctx.socket(zmq.XPUB)
    for s in (control, events):
        s.setsockopt(zmq.LINGER, 0)
    control.setsockopt(zmq.MAXMSGSIZE, HARD_MAX_FRAME)
    control.setsockopt(zmq.ROUTER_HANDOVER, 1)
    # No reply dropped silently: a plain ROUTER discards what exceeds a peer's
    # high-water mark (1,000 by default: a burst of acquires lost their granted leases
    # that way), and what goes to a peer that left. MANDATORY makes both visible: an
    # unknown peer is EHOSTUNREACH, and a peer with REPLY_HWM replies unread is EAGAIN
    # for that peer alone, which the server counts as dropped (a lease in one given
    # back): a client that never reads costs ktd a bounded queue, and the others
    # nothing (an unbounded one grew ktd's memory with every request it sent).
    control.setsockopt(zmq.SNDHWM, REPLY_HWM)
    control.setsockopt(zmq.ROUTER_MANDATORY, 1)
    events.setsockopt(zmq.SNDHWM, 10_000)
    events.setsockopt(zmq.XPUB_WELCOME_MSG, WELCOME)
    # Never chmod after bind (racy): the umask decides the mode at creation.
    old = os.umask(0o007 if setup.group else 0o077)
    try:
        check_not_running(setup.control)
        setup.events.unlink(missing_ok=True)
        control.bind(paths.endpoint(setup.control))
        events.bind(paths.endpoint(setup.events))
    finally:
        os.umask(old)
    for path in (setup.control, setup.events):
        give_group(path, setup.gid)
    return control, events


class Daemon:
    def __init__(
        self,
        config: Config,
        setup: Setup,
        texts: ConfigTexts | None = None,
    ) -> None:
        self.config = config
        self.texts = texts  # the files ``config`` was read from (None: read them at run)
        self.setup = setup
        self.stop_requested = trio.Event()
        self.force_stop = False
        self.server: ControlServer | None = None
        self.pool: Pool | None = None
        self.gateway: GatewaySync | None = None
        self.desk: ConfigDesk | None = None

    def _machine(self) -> Topology:
        return self.pool.topology if self.pool is not None else weights.read_machine()

    def request_stop(self) -> None:
        if self.stop_requested.is_set():
            self.force_stop = True
        self.stop_requested.set()

    async def reload(self, who: Who) -> str:
        """``ktctl reload``, SIGHUP: the files as they are now (``ConfigDesk.reload``)."""
        assert self.desk is not None
        return await self.desk.reload(who)

    def install(self, new: Config) -> str:
        """Take the pool and the gateway to ``new`` (a reload, or an applied change): only
        what changed restarts, when idle (``ktd.daemon.pool.reloader``)."""
        assert self.pool is not None
        summary = self.pool.apply_config(new)
        if self.gateway is not None:
            self.gateway.apply_config(new.gateway, new.frontend)
        self.config = new
        log.info("reloaded %s: %s", new.path, summary)
        return summary

    async def doctor(self) -> dict[str, Any]:
        assert self.pool is not None
        self.pool.prober.forget()  # doctor looks afresh; the next launch probes again too
        return await daemon_report(self.config, self.pool, self.gateway)

    async def dry_run(self, alias: str) -> dict[str, Any]:
        assert self.pool is not None
        engine = self.pool.engine(alias)
        probe = await self.pool.probe(engine.spec)
        out = dry_run_plan(self.pool, alias, probe)
        spec = engine.spec
        try:
            plan = self.pool.plan(spec, exclude=engine, catalog=probe.catalog)
        except LaunchError:  # already reported in ``out``; estimate on the plain plan
            plan = self.pool.plan(spec, exclude=engine)
        # The memory estimate reads file sizes and runs nvidia-smi: off the event loop.
        est, verdict = await self.pool.fit(spec, plan)
        out["estimate"] = est.to_dict()
        out["fit"] = {**verdict.to_dict(), "policy": spec.fit}
        return out

    async def run(self, control: zmq.Socket[bytes], events: zmq.Socket[bytes]) -> None:
        async with trio.open_nursery() as nursery:
            pool = self._open_pool()
            gateway = GatewaySync(
                self.config.gateway,
                self.config.frontend,
                pool,
                instance=gateway_instance(pool.instance),
            )
            self.gateway = gateway
            pool.observers.append(gateway)
            desk = await self._open_desk(pool)
            pulls = self._open_pulls()
            server = ControlServer(
                Controls(pool),
                control,
                events,
                reload=self.reload,
                doctor=self.doctor,
                dry_run=self.dry_run,
                shutdown=self.request_stop,
                gateway=gateway.info,
                machine=MachineReader(pool).reply,
                config=desk,
                catalog=CatalogView(lambda: self.config, self.setup.state_dir).reply,
                pulls=pulls,
            )
            self.server = server
            # Signal handlers first: a SIGHUP before them would kill the daemon.
            await nursery.start(self._signals)
            await nursery.start(server.run)
            await nursery.start(pool.run)
            await nursery.start(gateway.run)
            await nursery.start(pulls.run)
            # Watching its socket files before it says it is ready: one replaced before
            # the watch took them for ours would never be bound again.
            await nursery.start(self._keep_sockets, server)
            nursery.start_soon(self._watchdog)
            sdnotify.notify("READY=1\nSTATUS=serving")
            log.info("ktd ready: control %s, %d kt model(s)", self.setup.control, len(pool.engines))
            await self.stop_requested.wait()
            sdnotify.notify("STOPPING=1")
            log.info("shutting down: stopping %d engine(s)", len(pool.engines))
            with trio.CancelScope(shield=True):
                await gateway.shutdown()
                await self._stop_engines(pool)
            nursery.cancel_scope.cancel()
        server.close()

    def _open_pool(self) -> Pool:
        """The pool with the engines the last ktd left running adopted (or killed)."""
        pool = Pool(
            self.config,
            log_dir=self.setup.log_dir,
            publish=self._publish,
            state_path=self.setup.state_dir / "engines.json",
        )
        self.pool = pool
        pool.observers.append(gpuexperts.ExpertsKeeper(self.setup.state_dir / gpuexperts.FILE))
        adopted, killed = pool.adopt()
        if adopted:
            log.info("re-adopted running engine(s): %s", ", ".join(adopted))
        if killed:
            log.warning("killed %d stray engine process(es): %s", len(killed), killed)
        return pool

    async def _open_desk(self, pool: Pool) -> ConfigDesk:
        """The config desk over the files as read at start, its history recording it."""
        texts = self.texts or await configfiles.read_texts(self.config.path)
        desk = ConfigDesk(
            self.config,
            texts,
            pool,
            install=self.install,
            history=History(
                self.setup.state_dir / "config-history", self.config.daemon.config_history + 1
            ),
        )
        self.desk = desk
        await desk.record_start()
        return desk

    def _open_pulls(self) -> Puller:
        """The catalog's pulls. The catalog as they see it: the running config's files,
        re-read at each pull (a reload's new files count from the next one)."""
        cat = CatalogPulls(lambda: self.config, self.setup.state_dir, machine=self._machine)
        entries = PullEntries(cat, lambda: self.desk, self._publish, offload.to_thread)
        return Puller(
            self.config.catalog,
            root=catalog_dir(self.config, self.setup.state_dir),
            state_path=self.setup.state_dir / "pulls.json",
            publish=self._publish,
            resolve=cat.resolve,
            fit=cat.fit,
            finished=entries.finished,
            offload=offload.to_thread,
            log_dir=self.setup.log_dir / "pulls",
        )

    async def _stop_engines(self, pool: Pool) -> None:
        """Shutdown's end for the engines: left running for the next ktd, or stopped (a
        second signal skips the drains)."""
        if self.config.daemon.keep_engines_on_exit:
            pool.keeping_engines = True
            pool.save_state()
            log.info("keep_engines_on_exit: leaving engines running for the next ktd")
            return
        async with trio.open_nursery() as stopper:
            stopper.start_soon(pool.stop_all)
            stopper.start_soon(self._escalate, pool)
        pool.save_state()

    async def _escalate(self, pool: Pool) -> None:
        """A second SIGTERM/SIGINT during shutdown skips the drains."""
        while not self.force_stop:
            if all(e.state in (S.STOPPED, S.FAILED) for e in pool.engines.values()):
                return
            await trio.sleep(0.1)
        for e in pool.engines.values():
            e.request_down(force=True)

    def _publish(self, topic: str, event: Any) -> None:
        if self.server is not None:
            self.server.publish(topic, event)

    async def _signals(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as sigs:
            task_status.started()
            async for sig in sigs:
                if sig == signal.SIGHUP:
                    try:
                        await self.reload(Who(claimed="SIGHUP"))
                    except ControlError as exc:
                        log.error("SIGHUP reload failed: %s", exc.message)
                else:
                    log.info("received %s", signal_name(sig))
                    self.request_stop()

    async def _keep_sockets(
        self,
        server: ControlServer,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Bind the control and event sockets again when their files are removed or
        replaced (``systemd-tmpfiles``, a mistaken ``rm``): a running ktd must never become
        unreachable. Woken by inotify on the runtime directory; a slow look as well."""
        setup = self.setup
        umask = 0o007 if setup.group else 0o077
        # Their files as this daemon bound them (before the watch: nothing is missed).
        kept = {path: _inode(path) for path in (setup.control, setup.events)}
        watch = FileWatch.open(setup.control.parent, DIR_CHANGES)
        task_status.started()
        try:
            while True:
                for path, sock in ((setup.control, server.control), (setup.events, server.events)):
                    now = _inode(path)
                    if now is not None and now == kept[path]:
                        continue
                    what = "removed" if now is None else "replaced"
                    log.warning("%s was %s: binding it again", path, what)
                    # The file the pump's bind made, looked at as soon as it is made: a
                    # fixed wait here took for ours a file someone replaced it with meanwhile.
                    await sock.rebind(paths.endpoint(path), umask=umask).wait()
                    try:
                        give_group(path, setup.gid)
                    except SystemExit as exc:
                        log.error("%s", exc)  # ktd's own user may still connect
                    kept[path] = _inode(path)
                with trio.move_on_after(30.0 if watch is not None else 2.0):
                    if watch is not None:
                        await watch.wait()
                    else:
                        await trio.sleep_forever()
                await trio.sleep(0.05)  # a burst of changes (rm and re-create) is one look
        finally:
            if watch is not None:
                watch.close()

    async def _watchdog(self) -> None:
        interval = sdnotify.watchdog_interval()
        if interval is None:
            return
        while True:
            sdnotify.notify("WATCHDOG=1")
            await trio.sleep(interval)


def _inode(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="ktd serve", description="Run the ktd daemon.")
    add_common_options(ap)
    args = ap.parse_args(argv)
    setup_logging(args.log_level)
    loaded = load_texts_or_report(args.config, "ktd")
    if loaded is None:
        return 2
    config, texts = loaded
    try:
        check_placements(config, weights.read_machine())  # the machine the pool places on
    except ConfigError as exc:
        print(f"ktd: config error: {exc}", file=sys.stderr)
        return 2
    setup = Setup(config, args.socket)
    try:
        # The lock first: a second daemon on this state dir must not even unlink a
        # socket. Held (fd open) until this process exits.
        lock_fd = prepare_state_dir(setup.state_dir, setup.group)
        for stale in statefile.remove_stale_temps(setup.state_dir / "engines.json"):
            log.warning("removed %s, left by a daemon killed mid-write", stale)
        setup.gid = prepare_runtime_dir(setup.control.parent, setup.group)
        control, events = bind_sockets(setup)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 1
    except zmq.ZMQError as exc:
        print(f"ktd: cannot bind {setup.control}: {exc}", file=sys.stderr)
        return 1
    proctree.set_child_subreaper()
    daemon = Daemon(config, setup, texts)
    try:
        trio.run(daemon.run, control, events)
    finally:
        for path in (setup.control, setup.events):
            path.unlink(missing_ok=True)
        os.close(lock_fd)  # after the sockets are gone: the next daemon may start now
    return 0
