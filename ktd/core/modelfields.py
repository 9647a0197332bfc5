"""The fields of a ``models.json`` entry that people set, with what each means. Pure, light.

One table for three readers: ``config.README.txt`` (``ktd init``: JSON has no comments,
so the meanings live beside the files), ``ktctl config set`` (which reads
``FIELD=VALUE`` by the field's kind and names an unknown field), and the dashboard's
editor (a form with these fields, their meanings as help). The schema itself is
``ktd.core.config.ModelEntry``/``KtOverrides``; a test checks that every field here is
one of theirs. Imported by ktctl: the standard library and ``ktd.foreign`` only.
"""

from __future__ import annotations

from typing import Any, Literal

from ktd import foreign

__all__ = ["FIELDS", "Field", "FieldValueError", "field", "parse_value"]

Kind = Literal[
    "text",  # a string
    "int",  # a whole number
    "seconds",  # a number of seconds, >= 0
    "bool",
    "choice",  # one of ``choices``
    "numa",  # "auto", "all", "none" or a list of node ids
    "gpus",  # "auto", a count, or a list of GPU indices
    "args",  # a list of words (or one string split like a shell)
    "env",  # an object of NAME: value (or "K=V K2=V2" words)
]


class Field:
    """One field (a plain class: ktctl builds its parser from these, and a dataclass
    costs its start-up a millisecond)."""

    __slots__ = ("choices", "kind", "meaning", "name", "optional", "required")

    def __init__(
        self,
        name: str,  # as in the file: "ttl", "kt.ctx"
        kind: Kind,
        meaning: str,
        *,
        choices: tuple[str, ...] = (),
        required: bool = False,
        optional: bool = False,  # null is a value of its own ("no limit", "the default")
    ) -> None:
        self.name = name
        self.kind = kind
        self.meaning = meaning
        self.choices = choices
        self.required = required
        self.optional = optional

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "meaning": self.meaning,
            "choices": list(self.choices),
            "required": self.required,
            "optional": self.optional,
        }


FIELDS: tuple[Field, ...] = (
    Field(
        "alias",
        "text",
        "the name clients ask for (exact match; no ':', '/' or spaces)",
        required=True,
    ),
    Field("path", "text", "the Hugging Face model dir (SGLang --model)", required=True),
    Field(
        "backend",
        "text",
        '"kt": served by ktd; any other backend is listed, never served',
        required=True,
    ),
    Field("kt.kt_weight_path", "text", "the converted kt-kernel expert weights (--kt-weight-path)"),
    Field("kt.ctx", "int", "context length (--context-length); 0: the model's own"),
    Field(
        "kt.extra_args",
        "args",
        "per-model sglang.launch_server flags (instead of the ktransformers section's); "
        "kt is used only with --kt-num-gpu-experts or --kt-gpu-experts-ratio",
    ),
    Field("kt.extra_env", "env", "environment variables of the engine, added to the section's"),
    Field("kt.python", "text", "the interpreter of SGLang's venv (default: the section's)"),
    Field("kt.tp_size", "int", "tensor-parallel GPUs (--tp-size)"),
    Field("kt.port", "int", "a fixed port for the engine (0 or unset: a free one)"),
    Field(
        "numa",
        "numa",
        'placement on NUMA nodes: "auto" (one free node, or all when only one engine can '
        'run), "all", a list of node ids, or "none" (no node owned, no pinning)',
    ),
    Field("gpus", "gpus", 'GPUs: "auto", a count, or a list of GPU indices'),
    Field("ttl", "seconds", "idle seconds before it is evicted (or put to sleep); 0: never"),
    Field(
        "sleep",
        "bool",
        "true: swaps and the ttl put it to sleep (SGLang's memory saver frees its GPU "
        "memory, the experts stay in RAM) and a request wakes it in seconds",
    ),
    Field("sleep_ttl", "seconds", "seconds asleep before it is stopped (0: never)"),
    Field("restart", "choice", "restart after a crash", choices=("on-failure", "no")),
    Field("pinned", "bool", "true: never evicted to make room for another model"),
    Field("swap", "bool", "false: a load never waits for busy engines to make room (busy instead)"),
    Field(
        "fit",
        "choice",
        '"check" refuses a load whose memory estimate does not fit the planned NUMA nodes '
        'and GPUs; "ignore" loads anyway',
        choices=("check", "ignore"),
    ),
    Field(
        "max_concurrent",
        "int",
        "requests the engine serves at once (unset: no limit)",
        optional=True,
    ),
    Field(
        "max_queue",
        "int",
        "requests that may wait behind others for a slot (unset: no limit; 0: none waits)",
        optional=True,
    ),
    Field(
        "health_timeout",
        "seconds",
        "seconds a load may take (default: daemon.health_timeout)",
        optional=True,
    ),
    Field(
        "catalog",
        "text",
        "the catalog entry a pull wrote it from (its --kt-num-gpu-experts is derived: an "
        "out-of-memory load retries once with fewer); empty for an entry written by hand",
    ),
)

