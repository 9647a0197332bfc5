"""Secrets in the config, chosen by marking the fields that hold them (issue 43).

A field of the config's types (``ktd.core.config``) that holds a secret says so in its
annotation: ``Annotated[str | None, SECRET]`` (``frontend.keys[].key``, the gateway's
keys, ``frontend.api_keys``), ``SECRET_ENV`` (``extra_env``: every variable's value; an
environment holds tokens under any name, and a name says nothing sure of its value),
``SECRET_FLAGS`` (``extra_args``: the values of SGLang's own secret flags). A new
secret field is marked where it is declared; nothing here matches names (a name-based
list hid ``KTD_SIM_TOKEN_RATE`` and would have shown a new key field by default).

Everything here walks a JSON document (as ``json.loads`` gives it, valid or not against
the types) guided by a type: ``redact`` rewrites each secret value where it is (to a
mark, back from a mark, to ``(hidden)``) and keeps the document's form (a ``"K=V"``
string stays one). Pure.
"""

from __future__ import annotations

import json
import re
import shlex
import types
import typing
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any, Union

import msgspec

__all__ = [
    "HIDDEN",
    "MARK",
    "SECRET",
    "SECRET_ENV",
    "SECRET_FLAGS",
    "SECRET_FLAG_NAMES",
    "MarkError",
    "found",
    "hints",
    "holds_secret",
    "mask_text",
    "places",
    "redact",
    "unmask_text",
]

#: SGLang's flags whose value is a secret (its ``server_args``: ``--api-key``,
#: ``--admin-api-key``, ``--ssl-keyfile-password``).
SECRET_FLAG_NAMES = frozenset({"--api-key", "--admin-api-key", "--ssl-keyfile-password"})

#: How a secret is shown to someone who may not see it; sent back unchanged, it keeps it.
MARK = "\u2022\u2022\u2022\u2022 secret #{} (unchanged)"
_MARK = re.compile("\u2022\u2022\u2022\u2022 secret #(\\d+) \\(unchanged\\)")
#: How a plan shows a secret value (it is never given back).
HIDDEN = "(hidden)"


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


SECRET = _Marker("SECRET")  # the value (a string, or each string of a list)
SECRET_ENV = _Marker("SECRET_ENV")  # each variable's value, in any of extra_env's forms
SECRET_FLAGS = _Marker("SECRET_FLAGS")  # the values of SECRET_FLAG_NAMES in extra_args


class MarkError(ValueError):
    """A mark that names no secret, or stands where no secret was."""


Rewrite = Callable[[str, str], str]  # (value, place) -> value


@cache
def hints(cls: type) -> dict[str, Any]:
    """A Struct's fields and their types, markers included."""
    return typing.get_type_hints(cls, include_extras=True)


def _marker(tp: Any) -> tuple[_Marker | None, Any]:
    if typing.get_origin(tp) is typing.Annotated:
        base, *meta = typing.get_args(tp)
        for m in meta:
            if isinstance(m, _Marker):
                return m, base
        return _marker(base)
    return None, tp


def redact(doc: Any, tp: Any, fn: Rewrite, at: str = "$") -> Any:
    """``doc`` with ``fn(value, place)`` in place of each secret value the type ``tp``
    marks (a new document; ``doc`` is not changed). ``place`` says where it stands:
    ``$.frontend.keys[0].key``, ``$[2].kt.extra_env.HF_TOKEN``,
    ``$[0].kt.extra_args.--api-key``."""
    marker, tp = _marker(tp)
    if marker is SECRET:
        if isinstance(doc, str):
            return fn(doc, at)
        if isinstance(doc, list):
            return [fn(v, f"{at}[{i}]") if isinstance(v, str) else v for i, v in enumerate(doc)]
        return doc
    if marker is SECRET_ENV:
        return _env(doc, fn, at)
    if marker is SECRET_FLAGS:
        return _flags(doc, fn, at)
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        if not isinstance(doc, dict):
            return doc
        fields = hints(tp)
        return {
            k: redact(v, fields[k], fn, f"{at}.{k}") if k in fields else v for k, v in doc.items()
        }
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        for arg in args:  # the first member that changes it (a Struct or a list of them)
            out = redact(doc, arg, fn, at)
            if out != doc:
                return out
        return doc
    if origin in (list, tuple) and isinstance(doc, list) and args:
        return [redact(v, args[0], fn, f"{at}[{i}]") for i, v in enumerate(doc)]
    if origin is dict and isinstance(doc, dict) and len(args) == 2:
        return {k: redact(v, args[1], fn, f"{at}.{k}") for k, v in doc.items()}
    return doc


def _env(doc: Any, fn: Rewrite, at: str) -> Any:
    if isinstance(doc, dict):
        return {k: fn(v, f"{at}.{k}") if isinstance(v, str) else v for k, v in doc.items()}
    if isinstance(doc, list):
        return [_env_word(w, fn, at) if isinstance(w, str) else w for w in doc]
    if isinstance(doc, str):
        words = _split(doc)
        if words is None:  # cannot be read as words: all of it
            return fn(doc, at)
        out = [_env_word(w, fn, at) for w in words]
        return doc if out == words else shlex.join(out)
    return doc


