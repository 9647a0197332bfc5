"""The fields of a ``models.json`` entry, with what each means: the one table of them. Pure, light.

Every field of an entry is here once, with what the rest of ktd needs to know of it:
its kind (how ``ktctl config set`` reads ``FIELD=VALUE``), its meaning (``config.README.txt``
from ``ktd init``: JSON has no comments; the dashboard's form, as help), the config.json
setting under it (``default``), whether it shapes the engine's launch (``launch``: a
change restarts the engine; ``ModelSpec.launch_key`` and the plan's diff are read off
it), and whether it may hold a secret (``secret``). The schema is
``ktd.core.config.ModelEntry``/``KtOverrides``, typed for msgspec and mypy; a test holds
the two to each other field for field, and the secret marks to the types' (which the
redaction reads). Imported by ktctl: the standard library and ``ktd.foreign`` only.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from ktd import foreign

__all__ = [
    "ENTRY",
    "FIELDS",
    "LAUNCH",
    "SECTION_ONLY",
    "Field",
    "FieldValueError",
    "field",
    "parse_value",
]

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


class Field(NamedTuple):
    """One field (a named tuple: ktctl builds its parser from these, and a dataclass
    costs its start-up a millisecond)."""

    name: str  # as in the file: "ttl", "kt.ctx"
    kind: Kind
    meaning: str
    choices: tuple[str, ...] = ()
    required: bool = False
    optional: bool = False  # null is a value of its own ("no limit", "the default")
    default: str = ""  # the config.json setting under it ("ktransformers.ctx"); "": none
    launch: bool = False  # shapes the engine's argv, env or placement: a change restarts it
    secret: bool = False  # may hold a secret (the types mark it too: the redaction's)

    @property
    def spec(self) -> str:
        """Its name in a resolved model (``ModelSpec``): ``kt.ctx`` is ``ctx``."""
        return self.name.removeprefix("kt.")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "meaning": self.meaning,
            "choices": list(self.choices),
            "required": self.required,
            "optional": self.optional,
        }


#: The fields people set (``ktctl config set``, the dashboard's form, the README).
FIELDS: tuple[Field, ...] = (
    Field(
        "alias",
        "text",
        "the name clients ask for (exact match; no ':', '/' or spaces)",
        required=True,
    ),
    Field(
        "path", "text", "the Hugging Face model dir (SGLang --model)", required=True, launch=True
    ),
    Field(
        "backend",
        "text",
        '"kt": served by ktd; any other backend is listed, never served',
        required=True,
    ),
    Field(
        "kt.kt_weight_path",
        "text",
        "the converted kt-kernel expert weights (--kt-weight-path)",
        default="ktransformers.kt_weight_path",
        launch=True,
    ),
    Field(
        "kt.ctx",
        "int",
        "context length (--context-length); 0: the model's own",
        default="ktransformers.ctx",
        launch=True,
    ),
    Field(
        "kt.extra_args",
        "args",
        "per-model sglang.launch_server flags (instead of the ktransformers section's); "
        "kt is used only with --kt-num-gpu-experts or --kt-gpu-experts-ratio",
        default="ktransformers.extra_args",
        launch=True,
        secret=True,
    ),
    Field(
        "kt.extra_env",
        "env",
        "environment variables of the engine, added to the section's",
        default="ktransformers.extra_env",
        launch=True,
        secret=True,
    ),
    Field(
        "kt.python",
        "text",
        "the interpreter of SGLang's venv (default: the section's)",
        default="ktransformers.python",
        launch=True,
    ),
    Field("kt.tp_size", "int", "tensor-parallel GPUs (--tp-size)", launch=True),
    Field("kt.port", "int", "a fixed port for the engine (0 or unset: a free one)", launch=True),
    Field(
        "numa",
        "numa",
        'placement on NUMA nodes: "auto" (one free node, or all when only one engine can '
        'run), "all", a list of node ids, or "none" (no node owned, no pinning)',
        launch=True,
    ),
    Field("gpus", "gpus", 'GPUs: "auto", a count, or a list of GPU indices', launch=True),
    Field("ttl", "seconds", "idle seconds before it is evicted (or put to sleep); 0: never"),
    Field(
        "sleep",
        "bool",
        "true: swaps and the ttl put it to sleep (SGLang's memory saver frees its GPU "
        "memory, the experts stay in RAM) and a request wakes it in seconds",
        launch=True,  # SGLang's memory saver is a flag of the launch
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
        default="daemon.health_timeout",
    ),
    Field(
        "catalog",
        "text",
        "the catalog entry a pull wrote it from (its --kt-num-gpu-experts is derived: an "
        "out-of-memory load retries once with fewer); empty for an entry written by hand",
    ),
)

#: The multi-node fields: in the schema, refused for a kt model (``ktd.core.configcheck``:
#: kt engines cannot span hosts), so nobody is offered them; the plan still names them.
_MULTI_NODE: tuple[Field, ...] = (
    Field("kt.nnodes", "int", "hosts of one engine (--nnodes)", launch=True),
    Field("kt.dist_init_addr", "text", "the engine's rendezvous (--dist-init-addr)", launch=True),
    Field("kt.nodes", "text", "the hosts of a multi-node engine"),
)

#: Every field of a models.json entry, the schema's own (a test holds them to it).
ENTRY: tuple[Field, ...] = FIELDS + _MULTI_NODE

#: A resolved model's values that no entry sets, only config.json's ktransformers
#: section: (its name in the model, the setting, whether it shapes the launch).
SECTION_ONLY: tuple[tuple[str, str, bool], ...] = (
    ("host", "ktransformers.host", True),
    ("auto_build", "ktransformers.auto_build", False),
    ("served", "ktransformers.enabled", False),
)

#: A resolved model's values that shape its engine's launch: a change restarts it.
LAUNCH = frozenset(
    [f.spec for f in ENTRY if f.launch] + [name for name, _, launch in SECTION_ONLY if launch]
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
