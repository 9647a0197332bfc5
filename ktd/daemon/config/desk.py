"""Changes of the config through the daemon (issue 39): read, plan, apply, history, rollback.

Every change (``ktctl config apply``/``set``/``add``/``remove``/``rollback``, the
dashboard's editor) and every reload (``ktctl reload``, SIGHUP) goes through here, one
at a time (one lock): so two writers never both win, and the version a change names as
its base is compared with the files on disk under that lock. The plan is pure
(``ktd.core.configplan``); this module gathers what it needs (the engines' views, each
new or changed model's SGLang verdict on its flags through the probe, its paths, its
placement and memory fit now) and carries an apply out:

1. the files on disk are read; their version must be the base (else ``stale_config``);
2. the new config is validated (``config_error``, naming file and field) and planned;
   an error in the plan refuses it (``config_error``; ``busy`` for a load or a swap the
   change would throw away: the rule in ``ktd.core.configplan``);
3. the version is recorded in the history, then the files are written (temp, fsync,
   rename, fsync of the directory); a failure of either (a full disk) takes back what
   was done and refuses (``write_failed``): the files and the running config stay;
4. the new config is installed as a reload installs one (``install``: the pool's diff,
   ``ktd.daemon.pool.reloader``), so only what changed restarts, and only when idle.

A reload is the same minus the plan: the files are read, validated and installed, and
a version that differs from the last one recorded (a hand edit) becomes a new version.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import trio

from ktd import protocol as p
from ktd.control.errors import ControlError
from ktd.core import configplan, secret, trust
from ktd.core import states as S
from ktd.core.config import Config, ConfigError
from ktd.core.configload import ConfigTexts, models_file_of, parse_config
from ktd.core.placecheck import check_placements
from ktd.core.trust import Role
from ktd.daemon.config import facts as configfacts
from ktd.daemon.config import files as configfiles
from ktd.daemon.config.facts import PoolView
from ktd.daemon.config.files import FileChange, changed_files, file_changes, read_models, read_texts
from ktd.daemon.config.history import History, Record, texts_version
from ktd.protocol_config import plan_refusal

log = logging.getLogger("ktd")


@dataclass(frozen=True)
class Who:
    """Who asked: the uid the control socket showed (None: ktd itself, a signal), and
    who the client said it was (kept as claimed)."""

    uid: int | None = None
    claimed: str = ""
    delegated: bool = False  # asked for someone else (the dashboard): never the owner

    def user(self) -> str | None:
        if self.uid is None:
            return None
        try:
            return pwd.getpwuid(self.uid).pw_name
        except KeyError:
            return None


Install = Callable[[Config], str]


def _problem_detail(plan: p.ConfigPlanView) -> dict[str, Any]:
    return {
        "problems": msgspec.to_builtins(plan.problems),
        "plan": msgspec.to_builtins(plan),
    }


class ConfigDesk:
    def __init__(
        self,
        config: Config,
        texts: ConfigTexts,
        pool: PoolView,
        *,
        install: Install,
        history: History,
        write: configfiles.Writer = configfiles.write_files,
    ) -> None:
        self.config = config  # the config ktd runs
        self.texts = texts  # its files as they were read
        self.running = texts_version(texts)
        self.pool = pool
        self._install = install
        self.history = history
        self._write = write
        self._lock = trio.Lock()

    @property
    def path(self) -> str:
        return self.config.path

    # ------------------------------------------------------------ start, reload

    async def record_start(self) -> None:
        """The files ktd started with become a version when they are not the last one
        recorded (changed while ktd was down, or the first start)."""
        await trio.to_thread.run_sync(self.history.load)
        who = Who(uid=os.getuid(), claimed="ktd serve")
        await self._record(self.texts, "start", who, "the files ktd started with")

    async def reload(self, who: Who) -> str:
        """``ktctl reload``/SIGHUP: the files as they are, validated and installed; a
        hand edit becomes a version in the history."""
        async with self._lock:
            try:
                texts = await read_texts(self.path)
                new = parse_config(texts)
                check_placements(new, self.pool.topology)
            except ConfigError as exc:
                log.error("reload refused: %s", exc)
                raise ControlError(
                    p.ErrorCode.CONFIG_ERROR,
                    f"{exc} (the running config is kept)",
                    {"file": exc.file, "path": exc.path},
                ) from None
            summary = self._install_config(new, texts)
            await self._record(texts, "reload", who, summary)
            return summary

    def _install_config(self, new: Config, texts: ConfigTexts) -> str:
        summary = self._install(new)
        self.config, self.texts, self.running = new, texts, texts_version(texts)
        self.history.keep = new.daemon.config_history + 1
        return summary

    async def _record(self, texts: ConfigTexts, how: str, who: Who, what: str) -> int | None:
        """A version for ``texts`` unless it is already the last one; a failure to write
        it is logged (the change it records stands: it was not made here)."""
        version = texts_version(texts)
        latest = self.history.latest()
        if latest is not None and latest.version == version:
            return latest.seq
        record = await self._new_record(texts, how, who, what or "changed by hand", latest)
        try:
            await trio.to_thread.run_sync(self.history.add, record)
            await trio.to_thread.run_sync(self.history.trim)
        except OSError as exc:
            log.error("config history: cannot record version %s: %s", version, exc)
            return None
        return record.info.seq

    async def _new_record(
        self,
        texts: ConfigTexts,
        how: str,
        who: Who,
        what: str,
        latest: p.ConfigVersion | None,
        rollback_of: int | None = None,
    ) -> Record:
        """The version ``texts`` make: which files changed against the last one, and who
        (the uid's name from NSS, which may be LDAP; both read off the loop)."""
        user = await trio.to_thread.run_sync(who.user)
        before = (
            await trio.to_thread.run_sync(self.history.get, latest.seq)
            if latest is not None
            else None
        )
        files = changed_files(before.texts() if before is not None else None, texts)
        info = p.ConfigVersion(
            seq=self.history.next_seq(),
            version=texts_version(texts),
            time=time.time(),
            how=how,
            uid=who.uid,
            user=user,
            claimed=who.claimed,
            what=what,
            files=files,
            rollback_of=rollback_of,
        )
        return Record.of(info, texts)

    # ------------------------------------------------------------ reading

    async def role(self, who: Who) -> Role:
        """``who``'s role (docs/security.md); the uid's name from NSS, off the loop."""
        name = await trio.to_thread.run_sync(who.user) if who.uid is not None else None
        d = self.config.daemon
        return trust.role_of(
            who.uid, owner=os.getuid(), admins=d.admins, name=name, delegated=who.delegated
        )

    async def _may_change(self, who: Who) -> bool:
        """True: within an admin's limits; False: the owner's (no limit). A member may
        not plan or change the config at all."""
        role = await self.role(who)
        if role is Role.MEMBER:
            raise ControlError(
                p.ErrorCode.FORBIDDEN,
                f"uid {who.uid} may read the config but not plan or change it: that is "
                f"ktd's owner's (uid {os.getuid()}), root's and daemon.admins' "
                "(docs/security.md)",
                {"uid": who.uid},
            )
        return role is Role.ADMIN

    def _unmasked(
        self, disk: ConfigTexts, config: str | None, models: str | None
    ) -> tuple[str | None, str | None]:
        """A non-owner's texts with the secrets they kept back in them; a config.json that
        says what the one on disk says is that one (its layout may have been lost)."""
        on_disk = (disk.config.decode(errors="replace"), _text(disk.models))
        try:
            config, models = trust.unmasked(config, models, on_disk)
        except secret.MarkError as exc:
            raise ControlError(p.ErrorCode.BAD_REQUEST, str(exc)) from None
        if config is not None and _same_json(config, on_disk[0]):
            config = None
        return config, models

    async def get(self, seq: int | None, who: Who | None = None) -> p.ConfigReply:
        reply = await self._get(seq)
        if who is not None and await self.role(who) is not Role.OWNER:
            return trust.masked(reply)
        return reply

    async def _get(self, seq: int | None) -> p.ConfigReply:
        found: int | None
        if seq is not None:
            record = await trio.to_thread.run_sync(self.history.get, seq)
            if record is None:
                raise self._no_version(seq)
            texts, found = record.texts(), seq
        else:
            texts = await self._disk()
            latest = self.history.latest()
            found = latest.seq if latest and latest.version == texts_version(texts) else None
        return p.ConfigReply(
            version=texts_version(texts),
            running=self.running,
            config_path=texts.config_name,
            config_text=texts.config.decode(errors="replace"),
            models_path=texts.models_name,
            models_text=texts.models.decode(errors="replace") if texts.models is not None else None,
            seq=found,
        )

    def history_reply(self, disk: str) -> p.ConfigHistoryReply:
        return p.ConfigHistoryReply(
            versions=self.history.infos(),
            keep=self.history.keep,
            running=self.running,
            disk=disk,
        )

    async def history_now(self) -> p.ConfigHistoryReply:
        texts = await self._disk()
        return self.history_reply(texts_version(texts))

    def _no_version(self, seq: int) -> ControlError:
        kept = [i.seq for i in self.history.infos()]
        return ControlError(
            p.ErrorCode.BAD_REQUEST,
            f"no version {seq} in the config history (kept: {self.history.kept()})",
            {"seq": seq, "kept": kept},
        )

    async def _disk(self) -> ConfigTexts:
        try:
            return await read_texts(self.path, missing_ok=True)
        except ConfigError as exc:
            raise ControlError(
                p.ErrorCode.CONFIG_ERROR, str(exc), {"file": exc.file, "path": exc.path}
            ) from None

    async def _merged(
        self, disk: ConfigTexts, config: str | None, models: str | None
    ) -> ConfigTexts:
        """The files a change would leave: its texts, the rest as they are on disk."""
        cfg = config.encode() if config is not None else disk.config
        mpath, named = models_file_of(Path(disk.config_name), cfg)
        if models is not None:
            mdata: bytes | None = models.encode()
        elif str(mpath) == disk.models_name:
            mdata = disk.models
        else:  # the new config.json points at another models file: as it is on disk
            try:
                mdata = await read_models(str(mpath), disk.config_name)
            except ConfigError as exc:
                raise ControlError(
                    p.ErrorCode.CONFIG_ERROR, str(exc), {"file": exc.file, "path": exc.path}
                ) from None
        return ConfigTexts(disk.config_name, cfg, str(mpath), mdata, named)

    # ------------------------------------------------------------ planning

    async def plan(
        self, config: str | None, models: str | None, base: str, who: Who | None = None
    ) -> p.ConfigPlanView:
        """What applying these texts would do; nothing is changed (no lock: reads only)."""
        limited = who is not None and await self._may_change(who)
        disk = await self._disk()
        if limited:
            config, models = self._unmasked(disk, config, models)
        new_texts = await self._merged(disk, config, models)
        plan = await self._plan(disk, new_texts, limited=limited)
        if base and base != plan.base:  # what applying it would answer, said now
            plan.problems.insert(0, _stale_problem(base, plan.base))
            plan.ok = False
        return plan

    async def _plan(
        self, disk: ConfigTexts, new_texts: ConfigTexts, *, limited: bool = False
    ) -> p.ConfigPlanView:
        """The plan; ``limited``: a non-owner's, checked against ``trust.limits`` before
        anything is run (its models' interpreters are run by the probe)."""
        base, version = texts_version(disk), texts_version(new_texts)
        try:
            new = parse_config(new_texts)
            check_placements(new, self.pool.topology)
        except ConfigError as exc:
            return configplan.config_error_plan(
                exc.file, exc.path, exc.message, base=base, version=version, running=self.running
            )
        if limited:
            config_changed = (new_texts.config_name, new_texts.config) != (
                disk.config_name,
                disk.config,
            )
            problems = trust.limits(self.config, new, config_changed)
            if problems:
                return p.ConfigPlanView(
                    base=base,
                    version=version,
                    running=self.running,
                    changed=changed_files(disk, new_texts),
                    problems=problems,
                    ok=False,
                    summary="needs ktd's owner: " + problems[0].message,
                )
            return trust.shown_plan(await self._plan(disk, new_texts))
        engines = self.pool.engines
        facts = await configfacts.facts(self.pool, configplan.judged(self.config, new))
        views = {alias: e.existing() for alias, e in engines.items()}
        return configplan.plan_change(
            self.config,
            new,
            views,
            facts,
            motion=configplan.in_motion(configfacts.moving(self.pool.engines)),
            sleeps={a: e.sleep_mode() == "on" or e.state == S.ASLEEP for a, e in engines.items()},
            base=base,
            version=version,
            running=self.running,
            changed=changed_files(disk, new_texts),
        )

    # ------------------------------------------------------------ applying

    async def apply(
        self, config: str | None, models: str | None, base: str, who: Who
    ) -> p.ConfigApplyReply:
        limited = await self._may_change(who)
        async with self._lock:
            disk = await self._disk()
            self._check_base(base, disk)
            if limited:
                config, models = self._unmasked(disk, config, models)
            new_texts = await self._merged(disk, config, models)
            return await self._apply(disk, new_texts, who, how="apply", limited=limited)

    async def apply_edit(
        self, edit: Callable[[ConfigTexts], str | None], who: Who, how: str
    ) -> p.ConfigApplyReply | None:
        """A change ktd makes itself (a pull's models.json entry: ``how`` ``pull``), planned
        and applied as any: ``edit`` turns the files on disk, read under the lock, into
        the new models.json text (None: nothing to change)."""
        async with self._lock:
            disk = await self._disk()
            models = edit(disk)
            if models is None:
                return None
            new_texts = await self._merged(disk, None, models)
            return await self._apply(disk, new_texts, who, how=how)

    async def rollback(
        self, seq: int | None, base: str, who: Who, *, dry_run: bool
    ) -> p.ConfigApplyReply | p.ConfigPlanReply:
        limited = await self._may_change(who)
        if dry_run:
            disk = await self._disk()
            record, texts = await self._rollback_target(seq, disk)
            return p.ConfigPlanReply(plan=await self._plan(disk, texts, limited=limited))
        async with self._lock:
            disk = await self._disk()
            self._check_base(base, disk)
            record, texts = await self._rollback_target(seq, disk)
            return await self._apply(
                disk, texts, who, how="rollback", rollback_of=record.info.seq, limited=limited
            )

    async def _rollback_target(
        self, seq: int | None, disk: ConfigTexts
    ) -> tuple[Record, ConfigTexts]:
        """Version ``seq``, or the last one whose texts differ from the files on disk now;
        with its texts put in the files ktd runs from (``Record.texts_in``)."""
        if seq is not None:
            record = await trio.to_thread.run_sync(self.history.get, seq)
            if record is None:
                raise self._no_version(seq)
            return record, record.texts_in(disk.config_name)
        now = texts_version(disk)
        for info in self.history.infos():
            if info.version == now:
                continue
            found = await trio.to_thread.run_sync(self.history.get, info.seq)
            if found is None:
                continue
            texts = found.texts_in(disk.config_name)
            if texts_version(texts) != now:  # the same texts at another path: no change
                return found, texts
        raise ControlError(
            p.ErrorCode.BAD_REQUEST, "no older version in the config history to go back to"
        )

    def _check_base(self, base: str, disk: ConfigTexts) -> None:
        now = texts_version(disk)
        if not base:  # left out: it would overwrite whatever changed since it was read
            raise ControlError(
                p.ErrorCode.BAD_REQUEST,
                f"base is required: the version the change was made from (config_get's "
                f"version; it is {now} now); nothing was applied",
                {"field": "base", "version": now},
            )
        if base != now:
            raise ControlError(
                p.ErrorCode.STALE_CONFIG,
                _stale_problem(base, now).message + ": nothing was applied",
                {"base": base, "version": now},
            )

    async def _apply(
        self,
        disk: ConfigTexts,
        new_texts: ConfigTexts,
        who: Who,
        *,
        how: str,
        rollback_of: int | None = None,
        limited: bool = False,
    ) -> p.ConfigApplyReply:
        plan = await self._plan(disk, new_texts, limited=limited)
        if not plan.ok:
            self._refuse(plan)
        if not plan.changed and plan.base == self.running:
            return p.ConfigApplyReply(plan=plan, version=plan.version, summary="no change")
        new = parse_config(new_texts)  # validated by the plan
        latest = self.history.latest()
        what = (
            f"back to version {rollback_of}: {plan.summary}" if how == "rollback" else plan.summary
        )
        record = await self._new_record(new_texts, how, who, what, latest, rollback_of)
        seq = record.info.seq
        changes = await self._record_and_write(disk, new_texts, record)
        # A load may have begun while the files were written: the rule once more, with
        # nothing awaited between it and the install.
        moving = configfacts.moving(self.pool.engines)
        late = configplan.refusals(plan.engines, configplan.in_motion(moving))
        if late:
            await self._put_back(changes, seq)
            plan.problems += late
            plan.ok = False
            self._refuse(plan)
        await trio.to_thread.run_sync(self.history.trim)
        summary = self._install_config(new, new_texts)
        log.info(
            "config %s by %s (uid %s, claimed %r): %s; %s",
            how,
            record.info.user or "?",
            who.uid,
            who.claimed,
            plan.summary,
            summary,
        )
        return p.ConfigApplyReply(plan=plan, version=plan.version, seq=seq, summary=summary)

    async def _record_and_write(
        self, disk: ConfigTexts, new_texts: ConfigTexts, record: Record
    ) -> list[FileChange]:
        """The version into the history first, then the files: a write that fails takes
        its version out again, so the history never names files that are not there."""
        try:
            await trio.to_thread.run_sync(self.history.add, record)
        except OSError as exc:
            raise _write_failed(
                f"cannot record the version in the config history: {_why(exc)}"
            ) from None
        changes = await trio.to_thread.run_sync(file_changes, disk, new_texts)  # may read
        try:
            await trio.to_thread.run_sync(self._write, changes)
        except OSError as exc:
            await trio.to_thread.run_sync(self.history.drop, record.info.seq)
            where = getattr(exc, "filename", None) or ", ".join(c.path for c in changes)
            raise _write_failed(f"cannot write {where}: {_why(exc)}") from None
        return changes

    async def _put_back(self, changes: list[FileChange], seq: int) -> None:
        """Undo a written change refused late (a load began meanwhile): the files as they
        were (a new one removed) and its version out of the history."""
        back = [FileChange(c.path, c.old, c.new) for c in changes if c.old is not None]
        gone = [c.path for c in changes if c.old is None]
        try:
            await trio.to_thread.run_sync(self._write, back)
            for path in gone:
                os.unlink(path)
        except OSError as exc:
            log.error("config: cannot put the files back after a late refusal: %s", exc)
        await trio.to_thread.run_sync(self.history.drop, seq)

    @staticmethod
    def _refuse(plan: p.ConfigPlanView) -> None:
        """An error of the plan as the change's answer: ``config_error`` naming the file
        and field of the first one, or ``busy`` when every error is a load or a swap the
        change would throw away."""
        code, message, first = plan_refusal(plan)
        detail = _problem_detail(plan)
        if first is not None:
            detail.update(file=first.file, path=first.path)
        raise ControlError(code, message, detail)


def _stale_problem(base: str, now: str) -> p.ConfigProblem:
    return p.ConfigProblem(
        level="error",
        code=p.ErrorCode.STALE_CONFIG,
        message=f"the config changed since version {base} was read (it is {now} now); "
        "read it again and make the change on what is there",
    )


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _write_failed(message: str) -> ControlError:
    return ControlError(
        p.ErrorCode.WRITE_FAILED,
        f"{message}; nothing was changed (the files and the running config are as they were)",
    )


def _text(data: bytes | None) -> str | None:
    return data.decode(errors="replace") if data is not None else None


def _same_json(a: str, b: str) -> bool:
    try:
        return bool(json.loads(a) == json.loads(b))
    except ValueError:
        return False
