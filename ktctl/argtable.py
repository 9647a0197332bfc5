"""ktctl's command line as data: a row per subcommand (its name, help, options and handler),
and the argparse parser built from the rows.

Why a table: the parser was one long function that said every command's shape in code,
and ``main`` a chain of ``if command == ...`` for what argparse cannot say (a usage rule
across two options, what Ctrl-C means mid-wait). A row says all of a command in one
place, the table reads as the CLI's reference, and the builder gives every command the
same treatment (the common ``--json``/``--socket``, help doubling as description), so
a new command cannot forget one. The rows live beside their handlers (``ktctl.cli``,
``configargs``, ``catalogcmd``, ``pullcmd``); this module imports nothing heavier than
argparse (ktctl's start-up is a contract: ``ktctl.cli``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ktctl.client import Client

__all__ = ["Arg", "Subcommand", "add_subcommands", "arg", "number"]

Handler = Callable[["Client", argparse.Namespace], int]
N = TypeVar("N", int, float)


@dataclass(frozen=True)
class Arg:
    """One ``add_argument``: its flags (or positional name) and keywords, as argparse takes them."""

    flags: tuple[str, ...]
    options: Mapping[str, Any]


def arg(*flags: str, **options: Any) -> Arg:
    """``arg("--timeout", type=seconds, metavar="S", help=...)``: ``add_argument``'s own words."""
    return Arg(flags, options)


def _never(args: argparse.Namespace) -> bool:
    return False


def _interrupted(args: argparse.Namespace) -> str:
    return "ktctl: interrupted"


@dataclass(frozen=True)
class Subcommand:
    """A subcommand of ktctl (or an action of one, as ``config``'s): what argparse builds
    from it and what ``main`` does around its run.

    ``check`` says a usage error argparse cannot (None: the line is fine); ``streaming``
    is true of a run that ends by Ctrl-C or a closed pipe as a matter of course (exit 0);
    ``interrupted`` is the stderr line of any other Ctrl-C. ``actions`` are the command's
    own subcommands, chosen by ``ACTION`` into ``args.<actions_dest>``.
    """

    name: str
    help: str
    run: Handler | None = None  # None: an action (its command's run dispatches on it)
    args: tuple[Arg, ...] = ()
    epilog: str | None = None  # printed as written (RawDescriptionHelpFormatter)
    actions: tuple[Subcommand, ...] = ()
    actions_dest: str = ""
    check: Callable[[argparse.Namespace], str | None] | None = None
    streaming: Callable[[argparse.Namespace], bool] = _never
    interrupted: Callable[[argparse.Namespace], str] = _interrupted


def add_subcommands(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    rows: tuple[Subcommand, ...],
    common: argparse.ArgumentParser,
) -> None:
    """Every row a parser under ``sub``, with the ``common`` options and its help as its
    description; a row with actions gets its own ``ACTION`` subparsers, built alike."""
    for row in rows:
        extra: dict[str, Any] = {}
        if row.epilog is not None:
            extra = {"epilog": row.epilog, "formatter_class": argparse.RawDescriptionHelpFormatter}
        sp = sub.add_parser(
            row.name, parents=[common], help=row.help, description=row.help, **extra
        )
        for a in row.args:
            # A list default (``--unset``'s) is each parser's own, as it was when written inline.
            options: dict[str, Any] = {
                k: list(v) if isinstance(v, list) else v for k, v in a.options.items()
            }
            sp.add_argument(*a.flags, **options)
        if row.actions:
            inner = sp.add_subparsers(dest=row.actions_dest, metavar="ACTION", required=True)
            add_subcommands(inner, row.actions, common)


def number(
    kind: Callable[[str], N], not_a: str, ok: Callable[[N], bool], must: str
) -> Callable[[str], N]:
    """An argparse ``type`` for a number: ``kind(text)``, refused unless ``ok``; the two
    messages say what the text was not (``not_a``) and what the number must be (``must``)."""

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{not_a}: {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{must}: {text!r}")
        return value

    return parse
