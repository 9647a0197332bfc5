"""The dashboard's config editor, its pure part: what a browser is shown of models.json,
and how what it sends back becomes the text the daemon plans and applies (issue 39).

Only models.json: config.json holds the keys (``frontend.api_keys``, ``frontend.keys``,
the gateway's), and a page must neither show them nor lock its own holder out.

Secrets never reach a browser (as in the cards, ``view.py``): a value of an
``extra_env`` variable or an ``extra_args`` flag whose name says key, token, secret or
password is shown as ``•••• secret #N (unchanged)``; what comes back with that mark
gets the value of the version the page was given again, so an admin can change a
model's TTL without ever seeing (or retyping) its Hugging Face token. The marks are
replaced in the text itself, so the file keeps its layout; where a secret cannot be
found as written (an escaped spelling), the view is the document dumped again, never
the secret.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from typing import Any

from ktd import foreign
from ktd import protocol as p
from ktd.core import configtext, modelfields
from ktd.frontend.ui.view import is_secret

__all__ = [
    "ChangeError",
    "editor_view",
    "mask_value",
    "secrets_of",
    "text_for",
    "unmask_text",
]

MARK = "\u2022\u2022\u2022\u2022 secret #{} (unchanged)"
_MARK = re.compile("\u2022\u2022\u2022\u2022 secret #(\\d+) \\(unchanged\\)")
_ESCAPED_MARK = re.compile(r"\\u2022\\u2022\\u2022\\u2022 secret #(\d+) \(unchanged\)", re.I)


class ChangeError(ValueError):
    """What the page sent cannot be made into a models.json (said to the page: 400)."""


def _words(value: Any) -> list[str]:
    if isinstance(value, list):
        return [w for w in value if isinstance(w, str)]
    if isinstance(value, str):
        try:
            return shlex.split(value)
        except ValueError:
            return value.split()
    return []


def secrets_of(entries: Sequence[Any]) -> list[str]:
    """The secret values in models.json's entries, in order, each once."""
    out: list[str] = []

    def add(value: Any) -> None:
        if isinstance(value, str) and value and value not in out:
            out.append(value)

    for entry in entries:
        kt = entry.get("kt") if isinstance(entry, dict) else None
        if not isinstance(kt, dict):
            continue
        env = kt.get("extra_env")
        if isinstance(env, dict):
            for name, value in env.items():
                if is_secret(name):
                    add(value)
        else:
            for word in _words(env):
                name, _, value = word.partition("=")
                if is_secret(name):
                    add(value)
        words = _words(kt.get("extra_args"))
        for i, word in enumerate(words):
            if not word.startswith("--"):
                continue
            flag, eq, value = word.partition("=")
            if not is_secret(flag):
                continue
            if eq:
                add(value)
            elif i + 1 < len(words) and not words[i + 1].startswith("--"):
                add(words[i + 1])
    return out


def _by_length(secrets: Sequence[str]) -> list[tuple[int, str]]:
    return sorted(enumerate(secrets, start=1), key=lambda item: -len(item[1]))


def mask_value(value: Any, secrets: Sequence[str]) -> Any:
    """``value`` (JSON) with every secret in its strings replaced by its mark."""
    if isinstance(value, str):
        for n, secret in _by_length(secrets):
            value = value.replace(secret, MARK.format(n))
        return value
    if isinstance(value, list):
        return [mask_value(v, secrets) for v in value]
    if isinstance(value, dict):
        return {k: mask_value(v, secrets) for k, v in value.items()}
    return value


def mask_text(text: str, secrets: Sequence[str]) -> str:
    """models.json's text with the secrets marked, in its own layout when that is sure."""
    masked = text
    for n, secret in _by_length(secrets):
        for spelled in {json.dumps(secret, ensure_ascii=False)[1:-1], json.dumps(secret)[1:-1]}:
            masked = masked.replace(spelled, MARK.format(n))
    expected = mask_value(foreign.loads(text), secrets)
    try:
        if foreign.loads(masked) == expected:
            return masked
    except ValueError:
        pass
    return json.dumps(expected, indent=2, ensure_ascii=False) + "\n"


def _unmark(match: re.Match[str], secrets: Sequence[str], escape: bool) -> str:
    n = int(match.group(1))
    if not 1 <= n <= len(secrets):
        raise ChangeError(f"secret #{n}: there is no such secret any more; type its value")
    value = secrets[n - 1]
    return json.dumps(value, ensure_ascii=False)[1:-1] if escape else value


def unmask_text(text: str, secrets: Sequence[str]) -> str:
    """A text from the page with each mark back to its secret."""
    out = _MARK.sub(lambda m: _unmark(m, secrets, True), text)
    return _ESCAPED_MARK.sub(lambda m: _unmark(m, secrets, True), out)


def unmask_value(value: Any, secrets: Sequence[str]) -> Any:
    if isinstance(value, str):
        return _MARK.sub(lambda m: _unmark(m, secrets, False), value)
    if isinstance(value, list):
        return [unmask_value(v, secrets) for v in value]
    if isinstance(value, dict):
        return {k: unmask_value(v, secrets) for k, v in value.items()}
    return value


def _current_secrets(models_text: str | None) -> list[str]:
    if models_text is None:
        return []
    try:
        return secrets_of(configtext.entries(models_text))
    except configtext.EditError:
        return []


def editor_view(got: p.ConfigReply, history: p.ConfigHistoryReply) -> dict[str, Any]:
    """What the editor is given: models.json (marked), its entries, the fields with their
    meanings, and the history."""
    secrets = _current_secrets(got.models_text)
    entries: list[dict[str, Any]] = []
    text = got.models_text
    problem = None
    if text is not None:
        try:
            parsed = configtext.entries(text)
        except configtext.EditError as exc:
            parsed, problem = [], str(exc)
        entries = [
            {"index": i, "alias": e.get("alias"), "entry": mask_value(e, secrets)}
            for i, e in enumerate(parsed)
        ]
        # A text that does not parse cannot be searched for secrets: not shown at all.
        text = mask_text(text, secrets) if problem is None else None
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
    """The models.json text a page's change makes of the files now: its raw text
    (``models_text``) or one entry from the form (``alias`` + ``entry``), marks back to
    their secrets. ChangeError says what is wrong with it."""
    secrets = _current_secrets(models_text)
    raw = body.get("models_text")
    if isinstance(raw, str):
        if len(raw) > p.MAX_CONFIG_TEXT:
            raise ChangeError(f"models_text: more than {p.MAX_CONFIG_TEXT} characters")
        return unmask_text(raw, secrets)
    alias, entry = body.get("alias"), body.get("entry")
    if not isinstance(alias, str) or not isinstance(entry, dict):
        raise ChangeError("expected models_text, or alias and entry")
    if models_text is None:
        raise ChangeError("there is no models.json to change")
    try:
        index = configtext.find_entry(models_text, alias)
        return configtext.replace_entry(models_text, index, unmask_value(entry, secrets))
    except configtext.EditError as exc:
        raise ChangeError(str(exc)) from None


def shown_plan(plan: p.ConfigPlanView, *texts: str | None) -> Any:
    """A plan as the page may see it: the values of every secret in ``texts`` marked."""
    secrets: list[str] = []
    for text in texts:
        for s in _current_secrets(text):
            if s not in secrets:
                secrets.append(s)
    from msgspec import to_builtins

    return mask_value(to_builtins(plan), secrets)
