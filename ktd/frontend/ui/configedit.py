"""The dashboard's config editor, its pure part: what a browser is shown of models.json,
and how what it sends back becomes the text the daemon plans and applies (issue 39).

Only models.json: config.json holds the keys (``frontend.api_keys``, ``frontend.keys``,
the gateway's), and a page must neither show them nor lock its own holder out.

Secrets never reach a browser, and the frontend never holds them: it asks the daemon
for the files ``delegated`` (for an admin key, docs/security.md), and the daemon marks
every secret where the config's types mark one (``ktd.core.secret``: every value of
``extra_env``, the values of SGLang's secret flags in ``extra_args``) as
``•••• secret #N (unchanged)``. What comes back with a mark is sent on as it is; the
daemon puts the secret back where it stood, so an admin can change a model's TTL
without ever seeing (or retyping) its Hugging Face token.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ktd import protocol as p
from ktd.core import configtext, modelfields

__all__ = ["ChangeError", "editor_view", "shown_plan", "text_for"]


class ChangeError(ValueError):
    """What the page sent cannot be made into a models.json (said to the page: 400)."""


def editor_view(got: p.ConfigReply, history: p.ConfigHistoryReply) -> dict[str, Any]:
    """What the editor is given: models.json (its secrets marked by the daemon), its
    entries, the fields with their meanings, and the history."""
    entries: list[dict[str, Any]] = []
    text = got.models_text if got.redacted else None  # never a text the daemon did not mark
    problem = None if got.redacted else "the daemon did not mark the secrets: not shown"
    if text is not None:
        try:
            parsed = configtext.entries(text)
        except configtext.EditError as exc:
            parsed, problem, text = [], str(exc), None
        entries = [{"index": i, "alias": e.get("alias"), "entry": e} for i, e in enumerate(parsed)]
    return {
        "version": got.version,
        "running": got.running,
        "models_path": got.models_path,
        "models_text": text,
        "problem": problem,
        "entries": entries,
        "fields": [f.to_dict() for f in modelfields.FIELDS],
        "history": [_version(v) for v in history.versions],
        "keep": history.keep,
    }


def _version(v: p.ConfigVersion) -> dict[str, Any]:
    return {
        "seq": v.seq,
        "version": v.version,
        "time": v.time,
        "how": v.how,
        "uid": v.uid,
        "user": v.user,
        "claimed": v.claimed,
        "what": v.what,
        "rollback_of": v.rollback_of,
    }


def text_for(body: dict[str, Any], models_text: str | None) -> str:
    """The models.json text a page's change makes of the files now (``models_text``, as
    the daemon marked it): its raw text (``models_text``) or one entry from the form
    (``alias`` + ``entry``), marks left for the daemon. ChangeError says what is wrong."""
    raw = body.get("models_text")
    if isinstance(raw, str):
        if len(raw) > p.MAX_CONFIG_TEXT:
            raise ChangeError(f"models_text: more than {p.MAX_CONFIG_TEXT} characters")
        return raw
    alias, entry = body.get("alias"), body.get("entry")
    if not isinstance(alias, str) or not isinstance(entry, dict):
        raise ChangeError("expected models_text, or alias and entry")
    if models_text is None:
        raise ChangeError("there is no models.json to change")
    try:
        index = configtext.find_entry(models_text, alias)
        return configtext.replace_entry(models_text, index, entry)
    except configtext.EditError as exc:
        raise ChangeError(str(exc)) from None


def shown_plan(plan: p.ConfigPlanView) -> Any:
    """A plan as the page is sent it (the daemon hid its secrets: asked ``delegated``)."""
    return msgspec.to_builtins(plan)
