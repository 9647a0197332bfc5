"""Pure gateway decisions: what ktd wants registered, and how to get the router there.

No I/O and no clock: every function maps data to data, so the rules (never
touch another host's workers, keep an engine that is being re-adopted, remove
what this ktd registered and no longer serves) are tested without a router.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ktd.core import states as S

#: The label that marks a worker as registered by one ktd instance (host + state dir).
OWNER_LABEL = "ktd_instance"

WILDCARD_HOSTS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class Worker:
    """One registration ktd wants on every router."""

    url: str
    model_id: str
    labels: tuple[tuple[str, str], ...] = ()
    alias: str | None = None  # the engine it stands for (None: the frontend)

    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)


@dataclass(frozen=True)
class Listed:
    """One worker in a router's ``GET /workers``."""

    id: str
    url: str
    model_id: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    healthy: bool = True

    def owner(self) -> str | None:
        return self.labels.get(OWNER_LABEL)


@dataclass(frozen=True)
class Action:
    kind: Literal["add", "remove", "update"]
    url: str
    reason: str
    worker: Worker | None = None  # add
    worker_id: str | None = None  # remove


@dataclass(frozen=True)
class Local:
    """What the plan needs of an engine (a snapshot; the pool builds it)."""

    alias: str
    state: str
    host: str
    port: int | None
    numa_nodes: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()
    leaving: bool = False  # deregistration asked (drain, evict, reload restart)
    adopting: bool = False  # re-adopted after a ktd restart, not yet confirmed ready


@dataclass(frozen=True)
class Desired:
    """``workers`` must be registered; URLs in ``keep`` are left as they are."""

    workers: tuple[Worker, ...] = ()
    keep: frozenset[str] = frozenset()


def normalize_url(url: str) -> str:
    return url.rstrip("/")


def url_host(host: str) -> str:
    """A host as it goes in a URL (IPv6 bracketed)."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


def advertised_host(bind_host: str, advertise: str | None, fqdn: str | None = None) -> str:
    """Where a router on another host reaches a service bound to ``bind_host``.

    The configured ``advertise`` wins; a wildcard bind is reached by the host's
    name; a specific bind (127.0.0.1 included: a router on this host) as is.
    """
    if advertise:
        return advertise.rsplit(":", 1)[0] if _has_port(advertise) else advertise
    if bind_host in WILDCARD_HOSTS:
        # gethostname, not getfqdn: no DNS lookup (this runs in the daemon's event loop).
        return fqdn or socket.gethostname()
    return bind_host


def _has_port(hostport: str) -> bool:
    if hostport.startswith("["):
        return "]:" in hostport
    return hostport.count(":") == 1


def frontend_url(bind: str, advertise: str | None, fqdn: str | None = None) -> str:
    """The frontend's URL for a router: ``advertise`` (host or host:port) over ``bind``."""
    host, _, port = bind.rpartition(":")
    host = host.strip("[]")
    if advertise and _has_port(advertise):
        return f"http://{advertise}"
    return f"http://{url_host(advertised_host(host, advertise, fqdn))}:{port}"


def base_labels(instance: str, host_name: str, extra: Mapping[str, str]) -> dict[str, str]:
    """Labels on every worker: the operator's, then ktd's own (``ktd_instance`` always ktd's)."""
    labels = {"host": host_name}
    labels.update(extra)
    labels[OWNER_LABEL] = instance
    return labels


def _csv(values: Iterable[int]) -> str:
    return ",".join(str(v) for v in values)


def engine_worker(
    e: Local, *, advertise: str | None, labels: Mapping[str, str], fqdn: str | None = None
) -> Worker:
    host = url_host(advertised_host(e.host, advertise, fqdn))
    own = dict(labels)
    own.setdefault("alias", e.alias)
    own.setdefault("numa_nodes", _csv(e.numa_nodes))
    own.setdefault("gpus", _csv(e.gpus))
    return Worker(
        url=f"http://{host}:{e.port}",
        model_id=e.alias,
        labels=tuple(sorted(own.items())),
        alias=e.alias,
    )


