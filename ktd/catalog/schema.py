"""The catalog file's format: what ktd knows about a model it can fetch and launch.

A catalog file is JSON: ``{"catalog": 1, "models": [entry, ...]}``. The built-in one
ships in the package (``ktd/catalog/builtin.json``); the operator's own are named in
config.json (``catalog.files``). Every struct forbids unknown fields, so a misspelt key is
an error naming the file and the field (``$.models[3].variants[0].kt_metod``), never a
silently ignored value. ``docs/catalog.md`` is the reference; each fact an entry states
carries its source in ``refs`` (a URL or a repository path), and a fact nobody could
source is ``null`` with a ``note`` saying so: never a guess.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

__all__ = [
    "FORMAT",
    "CatalogFile",
    "Defaults",
    "Entry",
    "Needs",
    "Source",
    "Variant",
]

#: The format this ktd reads. A file of another number is refused (named), the rest of
#: the catalog still loads.
FORMAT = 1

Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[a-z0-9][a-z0-9._-]*$")]
Repo = Annotated[
    str, msgspec.Meta(min_length=3, max_length=200, pattern=r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
]
Commit = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{40}$")]
Ref = Annotated[str, msgspec.Meta(min_length=1, max_length=500)]
Text = Annotated[str, msgspec.Meta(max_length=4000)]
Flag = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
CpuFlag = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9_]+$", max_length=40)]
KtMethod = Annotated[str, msgspec.Meta(pattern=r"^[A-Z0-9_]+$", max_length=40)]
Gb = Annotated[float, msgspec.Meta(gt=0, le=1e6)]  # GB, as the sources state it
Role = Literal["model", "kt-weights"]


class _Struct(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    pass


class Source(_Struct, kw_only=True, frozen=True):
    """One hub repository an entry's files come from.

    ``role``: ``model`` (``--model-path``: what SGLang loads on the GPU, and for the
    native formats the CPU experts too) or ``kt-weights`` (``--kt-weight-path``: an
    upload of CPU weights already converted, e.g. AMX INT4). ``revision``: the pinned
    commit (40 hex digits) when a source for it exists; ``null`` when none does, and then
    the pull resolves ``ref`` (a branch, ``main``) through the hub's API to a commit and
    records that commit (``docs/catalog.md``, "Revisions"). ``numa_count``: for an upload
    of AMX weights, the NUMA count it was converted for when a source says so; the count
    is read from the weights themselves after the pull in any case.
    """

    role: Role
    repo: Repo
    revision: Commit | None = None
    ref: Annotated[str, msgspec.Meta(min_length=1, max_length=100)] = "main"
    patterns: list[Annotated[str, msgspec.Meta(min_length=1, max_length=200)]] = []
    numa_count: Annotated[int, msgspec.Meta(ge=1, le=64)] | None = None
    methods: list[KtMethod] = []  # kt-weights: the --kt-method(s) these weights are for
    note: Text = ""
    refs: list[Ref] = []


class Variant(_Struct, kw_only=True, frozen=True):
    """One way to run the entry: a ``--kt-method``, the CPU features it needs (every flag
    of ``cpu``, as ``/proc/cpuinfo`` spells them), and where its CPU weights come from:
    ``model`` (the native formats: the model's own files), ``kt-weights`` (a
    ``kt-weights`` source: an upload converted for a NUMA count) or ``convert`` (a
    conversion ktd does not run; ``convert`` says the command). Variants are listed in
    order of preference: the first one this box can run is chosen."""

    name: Name
    kt_method: KtMethod | None = None  # None: a plain SGLang model (no kt-kernel)
    cpu: list[CpuFlag] = []
    weights: Literal["model", "kt-weights", "convert"] = "model"
    convert: Text = ""
    args: list[Flag] = []  # this variant's own flags (after the entry's defaults)
    host_ram_gb: Gb | None = None  # what the CPU experts take in host RAM, when sourced
    gpu_expert_gb: Gb | None = None  # GPU memory one --kt-num-gpu-experts step takes
    note: Text = ""
    refs: list[Ref] = []


class Defaults(_Struct, kw_only=True, frozen=True):
    """SGLang/kt flags the entry's sources give, passed as they are (origin ``catalog``;
    a user's flag wins), and the parsers (``--tool-call-parser``, ``--reasoning-parser``)."""

    args: list[Flag] = []
    tool_call_parser: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    reasoning_parser: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    ctx: Annotated[int, msgspec.Meta(ge=0, le=1 << 24)] | None = None
    min_gpu_experts: Annotated[int, msgspec.Meta(ge=0, le=4096)] = 0
    note: Text = ""
    refs: list[Ref] = []


class Needs(_Struct, kw_only=True, frozen=True):
    """What the entry takes, as its sources state it (GB; ``null``: not sourced).
    ``experts``: how the expert sizes are read once the files are here (config.json's
    fields, the safetensors headers)."""

    disk_gb: Gb | None = None
    host_ram_gb: Gb | None = None
    gpu_mem_gb: Gb | None = None
    gpu: bool = True  # SGLang runs attention on a CUDA GPU; kt only moves experts
    experts: Text = ""
    note: Text = ""
    refs: list[Ref] = []


class Entry(_Struct, kw_only=True, frozen=True):
    """One model the catalog knows: its names, sources, variants, defaults and needs."""

    name: Name
    aliases: list[Name] = []
    family: Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
    description: Text = ""
    sources: list[Source]
    variants: list[Variant]
    defaults: Defaults = Defaults()
    needs: Needs = Needs()
    notes: list[Text] = []
    refs: list[Ref] = []

    def source(self, role: str, method: str | None = None) -> Source | None:
        """The source of ``role`` (for ``kt-weights``, the one made for ``method``)."""
        for s in self.sources:
            if s.role == role and (method is None or role == "model" or method in s.methods):
                return s
        return None

    def variant(self, name: str) -> Variant | None:
        return next((v for v in self.variants if v.name == name), None)


class CatalogFile(_Struct, kw_only=True, frozen=True):
    """A whole catalog file."""

    catalog: int
    models: list[Entry] = []
