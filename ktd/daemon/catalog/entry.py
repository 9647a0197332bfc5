"""After a pull of a catalog name: its models.json entry, written through the config desk
(issue 44 item 4).

When the last job of a name's specs is done (the model, and the CPU weights of a
``kt-weights`` variant), the entry is built for this box (``ktd.catalog.modelsentry``,
the flags from ``ktd.catalog.flags`` with the pulled config.json and safetensors headers)
and given to the desk as any change is: planned, recorded in the history as ``pull``,
written, installed. A user's model under that alias is merged, never overwritten: their
values and flags win (``ktd.catalog.entrymerge``). What happened is published as a
``models.<name>`` event (``name`` as the pull was asked, ``alias`` the entry's; ``state``:
``added``, ``merged``, ``unchanged`` or ``refused``; ``reason`` the summary, ``lines`` the
plan and the notes), which ``ktctl pull`` prints when it follows the pull. A failure
here never fails the pull: the files stay, and the event says why no entry was written.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import trio

from ktd import protocol as p
from ktd.catalog import ondisk, verify
from ktd.catalog.entrymerge import merge_entry
from ktd.catalog.flags import Sizes, derive
from ktd.catalog.modelsentry import EntryError, models_entry
from ktd.control.errors import ControlError
from ktd.core.configload import ConfigTexts
from ktd.core.pulljob import LIVE, Job, JobState, Key
from ktd.daemon.catalog.resolver import CatalogPulls, Resolution
from ktd.daemon.config.desk import ConfigDesk, Who
from ktd.daemon.engine import weights

__all__ = ["PullEntries", "build_entry"]

log = logging.getLogger("ktd.pulls")

Publish = Callable[[str, p.Event], None]
Offload = Callable[..., Awaitable[Any]]


def _config_json(path: str) -> dict[str, Any] | None:
    try:
        doc = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _sizes(path: str) -> Sizes | None:
    split = weights.weight_split(path)
    return None if split is None else Sizes(split.dense, split.replicated, split.experts)


def build_entry(res: Resolution) -> dict[str, Any]:
    """The models.json entry for a finished pull (blocking: reads the pulled files).
    ``EntryError`` when a pulled directory is not verified or the flags are refused."""
    r = res.resolved
    paths: dict[str, str] = {}
    for spec in r.specs:
        ok, problems = verify.verified(spec.dest)
        if not ok:
            raise EntryError(f"{spec.repo}@{spec.revision}: {'; '.join(problems)}")
        paths[spec.role] = spec.dest
    model = paths["model"]
    numa = ondisk.numa_count(paths["kt-weights"]) if "kt-weights" in paths else None
    topo = res.topo
    nodes = None
    if numa is not None and numa <= len(topo.nodes):  # the nodes the entry will ask for
        ranked = sorted(topo.nodes, key=lambda n: (-n.available_kb, n.id))
        nodes = sorted(n.id for n in ranked[:numa])
    d = derive(
        r.entry,
        r.variant,
        topo,
        nodes=nodes,
        model_config=_config_json(model),
        sizes=_sizes(model),
        weights_numa=numa,
    )
    # The alias is the name the pull was asked by: `ktctl pull X` then `ktctl load X`.
    return models_entry(r.entry, r.variant, paths, d, topo, alias=r.name, weights_numa=numa)


class PullEntries:
    """The Puller's ``finished`` hook."""

    def __init__(
        self,
        catalog: CatalogPulls,
        desk: Callable[[], ConfigDesk | None],
        publish: Publish,
        offload: Offload,
    ) -> None:
        self._catalog = catalog
        self._desk = desk
        self._publish = publish
        self._offload = offload

    async def finished(self, job: Job, jobs: Mapping[Key, Job]) -> None:
        for name in job.names:
            if "/" in name:  # a --repo pull: no catalog entry says what it is
                continue
            try:
                await self.write(name, jobs)
            except (ControlError, EntryError) as exc:
                self._say(name, name, "refused", f"no models.json entry written: {exc}", [])
            except Exception as exc:  # the daemon never dies of a pull's aftermath
                log.exception("pull %s: writing its models.json entry failed", name)
                self._say(name, name, "refused", f"no models.json entry written: {exc}", [])

    async def write(self, name: str, jobs: Mapping[Key, Job]) -> None:
        res: Resolution = await self._offload(self._catalog.resolution, name)
        r = res.resolved
        states = [jobs.get(s.key) for s in r.specs]
        if any(j is not None and j.state in LIVE for j in states):
            return  # another of its jobs is still going: the last one writes the entry
        if any(j is None or j.state is not JobState.DONE for j in states):
            raise EntryError(
                f"not every repository of {r.entry.name} {r.variant.name} was pulled "
                "(the catalog changed, or a job failed): pull it again"
            )
        entry: dict[str, Any] = await self._offload(build_entry, res)
        desk = self._desk()
        if desk is None:
            raise EntryError("ktd's config desk is not up yet")
        outcome: dict[str, Any] = {}

        def edit(disk: ConfigTexts) -> str | None:
            try:
                current = json.loads(disk.models) if disk.models else []
            except ValueError as exc:
                raise EntryError(f"{disk.models_name} is not JSON ({exc}): left as it is") from None
            if not isinstance(current, list):
                raise EntryError(f"{disk.models_name} is not a list of models: left as it is")
            names = [r.entry.name, *r.entry.aliases]
            models, how, notes, alias = merge_entry(current, entry, names)
            outcome.update(how=how, notes=notes, alias=alias)
            return None if how == "unchanged" else json.dumps(models, indent=2) + "\n"

        who = Who(claimed=f"ktctl pull {name}")
        reply = await desk.apply_edit(edit, who, "pull")
        how, notes = str(outcome.get("how", "")), list(outcome.get("notes", []))
        alias = str(outcome.get("alias", entry["alias"]))
        if reply is None:
            self._say(name, alias, "unchanged", f"models.json already has {alias} as pulled", notes)
            return
        plan = reply.plan
        lines = [
            f"{e.alias}: {e.action}" + (f" ({e.note})" if e.note else "") for e in plan.engines
        ]
        lines += [f"{q.level}: {q.message}" for q in plan.problems]
        verb = "added to" if how == "added" else "merged into"
        summary = f"{alias} {verb} models.json (version {reply.seq}, how: pull): {plan.summary}"
        self._say(name, alias, how, summary, [*lines, *notes])

    def _say(self, name: str, alias: str, state: str, reason: str, lines: list[str]) -> None:
        """``models.<name>``: the name the pull was asked for (what ``ktctl pull`` waits
        on); ``alias``: the models.json alias the entry has."""
        log.info("pull %s: %s", name, reason)
        topic = f"models.{name}"
        self._publish(
            topic,
            p.Event(
                topic=topic,
                time=trio.current_time(),
                alias=alias,
                state=state,
                reason=reason,
                lines=lines,
            ),
        )