def desired_engines(
    engines: Sequence[Local],
    *,
    advertise: str | None,
    labels: Mapping[str, str],
    shutting_down: bool = False,
    fqdn: str | None = None,
) -> Desired:
    """``engines`` mode: every ready engine that is not leaving; adopted ones are kept.

    An engine a restarted ktd is re-adopting was serving a moment ago and most
    likely still is: removing it and adding it back would only cost capacity, so
    its registration is left alone until the supervisor has decided.
    """
    workers: list[Worker] = []
    keep: set[str] = set()
    for e in engines:
        if e.port is None:
            continue
        w = engine_worker(e, advertise=advertise, labels=labels, fqdn=fqdn)
        if e.state == S.READY and not e.leaving and not shutting_down:
            workers.append(w)
        elif e.adopting and not e.leaving and e.state in (S.STOPPED, S.STARTING):
            keep.add(w.url)
    return Desired(tuple(workers), frozenset(keep))


def desired_frontend(
    url: str, model_id: str, labels: Mapping[str, str], *, up: bool, shutting_down: bool
) -> Desired:
    """``frontend`` mode: the frontend, while it answers and ktd is not stopping."""
    if not up or shutting_down:
        return Desired()
    return Desired((Worker(url=url, model_id=model_id, labels=tuple(sorted(labels.items()))),))


def reconcile(desired: Desired, seen: Sequence[Listed], instance: str) -> list[Action]:
    """The router's view → the actions that make it ``desired``.

    * a desired URL the router lacks → add;
    * a worker this ktd registered (its ``ktd_instance`` label) that is neither
      desired nor kept → remove; so is one of ours registered under a stale model;
    * one of ours whose labels drifted (a reload changed them) → update in place
      (``PUT /workers/{id}``: no gap in routing);
    * anything else (other hosts' workers, static ``--worker-urls``) is never touched:
      a desired URL the router already has under another owner counts as present.

    Removals come first, so a model_id change is remove-then-add of one URL.
    """
    by_url: dict[str, list[Listed]] = {}
    for s in seen:
        by_url.setdefault(normalize_url(s.url), []).append(s)
    want = {normalize_url(w.url): w for w in desired.workers}
    keep = {normalize_url(u) for u in desired.keep}
    removes: list[Action] = []
    adds: list[Action] = []
    updates: list[Action] = []
    for url, entries in sorted(by_url.items()):
        for s in entries:
            if s.owner() != instance:
                continue
            w = want.get(url)
            if w is None and url not in keep:
                removes.append(Action("remove", url, "not served here any more", worker_id=s.id))
            elif w is not None and s.model_id and s.model_id != w.model_id:
                removes.append(
                    Action("remove", url, f"registered as {s.model_id!r}", worker_id=s.id)
                )
            elif w is not None and any(s.labels.get(k) != v for k, v in w.labels):
                # The router adds labels of its own (model_path...): only ours are compared.
                updates.append(Action("update", url, "labels changed", worker=w, worker_id=s.id))
    removed = {a.url for a in removes}
    for url, w in sorted(want.items()):
        if url not in by_url or (url in removed and len(by_url[url]) == 1):
            adds.append(Action("add", url, "ready, not registered", worker=w))
    return removes + adds + updates


def registration_state(url: str, desired: Desired, seen: Sequence[Listed] | None) -> str:
    """One engine's registration on one router, for ``ktctl status``.

    ``registered`` / ``unhealthy`` (listed; the router's health check failing),
    ``registering`` (wanted, not listed yet), ``deregistering`` (listed, not
    wanted), ``absent``, or ``unknown`` (the router has not answered yet).
    """
    if seen is None:
        return "unknown"
    u = normalize_url(url)
    listed = [s for s in seen if normalize_url(s.url) == u]
    wanted = any(normalize_url(w.url) == u for w in desired.workers)
    kept = u in {normalize_url(k) for k in desired.keep}
    if listed and (wanted or kept):
        return "registered" if all(s.healthy for s in listed) else "unhealthy"
    if listed:
        return "deregistering"
    return "registering" if wanted else "absent"


def backoff(failures: int, base: float, cap: float) -> float:
    """Seconds before the next try after ``failures`` consecutive failures (exponential)."""
    if failures <= 0:
        return 0.0
    return float(min(cap, base * (2 ** (failures - 1))))
