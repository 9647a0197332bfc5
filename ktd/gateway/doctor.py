"""``ktctl doctor``'s gateway checks: is each router reachable, and what does it list of ours.

The verdicts are pure (config + probe results → ``Check``s); the probes are one
``GET /workers`` per router, async in the daemon and blocking in the local
doctor (no daemon running: then nothing of ours should be listed as healthy).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

from ktd import foreign
from ktd.core.config import GatewaySection
from ktd.core.verdict import Check
from ktd.gateway import plan
from ktd.gateway.client import RouterClient, RouterError, parse_workers


@dataclass(frozen=True)
class RouterProbe:
    url: str
    workers: list[plan.Listed] | None = None
    error: str | None = None


def _loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def checks(
    cfg: GatewaySection,
    probes: Sequence[RouterProbe],
    *,
    instance: str | None,
    wanted: Sequence[str] = (),
    advertised_hosts: Sequence[str] = (),
) -> list[Check]:
    """``wanted``: URLs this ktd means to have registered now (its ready engines or frontend)."""
    if not cfg.routers:
        return []
    out = [_router_check(p, instance, wanted) for p in probes]
    advertise = _advertise_check(cfg.routers, advertised_hosts)
    return out + ([advertise] if advertise else [])


def _router_check(p: RouterProbe, instance: str | None, wanted: Sequence[str]) -> Check:
    """One router: reachable, and listing this ktd's workers (all of them, all healthy)."""
    name = f"gateway.{p.url}"
    if p.workers is None:
        return Check(
            name,
            "fail",
            f"router unreachable: {p.error}",
            "start sglang-router there, fix gateway.routers, or set gateway.api_key "
            "if the router wants a control-plane key; ktd keeps retrying",
        )
    ours = [w for w in p.workers if instance is not None and w.owner() == instance]
    listed = {plan.normalize_url(w.url) for w in ours}
    detail = f"reachable, {len(p.workers)} worker(s), {len(ours)} registered by this ktd"
    if ours:
        detail += ": " + ", ".join(sorted(listed))
    missing = [u for u in wanted if plan.normalize_url(u) not in listed]
    sick = [w.url for w in ours if not w.healthy]
    if missing:
        return Check(
            name,
            "warn",
            f"{detail}; not (yet) registered: {', '.join(missing)}",
            "ktd registers within gateway.reconcile_interval; if it stays missing, "
            "see the router's log (its add job health-checks the URL)",
        )
    if sick:
        return Check(
            name,
            "warn",
            f"{detail}; failing the router's health check: {', '.join(sick)}",
            "the router cannot reach that URL: check gateway.advertise and firewalls",
        )
    return Check(name, "ok", detail)


def _advertise_check(routers: Sequence[str], advertised_hosts: Sequence[str]) -> Check | None:
    """Workers advertised on a loopback address that a router on another host cannot reach."""
    remote = [u for u in routers if not _loopback(urlsplit(u).hostname or "")]
    local = sorted({h for h in advertised_hosts if _loopback(h)})
    if not (remote and local):
        return None
    return Check(
        "gateway.advertise",
        "warn",
        f"workers are advertised on {', '.join(local)} but router(s) "
        f"{', '.join(remote)} run elsewhere",
        "set gateway.advertise to this host's address the routers can reach "
        "(and bind the engines/frontend there)",
    )


async def probe_async(cfg: GatewaySection, http: httpx.AsyncClient) -> list[RouterProbe]:
    out = []
    for url in cfg.routers:
        client = RouterClient(url, http, api_key=cfg.api_key, timeout=cfg.timeout)
        try:
            out.append(RouterProbe(client.base_url, await client.list_workers()))
        except RouterError as exc:
            out.append(RouterProbe(client.base_url, error=str(exc)))
    return out


def probe_sync(cfg: GatewaySection) -> list[RouterProbe]:
    out = []
    headers = {"authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    with httpx.Client(trust_env=False, timeout=cfg.timeout, headers=headers) as http:
        for url in cfg.routers:
            base = plan.normalize_url(url)
            try:
                r = http.get(base + "/workers")
                if r.status_code != 200:
                    raise RouterError(f"GET /workers: HTTP {r.status_code}")
                out.append(RouterProbe(base, parse_workers(foreign.json_any(r.content))))
            except (httpx.HTTPError, OSError, RouterError, ValueError, KeyError) as exc:
                out.append(RouterProbe(base, error=str(exc)))
    return out