_BY_NAME = {f.name: f for f in FIELDS}


class FieldValueError(ValueError):
    """An unknown field, or a value its kind cannot take; the message names the field."""


def field(name: str) -> Field:
    """The field called ``name``; FieldValueError naming the known ones otherwise."""
    found = _BY_NAME.get(name)
    if found is None:
        import difflib

        close = difflib.get_close_matches(name, _BY_NAME, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise FieldValueError(
            f"{name}: not a field of a models.json entry{hint}; the fields are "
            + ", ".join(_BY_NAME)
        )
    return found


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def _number(name: str, text: str, *, whole: bool) -> int | float:
    try:
        return int(text)
    except ValueError:
        if whole:
            raise FieldValueError(f"{name}: expected a whole number, got {text!r}") from None
    try:
        value = float(text)
    except ValueError:
        raise FieldValueError(f"{name}: expected a number of seconds, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise FieldValueError(f"{name}: expected a finite number, got {text!r}")
    return value


def _ints(name: str, text: str) -> list[int]:
    """``0,1`` or ``[0, 1]``."""
    body = text.strip().removeprefix("[").removesuffix("]")
    try:
        return [int(part) for part in body.split(",") if part.strip()]
    except ValueError:
        raise FieldValueError(
            f"{name}: expected a list of numbers like 0,1, got {text!r}"
        ) from None


def parse_value(name: str, text: str) -> Any:
    """``FIELD=VALUE`` as ``ktctl config set`` reads it: ``VALUE`` by the field's kind, as
    the JSON value the file will hold (``null`` for an optional field). The daemon
    validates the whole file again; this catches a typo before a round trip."""
    f = field(name)
    if f.optional and text.strip().lower() in ("null", "none", ""):
        return None
    if f.kind == "text":
        return text
    if f.kind in ("int", "seconds"):
        value = _number(name, text.strip(), whole=f.kind == "int")
        if f.kind == "seconds" and value < 0:
            raise FieldValueError(f"{name}: must be >= 0, got {text!r}")
        return value
    if f.kind == "bool":
        low = text.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise FieldValueError(f"{name}: expected true or false, got {text!r}")
    if f.kind == "choice":
        if text not in f.choices:
            raise FieldValueError(f"{name}: expected one of {', '.join(f.choices)}, got {text!r}")
        return text
    if f.kind == "numa":
        if text in ("auto", "all", "none"):
            return text
        return _ints(name, text)
    if f.kind == "gpus":
        if text == "auto":
            return text
        if "," in text or text.strip().startswith("["):
            return _ints(name, text)
        return _number(name, text.strip(), whole=True)
    import shlex

    if f.kind == "args":
        if text.strip().startswith("["):
            return _json(name, text, list)
        try:
            return shlex.split(text)
        except ValueError as exc:
            raise FieldValueError(f"{name}: cannot split like a shell: {exc}") from None
    # env
    if text.strip().startswith("{"):
        return _json(name, text, dict)
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise FieldValueError(f"{name}: cannot split like a shell: {exc}") from None
    env: dict[str, str] = {}
    for word in words:
        key, sep, val = word.partition("=")
        if not sep or not key:
            raise FieldValueError(f"{name}: expected NAME=VALUE words, got {word!r}")
        env[key] = val
    return env


def _json(name: str, text: str, kind: type) -> Any:
    try:
        value = foreign.loads(text)
    except ValueError as exc:  # foreign.Malformed too: nested too deeply
        raise FieldValueError(f"{name}: not valid JSON: {exc}") from None
    if not isinstance(value, kind):
        raise FieldValueError(f"{name}: expected a JSON {kind.__name__}, got {text!r}")
    return value


def readme_lines(width: int = 80) -> list[str]:
    """The models.json part of ``config.README.txt``: each field and what it means."""
    import textwrap

    out: list[str] = []
    for f in FIELDS:
        head = f"  {f.name:<18}"
        if len(head) > 20:
            out.append(head.rstrip())
            head = " " * 20
        wrapped = textwrap.wrap(
            f.meaning, width - 20, break_on_hyphens=False, break_long_words=False
        ) or [""]
        out.append(head + wrapped[0])
        out.extend(" " * 20 + line for line in wrapped[1:])
    return out
