"""``ktctl load NAME`` for a catalog name not pulled yet (issue 44 item 5): not in
models.json, or there with a model directory that is not on disk.

Without ``--pull`` the load is refused as before (``unknown_model``, a non-zero exit),
but the message says the name is in ktd's catalog, what a pull of it would fetch (the
bytes to fetch as the hub's metadata says through a dry-run ``pull``, else the
catalog's own disk figure) and how long that takes at this box's last measured pull
rate (``ktd.catalog.pullrate``, in the ``catalog`` report), and the command to run.
With ``--pull`` the pull is started (or joined) and followed with ``ktctl pull``'s
progress bar; once it is done and ktd knows the name (the pull writes its models.json
entry through the config desk) the load runs as any other.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from typing import Any

from ktctl import pullcmd
from ktctl.argtable import arg
from ktctl.client import Client, KtdError
from ktd import protocol as p

__all__ = ["ARGS", "cmd_load", "not_pulled"]

Handler = Callable[[Client, argparse.Namespace], int]

#: Seconds a dry run may take to read the hub's metadata before the catalog's figure is
#: used instead.
DRY_RUN_TIMEOUT = 20.0
#: Seconds to wait, after the pull is done, for ktd to know the name (its entry written).
ENTRY_WAIT = 30.0
GB = 1_000_000_000
#: Preflight's words for a model directory that is not there (``ktd.daemon.engine.preflight``).
MISSING = re.compile(r"preflight: .*model_path \S+ does not exist")


#: ``load``'s flags beside ALIAS, --no-wait and --timeout (rows of ``ktctl.argtable``).
ARGS = (
    arg(
        "--dry-run",
        action="store_true",
        help="print the plan (command, env, NUMA nodes, CPUs, GPUs, evictions); start nothing",
    ),
    arg(
        "--estimate",
        action="store_true",
        help="print the memory estimate and whether it fits (host RAM, GPU); start nothing",
    ),
    arg(
        "--pull",
        action="store_true",
        help="a catalog name not pulled yet: pull it first (with progress), then load it",
    ),
)


def catalog_entry(client: Client, name: str) -> dict[str, Any] | None:
    """The catalog report's entry for ``name`` (a name or an alias), or None (none is
    called so, or the catalog could not be asked: the load's own error is then said)."""
    try:
        reply = client.request(p.Catalog(name=name), timeout=max(client.timeout, 30.0))
    except KtdError:
        return None
    assert isinstance(reply, p.CatalogReply)
    models = reply.report.get("models") or []
    if not models:
        return None
    entry: dict[str, Any] = dict(models[0])
    entry["pull_rate"] = reply.report.get("pull_rate")
    return entry


def fetch_size(client: Client, name: str, entry: dict[str, Any]) -> tuple[int | None, str]:
    """The bytes a pull of ``name`` would fetch and where the figure comes from: the
    hub's metadata (a dry-run ``pull``), else the catalog's ``needs.disk_gb``."""
    try:
        reply = client.request(p.Pull(name=name, dry_run=True), timeout=DRY_RUN_TIMEOUT)
    except KtdError:
        reply = None
    if isinstance(reply, p.PullReply) and reply.plans:
        return sum(plan.to_fetch for plan in reply.plans), "hub"
    disk = (entry.get("needs") or {}).get("disk_gb")
    if isinstance(disk, int | float) and not isinstance(disk, bool) and disk > 0:
        return int(disk * GB), "catalog"
    return None, ""


