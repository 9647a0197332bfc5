"""A request for a catalog name that is not pulled (issue 44 item 5).

The daemon knows only models.json; a name it does not know may still be one of the
catalog's (``ktd/catalog``), whose files are simply not on this host yet. Such a request
gets a 404 that says so and gives the command, in its API's own error shape (the
``not_pulled`` kind of ``errors.KINDS``, raised as the daemon's ``unknown_model`` with
``detail["catalog"]``: every route already maps that error to its shape).

An HTTP request never starts a download of hundreds of GB on its own: only when
config.json's ``catalog.http_pulls`` allows it does it ask the daemon for the pull
(joining one already running) and wait for it as for a load, then ask for its engine
again once ktd knows the name (the pull's models.json entry is written by the daemon).

The catalog is read once, in a worker thread, on the first unknown name: the frontend
reads its config once at start, and the catalog is part of it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path

import trio

from ktd import protocol as p
from ktd.catalog.load import LoadedCatalog, load
from ktd.control.errors import ControlError
from ktd.core.config import CatalogSection

log = logging.getLogger("ktd.frontend.notpulled")

__all__ = ["NotPulled"]

Request = Callable[..., Awaitable[p.Reply]]
#: Seconds between two looks at the pull's job while a request waits for it.
POLL = 0.25
#: Seconds a request waits, after its pull is done, for ktd to know the name.
ENTRY_WAIT = 30.0
DONE, ENDED = "done", frozenset({"done", "failed", "cancelled"})


class NotPulled:
    def __init__(self, section: CatalogSection, config_dir: str, request: Request) -> None:
        self.section = section
        self.base = Path(config_dir) if config_dir else None
        self._request = request
        self._catalog: LoadedCatalog | None = None
        self._lock = trio.Lock()

    async def catalog(self) -> LoadedCatalog:
        async with self._lock:
            if self._catalog is None:
                files, base = list(self.section.files), self.base
                self._catalog = await trio.to_thread.run_sync(lambda: load(files, base=base))
            return self._catalog

    async def entry(self, model: str, served: Collection[str] = ()) -> str | None:
        """The catalog entry ``model`` names (a name or an alias), or None; None too when
        ktd serves that entry under another of its names (``served``): it is pulled."""
        try:
            found = (await self.catalog()).find(model)
        except (OSError, ValueError) as exc:  # the loader keeps problems; never fail a 404
            log.warning("catalog not read: %s", exc)
            return None
        if found is None or any(n in served for n in (found.name, *found.aliases)):
            return None
        return found.name

    def refusal(self, model: str, name: str, exc: ControlError) -> ControlError:
        command = f"ktctl load {model} --pull"
        return ControlError(
            p.ErrorCode.UNKNOWN_MODEL,
            exc.message,
            {**exc.detail, "catalog": name, "command": command},
        )

    async def pull(self, model: str) -> None:
        """Start or join the pull of ``model`` and wait for its end; raises the daemon's
        error, or ``load_failed`` when the pull did not finish."""
        reply = await self._request(p.Pull(name=model), timeout=30.0)
        assert isinstance(reply, p.PullReply)
        keys = {j.key for j in reply.jobs}
        jobs = {j.key: j for j in reply.jobs}
        while any(j.state not in ENDED for j in jobs.values()):
            await trio.sleep(POLL)
            now = await self._request(p.Pulls(), timeout=10.0)
            assert isinstance(now, p.PullsReply)
            jobs.update({j.key: j for j in now.jobs if j.key in keys})
        bad = [j for j in jobs.values() if j.state != DONE]
        if bad:
            why = "; ".join(f"{j.key} {j.state}: {j.kind} {j.message}".strip() for j in bad)
            raise ControlError(
                p.ErrorCode.LOAD_FAILED,
                f"the pull of {model} did not finish: {why}",
                {"reason": f"the pull of {model} did not finish: {why}"},
            )

    async def settle(self, model: str, exc: Exception) -> None:
        """The claim of ``model`` failed with ``exc``: raise what the client is told (the
        error itself, or a catalog name's refusal), or, when ``catalog.http_pulls`` lets
        this request pull, pull and return once ktd knows the name (ask again, once)."""
        if not isinstance(exc, ControlError) or exc.code != p.ErrorCode.UNKNOWN_MODEL:
            raise exc
        models = exc.detail.get("models")
        served = [m for m in models if isinstance(m, str)] if isinstance(models, list) else []
        name = await self.entry(model, served)
        if name is None:
            raise exc
        if not self.section.http_pulls:
            raise self.refusal(model, name, exc)
        await self.pull(model)
        with trio.move_on_after(ENTRY_WAIT):
            while True:
                reply = await self._request(p.Models(), timeout=10.0)
                assert isinstance(reply, p.ModelsReply)
                if any(m.alias == model for m in reply.models):
                    return
                await trio.sleep(POLL)
        raise ControlError(
            p.ErrorCode.LOAD_FAILED,
            f"{model} is pulled, but ktd has no models.json entry for it after {ENTRY_WAIT:g}s",
            {"reason": f"{model} is pulled, but models.json has no entry for it"},
        )
