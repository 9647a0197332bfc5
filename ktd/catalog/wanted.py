"""What a pull of a catalog entry fetches for the variant this box runs: the
:class:`~ktd.catalog.spec.PullSpec` s the pull jobs take. Pure.

The model's repository always (``--model-path``; the native formats' CPU experts too);
for a ``kt-weights`` variant, the upload of converted CPU weights made for its
``--kt-method`` as well. ``revision`` is the pinned commit where the catalog has one,
else the ref (``main``), which the job resolves through the hub's API to a commit before
the first byte. ``dest`` is the repository's directory under ``catalog.dir``
(``ktd.catalog.ondisk``): the job writes the files under ``<dest>/<commit>/`` and the
``.ktd-complete`` marker last.
"""

from __future__ import annotations

from pathlib import Path

from ktd.catalog.ondisk import repo_dir
from ktd.catalog.schema import Entry, Source, Variant
from ktd.catalog.spec import PullSpec

__all__ = ["pull_specs"]


def _spec(source: Source, base: str | Path) -> PullSpec:
    return PullSpec(
        role=source.role,
        repo=source.repo,
        revision=source.revision or source.ref,
        patterns=tuple(source.patterns),
        dest=str(repo_dir(base, source.repo)),
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