def _env_word(word: str, fn: Rewrite, at: str) -> str:
    name, eq, value = word.partition("=")
    return f"{name}={fn(value, f'{at}.{name}')}" if eq else fn(word, at)


def _flags(doc: Any, fn: Rewrite, at: str) -> Any:
    if isinstance(doc, list):
        return _flag_words(doc, fn, at)
    if isinstance(doc, str):
        words = _split(doc)
        if words is None:
            return fn(doc, at)
        out = _flag_words(words, fn, at)
        return doc if out == words else shlex.join(out)
    return doc


def _flag_words(words: list[Any], fn: Rewrite, at: str) -> list[Any]:
    out: list[Any] = []
    flag_before: str | None = None
    for word in words:
        if not isinstance(word, str):
            out.append(word)
            flag_before = None
            continue
        if flag_before is not None and not word.startswith("--"):
            out.append(fn(word, f"{at}.{flag_before}"))
            flag_before = None
            continue
        flag, eq, value = word.partition("=")
        secret = flag in SECRET_FLAG_NAMES
        flag_before = flag if secret and not eq else None
        out.append(f"{flag}={fn(value, f'{at}.{flag}')}" if eq and secret else word)
    return out


def _split(text: str) -> list[str] | None:
    try:
        return shlex.split(text)
    except ValueError:
        return None


def found(doc: Any, tp: Any, into: list[str] | None = None) -> list[str]:
    """The secret values in ``doc``, each once, in order (added to ``into``)."""
    out = into if into is not None else []

    def keep(value: str, at: str) -> str:
        if value and value not in out:
            out.append(value)
        return value

    redact(doc, tp, keep)
    return out


def places(doc: Any, tp: Any) -> dict[str, set[str]]:
    """Each secret value of ``doc`` and the places it stands."""
    out: dict[str, set[str]] = {}

    def keep(value: str, at: str) -> str:
        out.setdefault(value, set()).add(at)
        return value

    redact(doc, tp, keep)
    return out


@cache
def holds_secret(tp: Any) -> bool:
    """Whether a value of type ``tp`` can hold a secret (a marked field, or one within)."""
    marker, tp = _marker(tp)
    if marker is not None:
        return True
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return any(holds_secret(h) for h in hints(tp).values())
    return any(holds_secret(a) for a in typing.get_args(tp) if a is not Ellipsis)


def numbered(secrets: Sequence[str]) -> Rewrite:
    """Each secret to its mark (``#1`` is the first of ``secrets``); others as they are."""
    index = {s: n for n, s in enumerate(secrets, start=1)}
    return lambda v, at: MARK.format(index[v]) if v in index else v


def mask_text(text: str, tp: Any, secrets: Sequence[str]) -> str | None:
    """``text`` (a JSON file of type ``tp``) with each secret where ``tp`` marks one
    replaced by its mark, in the file's own layout when that is sure (else the document
    dumped again). None: the text is no JSON, so its secrets cannot be found."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    expected = redact(doc, tp, numbered(secrets))
    if expected == doc:
        return text
    longest = sorted(enumerate(secrets, start=1), key=lambda item: -len(item[1]))
    for quote in ('"', ""):  # whole strings first ("1" must not mark every 1 in the file)
        masked = text
        for n, secret in longest:
            for spelled in {json.dumps(secret, ensure_ascii=False), json.dumps(secret)}:
                inner = spelled[1:-1]
                masked = masked.replace(f"{quote}{inner}{quote}", f"{quote}{MARK.format(n)}{quote}")
        if _is(masked, expected):
            return masked
    return json.dumps(expected, indent=2, ensure_ascii=False) + "\n"


def _is(text: str, doc: Any) -> bool:
    try:
        return bool(json.loads(text) == doc)
    except ValueError:
        return False


def unmask_text(
    text: str, tp: Any, secrets: Sequence[str], may: Callable[[int, str], bool] | None = None
) -> str:
    """A text given back with marks: each mark where ``tp`` marks a secret becomes that
    secret again (MarkError for one that names none, or, with ``may``, for one that
    ``may(n, place)`` says may not stand there: a secret goes back where it stood, never
    to a place that would send it elsewhere). A mark anywhere else stays the text it is.
    A text that is no JSON is returned as it is (the plan then says so)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return text

    def back(value: str, at: str) -> str:
        def one(m: re.Match[str]) -> str:
            n = int(m.group(1))
            if not 1 <= n <= len(secrets):
                raise MarkError(f"secret #{n}: there is no such secret any more; type its value")
            if may is not None and not may(n, at):
                raise MarkError(
                    f"{at}: secret #{n} stood elsewhere; a secret goes back only where it "
                    "was: type the value"
                )
            return secrets[n - 1]

        return _MARK.sub(one, value)

    expected = redact(doc, tp, back)
    if expected == doc:
        return text
    restored = text
    for n in range(len(secrets), 0, -1):  # #12 before #1
        spelled = json.dumps(secrets[n - 1], ensure_ascii=False)[1:-1]
        restored = restored.replace(MARK.format(n), spelled)
    if _is(restored, expected):
        return restored
    return json.dumps(expected, indent=2, ensure_ascii=False) + "\n"
