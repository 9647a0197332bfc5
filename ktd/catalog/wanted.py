"""What a pull of a catalog entry fetches for the variant this box runs: the
:class:`~ktd.catalog.spec.PullSpec` s the pull jobs take. Pure.

The model's repository always (``--model-path``; the native formats' CPU experts too);
for a ``kt-weights`` variant, the upload of converted CPU weights made for its
``--kt-method`` as well. ``revision`` is the pinned commit where the catalog has one,
else the ref (``main``), which the job resolves through the hub's API to a commit before
the first byte (recorded in the verified marker; the directory keeps the ref's name).
``dest`` is the pull's directory under ``catalog.dir``,
``<org>--<name>/<revision>/`` (``ktd.catalog.layout``): the job writes the files there and
``.ktd/verified.json`` last (``ktd.catalog.ondisk`` reads it back).
"""

from __future__ import annotations

from pathlib import Path

from ktd.catalog.layout import dest_for
from ktd.catalog.schema import Entry, Source, Variant
from ktd.catalog.spec import PullSpec

__all__ = ["pull_specs"]


def _spec(source: Source, base: str | Path) -> PullSpec:
    revision = source.revision or source.ref
    return PullSpec(
        role=source.role,
        repo=source.repo,
        revision=revision,
        patterns=tuple(source.patterns),
        dest=str(dest_for(Path(base), source.repo, revision)),
    )


def pull_specs(entry: Entry, variant: Variant, base: str | Path) -> tuple[PullSpec, ...]:
    model = entry.source("model")
    assert model is not None  # the loader refuses an entry without one
    specs = [_spec(model, base)]
    if variant.weights == "kt-weights":
        weights = entry.source("kt-weights", variant.kt_method)
        assert weights is not None  # the loader refuses a variant whose source is missing
        specs.append(_spec(weights, base))
    return tuple(specs)
