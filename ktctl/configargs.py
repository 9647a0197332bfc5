"""``ktctl config``'s command line: its parser, apart from the commands (``configcmd``),
which ktctl imports only when it runs one (its start-up is a contract: ``ktctl.cli``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ktctl.client import KtctlError
from ktd.core import modelfields


class UsageError(KtctlError):
    """A command line that cannot be carried out (exit 2, like argparse's)."""

    code = "usage"


#: ``ktctl config set --help``'s account of VALUE (README, "Changing it without editing
#: JSON", says the same).
SET_SYNTAX = """\
VALUE by the field's kind:
  numbers, seconds    kt.ctx=65536  ttl=600  ttl=0.5
  true/false          sleep=true  pinned=no   (true/false, yes/no, on/off, 1/0)
  choices             fit=ignore  restart=no
  numa, gpus          numa=auto|all|none|0,1   gpus=auto|2|0,1
  max_concurrent...   max_queue=null  (null or none: the default, no limit)
  lists of flags      kt.extra_args='--kt-method AMXINT4 --kt-num-gpu-experts 8'
                      (split like a shell, or a JSON list: '["--x", "1"]')
  maps of variables   kt.extra_env='OMP_NUM_THREADS=8 FOO=bar'  (or a JSON object)

FIELD=VALUE replaces the whole value: kt.extra_args=X leaves X alone in the list
(the plan says "replaced" and what it drops). To add or take out one:
  kt.extra_args+=--enable-metrics        flags at the end (a model without its own
  kt.extra_args+='--kt-method AMXINT4'   list starts from the ktransformers section's)
  kt.extra_args-=--kt-method             that flag and its values, wherever it is
  kt.extra_args-='--tp-size 2'           that exact run of words
  kt.extra_env+=FOO=bar                  set one variable, keep the others
  kt.extra_env-=FOO                      remove one
--unset FIELD takes the field out of the entry (back to its default).
"""


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a version number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"versions count from 1: {text!r}")
    return value


def add_parser(add: Callable[[str, str], argparse.ArgumentParser], common: Any) -> None:
    """``ktctl config ...`` under the CLI's ``add`` (its common options)."""
    sp = add("config", "read, plan and change the configuration (history, rollback)")
    sub = sp.add_subparsers(dest="config_command", metavar="ACTION", required=True)

    def action(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=help, description=help)

    yes_help = "apply without asking (needed with --json or without a terminal)"
    files = ("config", "models")
    fields = ", ".join(f.name for f in modelfields.FIELDS)

    a = action("get", "print models.json (or an entry, or config.json) as ktd sees it on disk")
    a.add_argument("alias", nargs="?", metavar="ALIAS", help="only this model's entry")
    a.add_argument("--file", choices=files, help="which file to print (default: models)")
    a.add_argument("--version", type=_positive, metavar="N", help="version N of the history")

    for name, help in (
        ("plan", "what applying FILE would do (per engine, and what is wrong); changes nothing"),
        ("apply", "show FILE's plan, then apply it (the base: the version read first)"),
    ):
        a = action(name, help)
        a.add_argument("path", metavar="FILE", help="config.json or models.json text (-: stdin)")
        a.add_argument("--file", choices=files, help="which file FILE is (default: by its JSON)")
        a.add_argument(
            "--base", metavar="VERSION",
            help="refuse if the files are no longer this version (from ktctl config get)",
        )  # fmt: skip
        if name == "apply":
            a.add_argument("--yes", action="store_true", help=yes_help)

    set_help = "set fields of a model's entry: FIELD=VALUE ...; plan, then apply"
    a = sub.add_parser(
        "set", parents=[common], help=set_help, description=set_help, epilog=SET_SYNTAX,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    a.add_argument("alias", metavar="ALIAS")
    a.add_argument(
        "assignments", nargs="*", metavar="FIELD=VALUE",
        help=f"also FIELD+=VALUE, FIELD-=VALUE (lists and maps); fields: {fields}",
    )  # fmt: skip
    a.add_argument("--unset", action="append", default=[], metavar="FIELD",
                   help="remove FIELD from the entry (back to its default)")  # fmt: skip
    a.add_argument("--yes", action="store_true", help=yes_help)

    a = action("add", "add a model: ALIAS path=/models/... [FIELD=VALUE ...]; plan, then apply")
    a.add_argument("alias", metavar="ALIAS")
    a.add_argument("assignments", nargs="*", metavar="FIELD=VALUE", help=f"fields: {fields}")
    a.add_argument("--yes", action="store_true", help=yes_help)

    a = action("remove", "remove a model's entry; plan, then apply")
    a.add_argument("alias", metavar="ALIAS")
    a.add_argument("--yes", action="store_true", help=yes_help)

    a = action("edit", "open $EDITOR on a copy of models.json (or config.json); plan it on save")
    a.add_argument("--file", choices=files, help="which file (default: models)")
    a.add_argument("--yes", action="store_true", help=yes_help)

    action("history", "the versions ktd keeps: who changed what, and when")

    a = action("rollback", "apply version N of the history again (default: the one before)")
    a.add_argument("seq", nargs="?", type=_positive, metavar="N")
    a.add_argument("--yes", action="store_true", help=yes_help)
