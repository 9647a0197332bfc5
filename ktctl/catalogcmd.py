"""``ktctl catalog [NAME]``: what the model catalog knows, which variant fits this box and
why, what is already on disk; with NAME, one entry with its launch flags worked out and
the arithmetic behind ``--kt-num-gpu-experts``. The daemon answers (``catalog``, protocol
1.2): it holds the config and reads the machine as placement does. Plain text (no
colour), or the daemon's report as one JSON document with ``--json``.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from ktctl import render
from ktctl.argtable import Subcommand, arg
from ktctl.client import Client
from ktd import protocol as p

__all__ = ["COMMAND", "entry_text", "list_text", "run"]

GB = 1_000_000_000


def run(client: Client, args: argparse.Namespace) -> int:
    reply = client.request(p.Catalog(name=args.name), timeout=max(client.timeout, 30.0))
    if not isinstance(reply, p.CatalogReply):
        raise TypeError(f"unexpected reply {type(reply).__name__}")
    report = reply.report
    if getattr(args, "json", False):
        print(render.dumps(report))
    elif args.name:
        print(entry_text(report))
    else:
        print(list_text(report))
    return 0


#: ``ktctl catalog [NAME]``, a row of the CLI's table (``ktctl.argtable``).
COMMAND = Subcommand(
    "catalog",
    "the model catalog: what ktd can fetch, which variant fits this box and why, "
    "what is on disk; with NAME, the launch flags worked out for this box",
    run,
    (arg("name", nargs="?", metavar="NAME", help="one entry (a name or an alias)"),),
)


def _gb(n: Any) -> str:
    return f"{n / GB:,.0f} GB" if isinstance(n, int | float) else "-"


def box_text(box: Mapping[str, Any]) -> list[str]:
    extras = "+".join(box.get("isa_extras") or [])
    isa = box.get("isa", "?") + (f" ({extras})" if extras else "")
    nodes = box.get("numa_nodes", 0)
    lines = [
        f"this box: {box.get('cpu_model') or 'unknown CPU'}: {isa}, "
        f"{box.get('physical_cores', 0)} cores, {nodes} NUMA node{'s' if nodes != 1 else ''}, "
        f"{_gb(box.get('ram_bytes'))} RAM"
    ]
    for g in box.get("gpus") or []:
        free = _gb(g["memory_free"])
        lines.append(f"  GPU {g['index']}: {g['name']}, {_gb(g['memory_total'])} ({free} free)")
    if not box.get("gpus"):
        lines.append(f"  no GPU: {box.get('gpu_error') or 'nvidia-smi lists none'}")
    return lines


def _disk(model: Mapping[str, Any]) -> str:
    pulls = model.get("on_disk") or []
    done = [d for d in pulls if d["complete"]]
    roles = sorted({d["role"] for d in done})
    mine = "in models.json" if model.get("configured") else ""
    if done:
        text = ", ".join(roles) + f" ({_gb(sum(d['bytes'] for d in done))})"
    elif pulls:
        text = f"partial ({_gb(sum(d['bytes'] for d in pulls))})"
    else:
        return mine or "-"
    return f"{text}; {mine}" if mine else text


def problems_text(report: Mapping[str, Any]) -> list[str]:
    lines = []
    if report.get("problems"):
        lines += ["", "catalog files with problems (left out; the rest loaded):"]
        lines += [f"  {q['file']}: {q['field']}: {q['message']}" for q in report["problems"]]
    for note in report.get("notes") or []:
        lines.append(f"note: {note}")
    return lines


def list_text(report: Mapping[str, Any]) -> str:
    rows = []
    for m in report.get("models") or []:
        choice = m["choice"]
        fits = choice["chosen"] or "none"
        method = next(
            (v["kt_method"] for v in choice["variants"] if v["name"] == choice["chosen"]), None
        )
        if method:
            fits += f" ({method})"
        rows.append([m["name"], m["family"], fits, _disk(m)])
    lines = box_text(report.get("box") or {})
    lines += [f"models go to {report.get('dir')}", ""]
    lines.append(render.table(["NAME", "FAMILY", "FITS THIS BOX", "ON DISK"], rows))
    lines += problems_text(report)
    lines.append("")
    lines.append("`ktctl catalog NAME`: why each variant does or does not fit, and the flags")
    return "\n".join(lines)


def _variants(choice: Mapping[str, Any]) -> list[str]:
    lines = [f"variant: {choice['why']}"]
    for v in choice["variants"]:
        mark = "*" if v["name"] == choice["chosen"] else ("+" if v["fits"] else "x")
        head = f"  {mark} {v['name']} ({v['kt_method'] or 'plain SGLang'}, weights: {v['weights']})"
        lines.append(head)
        lines += [f"      no: {r}" for r in v["reasons"]]
        if v["unknown"]:
            lines.append(f"      not checked (no source states it): {', '.join(v['unknown'])}")
    return lines


def _sources(entry: Mapping[str, Any], model: Mapping[str, Any]) -> list[str]:
    lines = ["sources:"]
    for s in entry.get("sources") or []:
        rev = s["revision"] or f"{s['ref']} (no pinned commit: resolved at the pull)"
        lines.append(f"  {s['role']}: {s['repo']} @ {rev}")
        for d in model.get("on_disk") or []:
            if d["repo"] == s["repo"]:
                state = "complete" if d["complete"] else "partial"
                lines.append(
                    f"    on disk: {d['commit'][:12]} {state}, {_gb(d['bytes'])}: {d['path']}"
                )
    return lines


def _needs(needs: Mapping[str, Any]) -> str:
    parts = [
        f"{what} {_gb(needs[key] * GB) if needs.get(key) else 'unknown'}"
        for what, key in (("disk", "disk_gb"), ("RAM", "host_ram_gb"), ("GPU", "gpu_mem_gb"))
    ]
    return "needs: " + ", ".join(parts)


def flags_lines(flags: Mapping[str, Any]) -> list[str]:
    """The flags with their origins, and the arithmetic (``ktctl pull --dry-run`` too)."""
    rows = [
        [
            f["flag"] + ("" if not f["values"] else " " + " ".join(f["values"])),
            f["origin"],
            f["why"],
        ]
        for f in flags.get("flags") or []
    ]
    lines = ["flags for this box (origin: catalog, derived, user; yours win):"]
    lines += ["  " + line for line in render.table(["FLAG", "ORIGIN", "WHY"], rows).splitlines()]
    if flags.get("arithmetic"):
        lines.append("--kt-num-gpu-experts:")
        lines += [f"  {line}" for line in flags["arithmetic"]]
    lines += [f"refused: {r}" for r in flags.get("refusals") or []]
    lines += [f"note: {n}" for n in flags.get("notes") or []]
    return lines


def entry_text(report: Mapping[str, Any]) -> str:
    [model] = report["models"]
    entry = model.get("entry") or {}
    aliases = ", ".join(model.get("aliases") or []) or "none"
    lines = [
        f"{model['name']} ({model['family']}): {model.get('description', '')}",
        f"aliases: {aliases}; from {model.get('file')}",
        *box_text(report.get("box") or {}),
        "",
        *_variants(model["choice"]),
        "",
        *_sources(entry, model),
        _needs(model.get("needs") or {}),
    ]
    if model.get("flags"):
        lines += ["", *flags_lines(model["flags"])]
    lines += [f"note: {n}" for n in _all_notes(entry)]
    lines += problems_text(report)
    return "\n".join(lines)


def _all_notes(entry: Mapping[str, Any]) -> Sequence[str]:
    return list(entry.get("notes") or [])
