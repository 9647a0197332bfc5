"""The pull driver in-process (``ktd.catalog.pulls.Puller``) with a catalog injected:
two names of one repo share one job; a refused plan fetches nothing; the state file
brings a live job back. Real worker processes against the hub stand-in."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from ktd import protocol as p
from ktd.catalog import pullrate
from ktd.catalog.plan import PullPlan
from ktd.catalog.pulls import Puller
from ktd.catalog.spec import PullSpec
from ktd.control.errors import ControlError
from ktd.core.config import CatalogSection
from tests.catalog.conftest import MiB
from tests.hub.standin import StandIn

pytestmark = pytest.mark.e2e

CATALOG = {
    "tiny": [PullSpec(role="model", repo="org/tiny", revision="main")],
    "tiny-chat": [PullSpec(role="model", repo="org/tiny", revision="main")],
}


def resolve(name: str) -> list[PullSpec]:
    try:
        return CATALOG[name]
    except KeyError:
        raise ControlError(p.ErrorCode.UNKNOWN_MODEL, f"no catalog entry {name!r}") from None


def puller(hub: StandIn, tmp_path: Path, events: list[p.Event], **kw: Any) -> Puller:
    import os

    env = {
        **os.environ,
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(tmp_path / "hf"),
        "PYTHONPATH": str(Path(__file__).parents[2]),
    }
    return Puller(
        CatalogSection(stall_timeout=30),
        root=tmp_path / "models",
        state_path=tmp_path / "pulls.json",
        publish=lambda topic, ev: events.append(ev),
        resolve=resolve,
        env=env,
        python=sys.executable,
        **kw,
    )


async def until(pred: Any, timeout: float = 30) -> None:
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.05)


@pytest.mark.trio
async def test_two_names_of_one_repo_share_one_job(hub: StandIn, tmp_path: Path) -> None:
    events: list[p.Event] = []
    hub.rate = 8 * MiB
    pulls = puller(hub, tmp_path, events)
    async with trio.open_nursery() as nursery:
        await nursery.start(pulls.run)
        first = pulls.ask("tiny", "")
        second = pulls.ask("tiny-chat", "")
        assert not first.joined and second.joined
        assert [j.key for j in pulls.jobs()] == ["org/tiny@main"]
        assert pulls.jobs()[0].names == ["tiny", "tiny-chat"]
        await until(lambda: pulls.jobs()[0].state == "done")
        total = pulls.jobs()[0].total
        nursery.cancel_scope.cancel()
    assert hub.sent["model.safetensors"] == 4 * MiB
    # the finished pull measured this box's rate: its bytes over its fetch's seconds
    rate = pullrate.read(tmp_path / pullrate.FILE)
    assert rate is not None and rate.bytes == total and rate.seconds > 0
    seen = [e.pull for e in events if e.pull is not None]
    assert seen[-1].state == "done" and any(
        x.phase == "fetch" and 0 < x.done < x.total for x in seen
    )
    assert all(e.topic == "pull.org/tiny@main" for e in events)
    with pytest.raises(ControlError, match="no catalog entry"):
        pulls.ask("nothing", "")


@pytest.mark.trio
async def test_the_fit_check_refuses_before_a_byte_unless_forced(
    hub: StandIn, tmp_path: Path
) -> None:
    events: list[p.Event] = []
    asked: list[PullPlan] = []

    def fit(plan: PullPlan) -> list[str]:
        asked.append(plan)
        return ["host RAM: 2 GiB needed on node 0, 1 GiB free"]

    pulls = puller(hub, tmp_path, events, fit=fit)
    async with trio.open_nursery() as nursery:
        await nursery.start(pulls.run)
        dry = await pulls.dry_run("tiny", "")
        assert dry.plans[0].problems == ["host RAM: 2 GiB needed on node 0, 1 GiB free"]
        assert dry.plans[0].to_fetch == 4 * MiB + 39
        pulls.ask("tiny", "")
        await until(lambda: pulls.jobs()[0].state == "failed")
        job = pulls.jobs()[0]
        assert job.kind == "refused" and "host RAM" in job.message and not hub.sent
        pulls.ask("tiny", "", force=True)
        await until(lambda: pulls.jobs()[0].state == "done")
        nursery.cancel_scope.cancel()
    assert asked and asked[0].repo == "org/tiny"


@pytest.mark.trio
async def test_a_live_job_comes_back_from_the_state_file(hub: StandIn, tmp_path: Path) -> None:
    hub.stall_after = MiB
    pulls = puller(hub, tmp_path, [])
    async with trio.open_nursery() as nursery:
        await nursery.start(pulls.run)
        pulls.ask("tiny", "")
        await until(lambda: pulls.jobs()[0].done >= MiB)
        nursery.cancel_scope.cancel()  # the daemon's end: the worker is killed, the job kept
    saved = msgspec.json.decode((tmp_path / "pulls.json").read_bytes())
    assert [j["spec"]["repo"] for j in saved["jobs"]] == ["org/tiny"]
    hub.release()
    again = puller(hub, tmp_path, [])
    async with trio.open_nursery() as nursery:
        await nursery.start(again.run)
        assert again.jobs()[0].names == ["tiny"]
        await until(lambda: again.jobs()[0].state == "done")
        nursery.cancel_scope.cancel()
    assert msgspec.json.decode((tmp_path / "pulls.json").read_bytes()) == {"jobs": []}
    assert hub.sent["model.safetensors"] - 4 * MiB <= MiB


@pytest.mark.trio
async def test_a_names_resolution_is_offloaded_and_its_done_job_told(
    hub: StandIn, tmp_path: Path
) -> None:
    """``request`` resolves a catalog name through the offload (it reads files and runs
    nvidia-smi: never on the event loop); a job done is told to ``finished`` (the
    models.json entry's writer) with every job, once; a failed one is not."""
    offloaded: list[Any] = []
    told: list[tuple[str, str, list[str]]] = []

    async def offload(fn: Any, *args: Any) -> Any:
        offloaded.append((fn, args))
        return await trio.to_thread.run_sync(fn, *args)

    async def finished(job: Any, jobs: Any) -> None:
        told.append((str(job.state), f"{job.key[0]}@{job.key[1]}", list(jobs[job.key].names)))

    pulls = puller(hub, tmp_path, [], offload=offload, finished=finished)
    async with trio.open_nursery() as nursery:
        await nursery.start(pulls.run)
        reply = await pulls.request("tiny", "")
        assert [j.key for j in reply.jobs] == ["org/tiny@main"]
        assert (resolve, ("tiny",)) in offloaded
        await until(lambda: pulls.jobs()[0].state == "done")
        await until(lambda: bool(told))
        with pytest.raises(ControlError, match="no catalog entry"):
            await pulls.request("nothing", "")
        nursery.cancel_scope.cancel()
    assert told == [("done", "org/tiny@main", ["tiny"])]
