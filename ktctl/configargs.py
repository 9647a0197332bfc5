"""``ktctl config``'s command line: its row of the CLI's table (``ktctl.argtable``), the
actions and their options, apart from the commands (``configcmd``), which ktctl imports
only when it runs one (its start-up is a contract: ``ktctl.cli``)."""

from __future__ import annotations

import argparse

from ktctl.argtable import Arg, Subcommand, arg, number
from ktctl.client import Client
from ktd.core import modelfields

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


_positive = number(int, "not a version number", lambda n: n >= 1, "versions count from 1")

_YES = arg(
    "--yes",
    action="store_true",
    help="apply without asking (needed with --json or without a terminal)",
)
_FILES = ("config", "models")
_FIELDS = ", ".join(f.name for f in modelfields.FIELDS)


def _with_file(name: str, help: str, *yes: Arg) -> Subcommand:
    """``plan`` and ``apply``: a FILE, which of the two it is, and the version it bases on."""
    return Subcommand(
        name,
        help,
        args=(
            arg("path", metavar="FILE", help="config.json or models.json text (-: stdin)"),
            arg("--file", choices=_FILES, help="which file FILE is (default: by its JSON)"),
            arg(
                "--base",
                metavar="VERSION",
                help="refuse if the files are no longer this version (from ktctl config get)",
            ),
            *yes,
        ),
    )


def _run(client: Client, args: argparse.Namespace) -> int:
    from ktctl import configcmd  # only when it runs: ktctl's start-up stays what it was

    return configcmd.run(client, args)


#: ``ktctl config ACTION ...``, a row of the CLI's table (``ktctl.argtable``).
COMMAND = Subcommand(
    "config",
    "read, plan and change the configuration (history, rollback)",
    _run,
    actions_dest="config_command",
    actions=(
        Subcommand(
            "get",
            "print models.json (or an entry, or config.json) as ktd sees it on disk",
            args=(
                arg("alias", nargs="?", metavar="ALIAS", help="only this model's entry"),
                arg("--file", choices=_FILES, help="which file to print (default: models)"),
                arg("--version", type=_positive, metavar="N", help="version N of the history"),
            ),
        ),
        _with_file(
            "plan", "what applying FILE would do (per engine, and what is wrong); changes nothing"
        ),
        _with_file(
            "apply", "show FILE's plan, then apply it (the base: the version read first)", _YES
        ),
        Subcommand(
            "set",
            "set fields of a model's entry: FIELD=VALUE ...; plan, then apply",
            epilog=SET_SYNTAX,
            args=(
                arg("alias", metavar="ALIAS"),
                arg(
                    "assignments",
                    nargs="*",
                    metavar="FIELD=VALUE",
                    help=f"also FIELD+=VALUE, FIELD-=VALUE (lists and maps); fields: {_FIELDS}",
                ),
                arg(
                    "--unset",
                    action="append",
                    default=[],
                    metavar="FIELD",
                    help="remove FIELD from the entry (back to its default)",
                ),
                _YES,
            ),
        ),
        Subcommand(
            "add",
            "add a model: ALIAS path=/models/... [FIELD=VALUE ...]; plan, then apply",
            args=(
                arg("alias", metavar="ALIAS"),
                arg("assignments", nargs="*", metavar="FIELD=VALUE", help=f"fields: {_FIELDS}"),
                _YES,
            ),
        ),
        Subcommand(
            "remove",
            "remove a model's entry; plan, then apply",
            args=(arg("alias", metavar="ALIAS"), _YES),
        ),
        Subcommand(
            "edit",
            "open $EDITOR on a copy of models.json (or config.json); plan it on save",
            args=(arg("--file", choices=_FILES, help="which file (default: models)"), _YES),
        ),
        Subcommand("history", "the versions ktd keeps: who changed what, and when"),
        Subcommand(
            "rollback",
            "apply version N of the history again (default: the one before)",
            args=(arg("seq", nargs="?", type=_positive, metavar="N"), _YES),
        ),
    ),
)