def not_pulled(client: Client, alias: str, entry: dict[str, Any], exc: KtdError) -> KtdError:
    """The refusal (``exc``'s code) of a load of a catalog name not pulled: size, time,
    the command, and what ktd serves instead (as the plain refusal says)."""
    size, source = fetch_size(client, alias, entry)
    rate_doc = entry.get("pull_rate") or {}
    rate = rate_doc.get("bytes_per_second") if isinstance(rate_doc, dict) else None
    rate = float(rate) if isinstance(rate, int | float) and rate > 0 else None
    seconds = size / rate if (size is not None and rate) else None
    what = f"{alias} is in ktd's catalog ({entry.get('name', alias)}) but not pulled"
    if size is None:
        what += "; its size is not known before the pull"
    else:
        what += (
            f": a pull fetches {pullcmd.size(size)} (the hub's metadata)"
            if source == "hub"
            else f": a pull fetches about {size / GB:,.0f} GB (the catalog's figure)"
        )
        if seconds is not None and rate is not None:
            what += (
                f", about {pullcmd.duration(seconds)} at this box's last pull rate "
                f"({pullcmd.size(rate)}/s)"
            )
        else:
            what += "; no pull has finished here yet to time it"
    command = f"ktctl load {alias} --pull"
    served = exc.detail.get("models")
    serves = ""
    if isinstance(served, list) and exc.code == p.ErrorCode.UNKNOWN_MODEL:
        serves = f"; ktd serves: {', '.join(str(m) for m in served) or 'nothing'}"
    return KtdError(
        exc.code,
        f"{what}. Run: {command} (or `ktctl pull {alias}`, then `ktctl load {alias}`){serves}",
        {
            **exc.detail,
            "alias": alias,
            "catalog": entry.get("name", alias),
            "pulled": False,
            "bytes": size,
            "bytes_from": source or None,
            "rate": rate,
            "seconds": None if seconds is None else round(seconds, 1),
            "command": command,
        },
    )


def _pull(client: Client, alias: str, as_json: bool) -> bool:
    """Start (or join) the pull and follow it to its end: True when it is done."""
    with client.subscribe(["pull."]) as sub:
        reply = client.request(p.Pull(name=alias), timeout=max(client.timeout, 30.0))
        assert isinstance(reply, p.PullReply)
        if reply.joined and not as_json:
            print("joining the pull already running", flush=True)
        try:
            jobs = pullcmd.follow(client, sub, {j.key: j for j in reply.jobs}, as_json)
        except KeyboardInterrupt:
            raise SystemExit(pullcmd.interrupted(client, alias, "")) from None
    return all(j.state == "done" for j in jobs.values())


def _not_on_disk(exc: KtdError) -> bool:
    """A models.json entry whose model directory is not there (preflight's refusal)."""
    return exc.code == p.ErrorCode.LOAD_FAILED and bool(MISSING.search(exc.message))


def _known(client: Client, alias: str) -> bool:
    return any(m.alias == alias for m in client.models())


def cmd_load(client: Client, args: argparse.Namespace, load: Handler) -> int:
    """``load`` with a catalog name's answer: the refusal that says what a pull takes,
    or with ``--pull`` the pull, its bar, then the load."""
    alias: str = args.alias
    try:
        return load(client, args)
    except KtdError as exc:
        if exc.code != p.ErrorCode.UNKNOWN_MODEL and not _not_on_disk(exc):
            raise
        entry = catalog_entry(client, alias)
        if entry is None or (exc.code == p.ErrorCode.UNKNOWN_MODEL and entry.get("configured")):
            raise  # not a catalog name, or one models.json has under another of its names
        if not args.pull or args.dry_run or args.estimate:
            raise not_pulled(client, alias, entry, exc) from None
    as_json = bool(getattr(args, "json", False))
    if not _pull(client, alias, as_json):
        raise KtdError(
            p.ErrorCode.LOAD_FAILED,
            f"the pull of {alias} did not finish (`ktctl pulls` says why); nothing loaded",
            {"alias": alias},
        )
    deadline = time.monotonic() + ENTRY_WAIT
    while not _known(client, alias):
        if time.monotonic() > deadline:
            raise KtdError(
                p.ErrorCode.UNKNOWN_MODEL,
                f"{alias} is pulled, but models.json has no entry for it after "
                f"{ENTRY_WAIT:g}s (`ktctl config` shows the config; `ktctl catalog {alias}` "
                "the flags worked out for it)",
                {"alias": alias, "pulled": True},
            )
        time.sleep(0.2)
    if not as_json and sys.stdout.isatty():
        print(f"pulled {alias}; loading it", flush=True)
    return load(client, args)
