"""The pull jobs' driver: carries out ``ktd.core.pulljob``'s actions on worker processes
(``python -m ktd.catalog.fetch``), feeds it their JSON lines and the clock, publishes each
job on the event stream (``pull.<repo>@<revision>``) and keeps the live ones in
``<state_dir>/pulls.json``, from which the next daemon starts them again (a kill -9 of
ktd loses no job: the partial files are resumed by Range).

A worker per running job, never a thread: killable at any byte (a stall, a cancel, the
daemon's shutdown), and it dies with the daemon (``PR_SET_PDEATHSIG``), so a restarted
daemon never finds its lock held by an orphan. The catalog is injected: ``resolve``
turns a name into its ``PullSpec``s; ``fit`` checks a plan against this box.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import trio

from ktd import protocol as p
from ktd.catalog import layout, pullrate
from ktd.catalog.plan import FitCheck, PullPlan, no_fit_check
from ktd.catalog.spec import PullSpec
from ktd.control.errors import ControlError
from ktd.core.config import CatalogSection
from ktd.core.pulljob import Action, CheckFit, Job, JobState, Key, KillWorker, PullMachine, Start
from ktd.pullwire import PullFile, PullInfo, PullPlanView

log = logging.getLogger("ktd.pulls")

Resolver = Callable[[str], list[PullSpec]]
#: Told of each job that finished (``done``), with every job: the catalog side writes the
#: models.json entry of a name whose jobs are all done (``ktd.daemon.catalog.entry``).
Finished = Callable[[Job, Mapping[Key, Job]], Awaitable[None]]
Publish = Callable[[str, p.Event], None]
Offload = Callable[..., Awaitable[Any]]

#: Seconds between two looks at the clock (stalls, the queue, progress events).
TICK = 0.25
#: What a worker may print on one line (a plan of many files is the longest).
MAX_LINE = 4 << 20


def no_catalog(name: str) -> list[PullSpec]:
    raise ControlError(
        p.ErrorCode.UNKNOWN_MODEL, f"no catalog entry {name!r}: pull --repo ORG/NAME[@REV]"
    )


def spec_of_repo(ref: str) -> PullSpec:
    """``ORG/NAME[@REV]`` as a spec (the revision defaults to ``main``)."""
    repo, _, revision = ref.partition("@")
    try:
        layout.check_source(repo, revision or "main")
    except layout.BadSource as exc:
        raise ControlError(p.ErrorCode.BAD_REQUEST, str(exc)) from None
    return PullSpec(role="model", repo=repo, revision=revision or "main")


class Puller:
    def __init__(
        self,
        section: CatalogSection,
        *,
        root: Path,
        state_path: Path,
        publish: Publish,
        resolve: Resolver = no_catalog,
        fit: FitCheck = no_fit_check,
        finished: Finished | None = None,
        offload: Offload | None = None,
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        log_dir: Path | None = None,
        rate_path: Path | None = None,
    ) -> None:
        self.root = root
        self.state_path = state_path
        self.machine = PullMachine(max_pulls=section.max_pulls, stall_timeout=section.stall_timeout)
        self._publish = publish
        self._resolve = resolve
        self._fit = fit
        self._finished = finished
        self._offload = offload
        self._env = dict(os.environ if env is None else env)
        self._python = python
        self._log_dir = log_dir or state_path.parent / "pulls"
        self.rate_path = rate_path or state_path.parent / pullrate.FILE
        self._specs: dict[Key, PullSpec] = {}
        self._procs: dict[Key, trio.Process] = {}
        self._plans: dict[Key, PullPlan] = {}
        self._sent: dict[Key, tuple[Any, ...]] = {}
        self._wake = trio.Event()
        self._nursery: trio.Nursery | None = None

    # ------------------------------------------------------------ the control API

    async def resolve(self, name: str, repo: str) -> list[PullSpec]:
        """The specs of ``name`` (the catalog's resolver reads files and the machine: run
        through the offload) or of ``repo``."""
        if name and not repo and self._offload is not None:
            specs: list[PullSpec] = await self._offload(self._resolve, name)
            return self.specs(name, repo, specs)
        return self.specs(name, repo)

    def specs(self, name: str, repo: str, resolved: list[PullSpec] | None = None) -> list[PullSpec]:
        if bool(name) == bool(repo):
            raise ControlError(
                p.ErrorCode.BAD_REQUEST,
                "a pull names a catalog entry or --repo ORG/NAME[@REV], one of them",
            )
        if repo:
            specs = [spec_of_repo(repo)]
        else:
            specs = resolved if resolved is not None else self._resolve(name)
        for s in specs:
            try:
                layout.check_source(s.repo, s.revision)
            except layout.BadSource as exc:
                raise ControlError(p.ErrorCode.BAD_REQUEST, str(exc)) from None
        return specs

    def dest(self, spec: PullSpec) -> Path:
        return (
            Path(spec.dest) if spec.dest else layout.dest_for(self.root, spec.repo, spec.revision)
        )

    async def request(self, name: str, repo: str, *, force: bool = False) -> p.PullReply:
        """``ask``, the name resolved off the event loop first."""
        return self.ask(name, repo, force=force, specs=await self.resolve(name, repo))

    def ask(
        self,
        name: str,
        repo: str,
        *,
        force: bool = False,
        specs: list[PullSpec] | None = None,
    ) -> p.PullReply:
        """Start or join the job of each spec of ``name`` (or of ``repo``)."""
        specs = specs if specs is not None else self.specs(name, repo)
        now = trio.current_time()
        joined = False
        jobs = []
        for spec in specs:
            self._specs[spec.key] = spec
            job, was = self.machine.ask(spec.key, name or repo, now, force=force)
            joined = joined or was
            jobs.append(job)
        self._act([])
        return p.PullReply(jobs=[self.info(j) for j in jobs], joined=joined)

    async def dry_run(self, name: str, repo: str) -> p.PullReply:
        """The plans of ``name``'s specs, read by plan-only workers; nothing is fetched."""
        plans = []
        for spec in await self.resolve(name, repo):
            plan, kind, message = await self._plan_once(spec, job=False)
            if plan is None:
                raise ControlError(
                    p.ErrorCode.LOAD_FAILED,
                    f"{spec.repo}@{spec.revision}: {message}",
                    {"kind": kind},
                )
            problems = list(plan.problems) + await self._check(plan)
            plans.append(view(plan, problems))
        return p.PullReply(plans=plans)

    def cancel(self, name: str, repo: str) -> p.PullsReply:
        keys = self._keys_of(name, repo)
        if not keys:
            raise ControlError(p.ErrorCode.NOT_LOADED, f"no pull of {name or repo}")
        now = trio.current_time()
        self._act([a for key in keys for a in self.machine.cancel(key, now)])
        return p.PullsReply(jobs=[self.info(self.machine.jobs[k]) for k in keys])

    def jobs(self) -> list[PullInfo]:
        return [self.info(j) for j in sorted(self.machine.jobs.values(), key=lambda j: j.seq)]

    def info(self, job: Job) -> PullInfo:
        spec = self._specs.get(job.key)
        return PullInfo(
            repo=job.key[0],
            revision=job.key[1],
            names=list(job.names),
            role=spec.role if spec else "model",
            dest=str(self.dest(spec)) if spec else "",
            state=str(job.state),
            phase=job.phase,
            file=job.file,
            total=job.total,
            done=job.done,
            rate=round(job.rate, 1),
            eta=None if job.eta is None else round(job.eta, 1),
            restarts=job.restarts,
            kind=job.kind,
            message=job.message,
        )

    def _keys_of(self, name: str, repo: str) -> list[Key]:
        if repo:
            spec = spec_of_repo(repo)
            want = (
                [spec.key] if "@" in repo else [k for k in self.machine.jobs if k[0] == spec.repo]
            )
            return [k for k in want if k in self.machine.jobs]
        return [k for k, j in self.machine.jobs.items() if name in j.names]

    # ------------------------------------------------------------ the loop

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self._restore()
            task_status.started()
            while True:
                actions = self.machine.tick(trio.current_time())
                if actions:
                    self._act(actions)
                self._announce()
                with trio.move_on_after(TICK):
                    await self._wake.wait()
                self._wake = trio.Event()

    def _act(self, actions: list[Action]) -> None:
        for action in actions:
            match action:
                case Start(key=key, phase=phase, force=force):
                    assert self._nursery is not None
                    self._nursery.start_soon(self._worker, key, phase, force)
                case KillWorker(key=key, reason=reason):
                    proc = self._procs.get(key)
                    log.info("pull %s@%s: killing its worker (%s)", *key, reason)
                    if proc is not None and proc.returncode is None:
                        proc.kill()
                case CheckFit(key=key):
                    assert self._nursery is not None
                    self._nursery.start_soon(self._check_plan, key)
        # Every call follows a change of some job (an ask, an exit, a plan, a cancel):
        # the state file and the event stream learn it now, not at the next tick.
        self._save()
        self._announce()
        self._wake.set()

    def _announce(self) -> None:
        """A ``pull.`` event for each job whose state or bytes moved since the last."""
        for key, job in self.machine.jobs.items():
            info = self.info(job)
            seen = (
                info.state,
                info.phase,
                info.done,
                info.total,
                info.file,
                info.kind,
                info.restarts,
            )
            if self._sent.get(key) == seen:
                continue
            self._sent[key] = seen
            self._publish(
                f"pull.{key[0]}@{key[1]}",
                p.Event(
                    topic=f"pull.{key[0]}@{key[1]}",
                    time=trio.current_time(),
                    alias=job.names[0],
                    state=info.state,
                    pull=info,
                ),
            )

    # ------------------------------------------------------------ workers

    def _argv(self, spec: PullSpec, *, plan_only: bool, force: bool) -> list[str]:
        argv = [
            self._python, "-m", "ktd.catalog.fetch",
            "--repo", spec.repo, "--revision", spec.revision,
            "--dest", str(self.dest(spec)), "--parent", str(os.getpid()),
        ]  # fmt: skip
        for pattern in spec.patterns:
            argv += ["--pattern", pattern]
        if plan_only:
            argv.append("--plan")
        if force:
            argv.append("--force")
        return argv

    async def _run_worker(
        self,
        spec: PullSpec,
        *,
        plan_only: bool,
        force: bool,
        on_line: Callable[[dict[str, Any]], None],
        job: bool = True,
    ) -> tuple[str, str]:
        """One worker to its end: its lines to ``on_line``; (kind, message) of its end."""
        self._log_dir.mkdir(parents=True, exist_ok=True)
        logfile = self._log_dir / f"{spec.repo.replace('/', '--')}@{spec.revision}.log"
        kind, message = "died", "the worker ended without a word"
        with logfile.open("ab") as err:
            proc = await trio.lowlevel.open_process(
                self._argv(spec, plan_only=plan_only, force=force),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err.fileno(),
                env=self._env,
                start_new_session=True,
            )
            if job:  # a dry run's worker is no job's: a cancel never finds it
                self._procs[spec.key] = proc
            try:
                assert proc.stdout is not None
                buf = b""
                async for chunk in proc.stdout:
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        try:
                            obj = msgspec.json.decode(line)
                        except msgspec.DecodeError:
                            continue
                        if not isinstance(obj, dict):
                            continue
                        if obj.get("ev") == "error":
                            kind, message = (
                                str(obj.get("kind", "died")),
                                str(obj.get("message", "")),
                            )
                        elif obj.get("ev") in ("done", "plan"):
                            kind, message = "", ""
                        on_line(obj)
                    if len(buf) > MAX_LINE:
                        buf = b""
                await proc.wait()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    with trio.CancelScope(shield=True):
                        await proc.wait()
                if job:
                    self._procs.pop(spec.key, None)
        if proc.returncode not in (0, 3) and kind == "":
            kind, message = "died", f"the worker exited with {proc.returncode}"
        if proc.returncode is not None and proc.returncode < 0 and kind != "":
            kind, message = "died", f"the worker was killed by signal {-proc.returncode}"
        return kind, message

    async def _plan_once(
        self, spec: PullSpec, *, job: bool = True
    ) -> tuple[PullPlan | None, str, str]:
        got: list[PullPlan] = []

        def on_line(obj: dict[str, Any]) -> None:
            if obj.get("ev") == "plan":
                got.append(msgspec.convert(obj["plan"], PullPlan))

        kind, message = await self._run_worker(
            spec, plan_only=True, force=False, on_line=on_line, job=job
        )
        return (got[-1] if got and not kind else None), kind, message

    async def _blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Blocking work (the catalog files, the box, the rate file) through the offload
        when there is one, never on the event loop's thread."""
        if self._offload is None:
            return fn(*args)
        return await self._offload(fn, *args)

    async def _check(self, plan: PullPlan) -> list[str]:
        result: list[str] = await self._blocking(self._fit, plan)
        return result

    async def _worker(self, key: Key, phase: str, force: bool) -> None:
        spec = self._specs[key]
        machine = self.machine
        if phase == "plan":
            plan, kind, message = await self._plan_once(spec)
            now = trio.current_time()
            if plan is None:
                self._act(machine.exited(key, kind or "died", message, now))
                return
            self._plans[key] = plan
            files = {f.name: (f.size, f.present) for f in plan.files}
            self._act(machine.planned(key, files, now))
            return

        def on_line(obj: dict[str, Any]) -> None:
            if obj.get("ev") in ("file", "bytes"):
                total = int(obj.get("size", obj.get("total", 0)))
                done = int(obj.get("have", obj.get("done", 0)))
                machine.progress(key, str(obj.get("file", "")), done, total, trio.current_time())
                self._wake.set()

        job = machine.jobs.get(key)
        began, before = trio.current_time(), (job.done if job is not None else 0)
        kind, message = await self._run_worker(spec, plan_only=False, force=force, on_line=on_line)
        now = trio.current_time()
        self._act(machine.exited(key, kind, message, now))
        job = machine.jobs.get(key)
        if job is not None and job.state is JobState.DONE:
            await self._measured(job.done - before, now - began)
            if self._finished is not None:
                await self._finished(job, dict(machine.jobs))

    async def _measured(self, fetched: int, seconds: float) -> None:
        """A finished fetch's bytes over its time: this box's pull rate (``pullrate``)."""
        try:
            await self._blocking(pullrate.record, self.rate_path, fetched, seconds)
        except OSError as exc:
            log.warning("cannot write %s: %s", self.rate_path, exc)

    async def _check_plan(self, key: Key) -> None:
        plan = self._plans.get(key)
        problems = [] if plan is None else list(plan.problems) + await self._check(plan)
        self._act(self.machine.checked(key, problems, trio.current_time()))

    # ------------------------------------------------------------ the state file

    def _save(self) -> None:
        """The live jobs, for the next daemon (a finished job needs no restart)."""
        live = [
            {"spec": msgspec.to_builtins(self._specs[k]), "names": j.names, "force": j.force}
            for k, j in self.machine.jobs.items()
            if j.state in (JobState.QUEUED, JobState.RUNNING) and k in self._specs
        ]
        tmp = self.state_path.with_suffix(".tmp")
        try:
            tmp.write_bytes(msgspec.json.encode({"jobs": live}))
            os.replace(tmp, self.state_path)
        except OSError as exc:
            log.warning("cannot write %s: %s", self.state_path, exc)

    def _restore(self) -> None:
        try:
            data = msgspec.json.decode(self.state_path.read_bytes())
        except (OSError, msgspec.DecodeError):
            return
        now = trio.current_time()
        for row in data.get("jobs", []) if isinstance(data, dict) else []:
            try:
                spec = msgspec.convert(row["spec"], PullSpec)
                layout.check_source(spec.repo, spec.revision)
            except (KeyError, TypeError, msgspec.ValidationError, layout.BadSource):
                log.warning("pulls.json: a job that is no pull dropped: %r", row)
                continue
            self._specs[spec.key] = spec
            for name in row.get("names") or [spec.repo]:
                self.machine.ask(spec.key, str(name), now, force=bool(row.get("force")))
            log.info("pull %s@%s: resumed from %s", spec.repo, spec.revision, self.state_path)


def view(plan: PullPlan, problems: list[str]) -> PullPlanView:
    return PullPlanView(
        repo=plan.repo,
        revision=plan.revision,
        commit=plan.commit,
        dest=plan.dest,
        files=[
            PullFile(name=f.name, size=f.size, present=f.present, lfs=f.lfs) for f in plan.files
        ],
        total=plan.total,
        present=plan.present,
        to_fetch=plan.to_fetch,
        free=plan.free,
        margin=plan.margin,
        problems=problems,
    )
