"""``FIELD+=VALUE`` and ``FIELD-=VALUE`` of ``ktctl config set`` (issue 43): one flag added
to or taken out of a model's ``kt.extra_args``, one variable to or out of its
``kt.extra_env``, where ``FIELD=VALUE`` replaces the whole value (and a user who meant to
add ``--kt-method AMXINT4`` lost every other flag, unsaid). Pure and light: ktctl imports it.

* ``kt.extra_args+=--enable-metrics``, ``kt.extra_args+='--kt-method AMXINT4'``: the words
  (split like a shell, or a JSON list) go at the end of the list; a model without a list
  of its own starts from the ``ktransformers`` section's (its list replaces the section's,
  so starting empty would drop those).
* ``kt.extra_args-=--kt-method``: that flag and its values (the words after it up to the
  next ``-`` word), and any ``--kt-method=...``, wherever they are;
  ``kt.extra_args-='--x 1'`` (several words, or one with ``=``): that exact run of words.
  Taking out what is not there is an error that shows the list.
* ``kt.extra_env+=NAME=VALUE ...`` sets those variables (the others stay);
  ``kt.extra_env-=NAME ...`` removes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ktd.core import modelfields
from ktd.core.modelfields import FieldValueError

Op = Literal["=", "+=", "-="]

#: The kinds of field ``+=`` and ``-=`` work on.
MERGEABLE = ("args", "env")


def split(word: str) -> tuple[str, Op, str]:
    """``FIELD=VALUE``, ``FIELD+=VALUE`` or ``FIELD-=VALUE``: (field, op, value text)."""
    name, sep, raw = word.partition("=")
    if not sep:
        raise FieldValueError(
            f"{word!r}: expected FIELD=VALUE, FIELD+=VALUE or FIELD-=VALUE "
            "(fields: ktctl config set --help)"
        )
    if name.endswith("+"):
        return name[:-1], "+=", raw
    if name.endswith("-"):
        return name[:-1], "-=", raw
    return name, "=", raw


def check(name: str, op: Op) -> None:
    """Refuse ``+=``/``-=`` on a field that is no list of words or map."""
    f = modelfields.field(name)
    if op != "=" and f.kind not in MERGEABLE:
        raise FieldValueError(
            f"{name}{op}: {op} adds to or takes from a list of flags or a map of variables "
            f"(kt.extra_args, kt.extra_env); {name} is set whole with {name}=VALUE"
        )


def parse_names(name: str, text: str) -> list[str]:
    """The variable names of ``kt.extra_env-=A B`` (``A=x`` counts as ``A``)."""
    import shlex

    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise FieldValueError(f"{name}: cannot split like a shell: {exc}") from None
    names = [w.partition("=")[0] for w in words if w.partition("=")[0]]
    if not names:
        raise FieldValueError(f"{name}-=: name the variables to remove")
    return names


def apply(name: str, op: Op, current: Any, text: str) -> Any:
    """The field's new value: ``current`` (its value now: the entry's own, or what it
    starts from) with ``text`` added or taken out as ``op`` says."""
    f = modelfields.field(name)
    if op == "=":
        return modelfields.parse_value(name, text)
    if f.kind == "args":
        now = [str(w) for w in current] if isinstance(current, list) else []
        words = modelfields.parse_value(name, text)
        if not words:
            raise FieldValueError(f"{name}{op}: give the flag(s), e.g. {name}{op}--enable-metrics")
        return now + words if op == "+=" else remove_words(name, now, words)
    env = {str(k): str(v) for k, v in current.items()} if isinstance(current, Mapping) else {}
    if op == "+=":
        return {**env, **modelfields.parse_value(name, text)}
    missing = [n for n in parse_names(name, text) if n not in env]
    if missing:
        raise FieldValueError(
            f"{name} has no {', '.join(missing)}; it holds {', '.join(env) or 'nothing'}"
        )
    gone = set(parse_names(name, text))
    return {k: v for k, v in env.items() if k not in gone}


def remove_words(name: str, now: Sequence[str], words: Sequence[str]) -> list[str]:
    """``now`` without ``words``: a lone flag with its values (and its ``=`` form),
    anything else as that exact run of words (the first one)."""
    out: list[str] = []
    if len(words) == 1 and words[0].startswith("-") and "=" not in words[0]:
        flag = words[0]
        i = 0
        while i < len(now):
            if now[i] == flag:
                i += 1
                while i < len(now) and not now[i].startswith("-"):
                    i += 1
                continue
            if not now[i].startswith(flag + "="):
                out.append(now[i])
            i += 1
        if len(out) == len(now):
            raise FieldValueError(f"{name} has no {flag}; it is {list(now)}")
        return out
    n = len(words)
    for i in range(len(now) - n + 1):
        if list(now[i : i + n]) == list(words):
            return [*now[:i], *now[i + n :]]
    raise FieldValueError(f"{name} has no {' '.join(words)}; it is {list(now)}")
