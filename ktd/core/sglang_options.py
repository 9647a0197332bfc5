"""SGLang's option catalogue, as the installed SGLang's own argparse declares it (pure).

Why: upstream ``sglang`` and the kt fork ``sglang-kt`` differ in their
``--kt-*`` flags (upstream exits 2 on ``--kt-numa-nodes``), and real SGLang's
``argparse.ArgumentParser`` accepts any unique prefix (``--tp 2`` sets
``tp_size``, ``--kt-numa 0 1`` sets ``kt_numa_nodes``). ktd therefore builds
argv from what the probe read out of the engine's interpreter
(:mod:`ktd.daemon.engine.probe`), keyed by ``dest``, and reads the user's ``extra_args``
with argparse's own lookup rule (exact option string, then ``--flag=value``,
then a unique prefix), so a user flag however abbreviated wins and is never
doubled, and an unknown or ambiguous one is refused before a launch.

The lookup mirrors CPython 3.11's ``ArgumentParser._parse_optional`` and
``_get_option_tuples`` for ``--`` options; single-dash options are matched
exactly (SGLang declares none that users abbreviate).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

__all__ = [
    "Option",
    "OptionError",
    "SGLangOptions",
    "UserFlag",
    "parse_user_args",
]

Nargs = int | str | None  # argparse's: None = one value, 0 = a switch, "?", "*", "+", N


class Option(msgspec.Struct, frozen=True, kw_only=True):
    """One argparse action: its option strings, where it stores, what it takes."""

    flags: tuple[str, ...]
    dest: str
    nargs: Nargs = None
    choices: tuple[str, ...] | None = None
    type: str | None = None  # "int", "float", "str", ... (for conformance checks and the sim)
    default: str | int | float | bool | list[str | int | float] | None = None
    action: str = "store"  # store, store_true, store_false, append, ...

    @property
    def takes_values(self) -> bool:
        return self.nargs != 0


class CatalogData(msgspec.Struct, kw_only=True):
    """The probe's wire form (and the sim's data files)."""

    package: str  # "sglang" (upstream), "sglang-kt" (the kt fork), or what metadata says
    version: str
    options: list[Option]


class OptionError(ValueError):
    """A user flag this SGLang would reject: unknown, ambiguous, or missing its value."""


@dataclass(frozen=True)
class SGLangOptions:
    """The options of one installed SGLang, with argparse's lookup rules."""

    package: str
    version: str
    options: tuple[Option, ...]
    _by_flag: dict[str, Option] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_flag = {f: opt for opt in self.options for f in opt.flags}
        object.__setattr__(self, "_by_flag", by_flag)

    @classmethod
    def from_data(cls, data: CatalogData) -> SGLangOptions:
        return cls(package=data.package, version=data.version, options=tuple(data.options))

    @property
    def label(self) -> str:
        """``sglang-kt 0.7.2``: how errors and doctor name this SGLang."""
        return f"{self.package} {self.version}"

    @property
    def kt_fork(self) -> bool:
        """The fork is told by its flags, not its name: it reports itself as ``sglang``."""
        return self.package == "sglang-kt" or "--kt-numa-nodes" in self._by_flag

    @property
    def has_kt(self) -> bool:
        return "--kt-weight-path" in self._by_flag

    def exact(self, flag: str) -> Option | None:
        """The option declared under exactly ``flag`` (no prefix matching)."""
        return self._by_flag.get(flag)

    def lookup(self, token: str) -> tuple[Option, str, str | None] | None:
        """The option ``token`` selects: ``(option, option_string, explicit_value)``.

        None when argparse would take the token for a value (it does not start
        with ``-``, or is a negative number: SGLang declares no option that
        looks like one). Raises :class:`OptionError` for an unknown or
        ambiguous option, as SGLang's ``parse_args`` would (exit 2).
        """
        if not token.startswith("-") or token == "-" or _is_number(token):
            return None
        if token in self._by_flag:
            return self._by_flag[token], token, None
        name, eq, value = token.partition("=")
        explicit = value if eq else None
        if eq and name in self._by_flag:
            return self._by_flag[name], name, explicit
        if token.startswith("--") and len(name) > 2:
            matches = [f for f in self._by_flag if f.startswith(name)]
            if len(matches) > 1:
                raise OptionError(
                    f"{name}: ambiguous option for {self.label} (could match "
                    f"{', '.join(sorted(matches))})"
                )
            if matches:
                return self._by_flag[matches[0]], matches[0], explicit
        if " " in token:
            return None
        raise OptionError(f"{name}: not an option of {self.label}")


@dataclass(frozen=True)
class UserFlag:
    """One flag of ``extra_args`` as SGLang's argparse will read it."""

    option: Option
    written: str  # as the user wrote it (maybe abbreviated)
    values: tuple[str, ...]
    span: tuple[int, int] = (0, 0)  # its tokens in ``extra_args``: [start, end)

    @property
    def dest(self) -> str:
        return self.option.dest


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def parse_user_args(args: Sequence[str], catalog: SGLangOptions) -> list[UserFlag]:
    """Read ``extra_args`` with argparse's rules against ``catalog``.

    Raises :class:`OptionError` naming the first flag SGLang would reject: an
    unknown or ambiguous option, a stray value, a value count that does not
    fit the option's ``nargs``, or a value outside its ``choices``.
    """
    out: list[UserFlag] = []
    i = 0
    while i < len(args):
        start = i
        tok = args[i]
        i += 1
        found = catalog.lookup(tok)
        if found is None:
            raise OptionError(f"{tok}: a value with no option before it ({catalog.label})")
        opt, written, explicit = found
        values: list[str] = []
        if explicit is not None:
            if not opt.takes_values:
                raise OptionError(f"{written}: takes no value ({catalog.label}), got {tok!r}")
            values.append(explicit)
        else:
            while i < len(args) and _accepts_more(opt, len(values)):
                if catalog.lookup(args[i]) is not None:
                    break
                values.append(args[i])
                i += 1
        _check_count(opt, written, values, catalog)
        if opt.choices is not None:
            for v in values:
                if v not in opt.choices:
                    raise OptionError(
                        f"{written}: invalid choice {v!r} for {catalog.label} "
                        f"(choose from {', '.join(opt.choices)})"
                    )
        out.append(UserFlag(opt, written, tuple(values), (start, i)))
    return out


def _accepts_more(opt: Option, have: int) -> bool:
    n = opt.nargs
    if n is None:
        return have < 1
    if n == "?":
        return have < 1
    if n in ("*", "+"):
        return True
    if isinstance(n, int):
        return have < n
    return False  # argparse.REMAINDER and friends: SGLang uses none


def _check_count(opt: Option, written: str, values: Sequence[str], catalog: SGLangOptions) -> None:
    n = opt.nargs
    need = None
    if n is None and len(values) != 1:
        need = "one value"
    elif n == "+" and not values:
        need = "at least one value"
    elif isinstance(n, int) and len(values) != n:
        need = "no value" if n == 0 else f"{n} values"
    if need:
        raise OptionError(f"{written}: expects {need} ({catalog.label})")
