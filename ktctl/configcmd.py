"""``ktctl config``: change the configuration without hand-editing JSON (issue 39).

Every change goes the same way: read the files and their version (``config_get``), make
the new text (here: ``ktd.core.configtext`` edits the one value, in the file's own
layout), ask the daemon for the plan and show it, ask before applying (``--yes``
skips that), then apply it naming the version read as its base: a change someone
else made meanwhile is refused (``stale_config``), never overwritten. The daemon
checks and writes; this module only reads, asks and shows.

``FILE`` (plan, apply) is either file, told by its JSON: a list is models.json, an
object config.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from ktctl import configview, render
from ktctl.client import Client, KtdError
from ktctl.connection import UsageError
from ktd import foreign
from ktd import protocol as p
from ktd.core import configtext, fieldops, modelfields
from ktd.protocol_config import plan_refusal

EXIT_OK = 0
EXIT_FAILED = 1


def _out(text: str) -> None:
    print(text, file=sys.stdout, flush=True)


def _json(args: argparse.Namespace) -> bool:
    return bool(getattr(args, "json", False))


# ---------------------------------------------------------------- asking


def _ask(question: str) -> bool | None:
    """yes/no on the terminal (not stdin when it carries the file); None: no terminal.

    The terminal is opened unbuffered and binary: a text-mode ``r+`` file needs a
    seekable one, and a terminal is not (issue 43: every question was "no terminal").
    End of input (Ctrl-D) is a no."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return None
    with open(fd, "r+b", buffering=0) as tty:
        tty.write(f"{question} [y/N] ".encode())
        answer = tty.readline().decode("utf-8", "replace").strip().lower()
    return answer in ("y", "yes")


def _confirmed(args: argparse.Namespace, question: str) -> bool:
    if getattr(args, "yes", False):
        return True
    if _json(args):
        raise UsageError("--json applies nothing without --yes (there is nobody to ask)")
    answer = _ask(question)
    if answer is None:
        raise UsageError("not applied: no terminal to ask on; pass --yes to apply this plan")
    return answer


# ---------------------------------------------------------------- the one path of a change


def _show(args: argparse.Namespace, plan: p.ConfigPlanView) -> None:
    if not _json(args):
        _out(configview.plan_text(plan))


def _planned_change(
    client: Client,
    args: argparse.Namespace,
    base: str,
    *,
    config_text: str | None = None,
    models_text: str | None = None,
) -> int:
    """Plan, show, ask, apply against ``base``: every change of the config."""
    plan = client.config_plan(config_text=config_text, models_text=models_text, base=base)
    _show(args, plan)
    if not plan.ok:
        if _json(args):
            _out(render.dumps({"plan": plan, "applied": False}))
        code, message, _ = plan_refusal(plan)
        raise KtdError(code, message, {"plan": render.builtins(plan)})
    if not plan.changed and plan.base == plan.running:
        if _json(args):
            _out(render.dumps({"plan": plan, "applied": False}))
        else:
            _out("nothing to apply: that is the config ktd runs")
        return EXIT_OK
    if not _confirmed(args, "apply this plan?"):
        _out("not applied")
        return EXIT_FAILED
    reply = client.config_apply(config_text=config_text, models_text=models_text, base=base)
    if _json(args):
        _out(render.dumps({"plan": reply.plan, "applied": True, **_applied(reply)}))
    else:
        _out(configview.applied_text(reply))
    return EXIT_OK


def _applied(reply: p.ConfigApplyReply) -> dict[str, Any]:
    return {"version": reply.version, "seq": reply.seq, "summary": reply.summary}


# ---------------------------------------------------------------- reading files


def _read(path: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 text: {exc}") from None


def _which(text: str, name: str, forced: str | None) -> str:
    """``models`` or ``config``: by ``--file``, else by the JSON's shape."""
    if forced:
        return forced
    try:
        doc = foreign.loads(text)
    except ValueError:  # foreign.Malformed too: nested too deeply
        raise UsageError(
            f"{name} is not valid JSON; say which file it is with --file config|models "
            "to have ktd point at the error"
        ) from None
    if isinstance(doc, list):
        return "models"
    if isinstance(doc, dict):
        return "config"
    raise UsageError(f"{name}: a config is a JSON object (config.json) or list (models.json)")


def _texts(kind: str, text: str) -> dict[str, str]:
    if len(text) > p.MAX_CONFIG_TEXT:
        raise UsageError(
            f"{len(text)} characters: more than the {p.MAX_CONFIG_TEXT} ktctl config sends; "
            "edit a file that big by hand and run `ktctl reload`"
        )
    return {"config_text": text} if kind == "config" else {"models_text": text}


def _models_of(got: p.ConfigReply) -> str:
    if got.models_text is None:
        raise UsageError(
            f"there is no models file ({got.models_path}); `ktctl config add` starts one"
        )
    return got.models_text


# ---------------------------------------------------------------- commands


def cmd_get(client: Client, args: argparse.Namespace) -> int:
    got = client.config_get(args.version)
    if args.alias is not None:
        text = _models_of(got)
        try:
            index = configtext.find_entry(text, args.alias)
        except configtext.EditError as exc:
            raise KtdError(p.ErrorCode.UNKNOWN_MODEL, str(exc)) from None
        entry = configtext.entries(text)[index]
        if _json(args):
            _out(render.dumps({"version": got.version, "alias": args.alias, "index": index,
                               "file": got.models_path, "entry": entry}))  # fmt: skip
        else:
            _out(json.dumps(entry, indent=2, ensure_ascii=False))
        return EXIT_OK
    if _json(args):
        _out(render.dumps(render.reply_doc(got)))
        return EXIT_OK
    which = args.file or ("models" if got.models_text is not None else "config")
    text = got.config_text if which == "config" else _models_of(got)
    path = got.config_path if which == "config" else got.models_path
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()
    running = "" if got.version == got.running else f"; ktd runs {got.running} (not reloaded)"
    print(f"# {path}: version {got.version}{running}", file=sys.stderr)
    return EXIT_OK


def cmd_plan(client: Client, args: argparse.Namespace) -> int:
    text = _read(args.path)
    kind = _which(text, args.path, args.file)
    plan = client.config_plan(base=args.base or "", **_texts(kind, text))
    if _json(args):
        _out(render.dumps({"plan": plan}))
    else:
        _out(configview.plan_text(plan))
    return EXIT_OK if plan.ok else EXIT_FAILED


def cmd_apply(client: Client, args: argparse.Namespace) -> int:
    text = _read(args.path)
    kind = _which(text, args.path, args.file)
    base = args.base if args.base is not None else client.config_get().version
    return _planned_change(client, args, base, **_texts(kind, text))


def _assignments(words: list[str]) -> dict[str, Any]:
    """``FIELD=VALUE`` words as the values the file will hold (``config add``)."""
    values: dict[str, Any] = {}
    for name, op, raw in _changes(words):
        if op != "=":
            raise UsageError(f"{name}{op}: a new model's fields are set with {name}=VALUE")
        values[name] = raw
    return values


def _changes(words: list[str]) -> list[tuple[str, fieldops.Op, Any]]:
    """``FIELD=VALUE``, ``FIELD+=VALUE``, ``FIELD-=VALUE`` (``ktd.core.fieldops``): each
    field's op and its value (parsed for ``=``, the text for the others, which need the
    value it has), checked before anything is read from the daemon."""
    out: list[tuple[str, fieldops.Op, Any]] = []
    for word in words:
        try:
            name, op, raw = fieldops.split(word)
            fieldops.check(name, op)
            out.append((name, op, modelfields.parse_value(name, raw) if op == "=" else raw))
        except modelfields.FieldValueError as exc:
            raise UsageError(str(exc)) from None
    return out


def _current(entry: dict[str, Any], name: str, section: dict[str, Any]) -> Any:
    """The value ``name`` has in ``entry`` now; for ``kt.extra_args`` not set there, the
    ktransformers section's (the entry's list replaces it: ``ktd.core.fieldops``)."""
    holder: Any = entry
    for part in name.split("."):
        holder = holder.get(part) if isinstance(holder, dict) else None
    if holder is None and name == "kt.extra_args":
        return section.get("extra_args")
    return holder


def _section(config_text: str) -> dict[str, Any]:
    try:
        doc = json.loads(config_text)
    except ValueError:
        return {}
    section = doc.get("ktransformers") if isinstance(doc, dict) else None
    return section if isinstance(section, dict) else {}


def _edited(
    client: Client, edit: Callable[[str | None], str], section: dict[str, Any] | None = None
) -> tuple[str, str]:
    """(version read, the models text with ``edit`` made); ``section`` gets config.json's
    ktransformers section first (what an entry's unset fields take)."""
    got = client.config_get()
    if section is not None:
        section.update(_section(got.config_text))
    try:
        return got.version, edit(got.models_text)
    except configtext.EditError as exc:
        if "no entry" in str(exc):
            hint = (
                " (the model of config.json's ktransformers section is changed with "
                "`ktctl config edit --file config`)"
            )
            raise KtdError(p.ErrorCode.UNKNOWN_MODEL, f"{got.models_path}: {exc}{hint}") from None
        raise KtdError(p.ErrorCode.CONFIG_ERROR, f"{got.models_path}: {exc}") from None


def cmd_set(client: Client, args: argparse.Namespace) -> int:
    changes = _changes(args.assignments)
    for name in args.unset:
        try:
            modelfields.field(name)
        except modelfields.FieldValueError as exc:
            raise UsageError(str(exc)) from None
    if not changes and not args.unset:
        raise UsageError("nothing to set: give FIELD=VALUE (or +=, -=) or --unset FIELD")
    section: dict[str, Any] = {}

    def edit(text: str | None) -> str:
        if text is None:
            raise configtext.EditError(f"no entry with alias {args.alias!r}: no models file yet")
        entry = configtext.entries(text)[configtext.find_entry(text, args.alias)]
        values: dict[str, Any] = {}
        for name, op, raw in changes:
            if op == "=":
                values[name] = raw
                continue
            now = values[name] if name in values else _current(entry, name, section)
            try:
                values[name] = fieldops.apply(name, op, now, raw)
            except modelfields.FieldValueError as exc:
                raise UsageError(f"{args.alias}: {exc}") from None
        return configtext.set_fields(text, args.alias, values, args.unset)

    base, text = _edited(client, edit, section)
    return _planned_change(client, args, base, models_text=text)


def cmd_add(client: Client, args: argparse.Namespace) -> int:
    values = _assignments(args.assignments)
    entry: dict[str, Any] = {"path": values.pop("path", None), "backend": "kt", "alias": args.alias}
    if entry["path"] is None:
        raise UsageError("a model needs its path: ktctl config add ALIAS path=/models/...")
    entry["backend"] = values.pop("backend", "kt")
    values.pop("alias", None)
    for name, v in values.items():
        holder = entry
        parts = name.split(".")
        for part in parts[:-1]:
            holder = holder.setdefault(part, {})
        holder[parts[-1]] = v

    def edit(text: str | None) -> str:
        if text is not None and any(e.get("alias") == args.alias for e in configtext.entries(text)):
            raise configtext.EditError(f"an entry with alias {args.alias!r} is there already")
        return configtext.add_entry(text, entry)

    base, text = _edited(client, edit)
    return _planned_change(client, args, base, models_text=text)


def cmd_remove(client: Client, args: argparse.Namespace) -> int:
    def edit(text: str | None) -> str:
        if text is None:
            raise configtext.EditError(f"no entry with alias {args.alias!r}: no models file")
        return configtext.remove_entry(text, args.alias)

    base, text = _edited(client, edit)
    return _planned_change(client, args, base, models_text=text)


def _editor() -> list[str]:
    import shlex

    raw = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    return shlex.split(raw)


def cmd_edit(client: Client, args: argparse.Namespace) -> int:
    """$EDITOR on a copy; on save, the plan; errors: edit again or give up.

    An edit that is not applied (a refused plan, a no, no terminal to ask on, a stale
    base, the editor failing) is kept: its copy stays where the editor wrote it and
    ktctl says where, and how to apply it later (issue 43: it was deleted unsaid)."""
    import shutil
    import tempfile

    got = client.config_get()
    kind = args.file or ("models" if got.models_text is not None else "config")
    text = got.config_text if kind == "config" else _models_of(got)
    name = os.path.basename(got.config_path if kind == "config" else got.models_path)
    folder = tempfile.mkdtemp(prefix="ktctl-edit-")
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    code = EXIT_FAILED
    try:
        code = _edit_loop(client, args, got, kind, text, path)
    finally:
        if code == EXIT_OK or _unchanged(path, text):
            shutil.rmtree(folder, ignore_errors=True)
        else:
            print(
                f"ktctl: your edit is kept in {path}; `ktctl config apply --file {kind} "
                f"--base {got.version} {path}` applies it (refused if the config changed "
                "since)",
                file=sys.stderr,
                flush=True,
            )
    return code


def _unchanged(path: str, text: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read() == text
    except (OSError, UnicodeDecodeError):
        return False


def _edit_loop(
    client: Client, args: argparse.Namespace, got: p.ConfigReply, kind: str, text: str, path: str
) -> int:
    import subprocess

    while True:
        try:
            done = subprocess.run([*_editor(), path], check=False)
        except OSError as exc:
            raise UsageError(f"cannot run the editor {_editor()[0]!r}: {exc}") from None
        if done.returncode != 0:
            _out(f"the editor exited {done.returncode}: nothing applied")
            return EXIT_FAILED
        new = _read(path)
        if new == text:
            _out("no change")
            return EXIT_OK
        plan = client.config_plan(base=got.version, **_texts(kind, new))
        _show(args, plan)
        if plan.ok:
            break
        again = _ask("edit again?") if not args.yes else False
        if not again:
            raise KtdError(p.ErrorCode.CONFIG_ERROR, plan_refusal(plan)[1], {})
    return _planned_change(client, args, got.version, **_texts(kind, new))


def cmd_history(client: Client, args: argparse.Namespace) -> int:
    reply = client.config_history()
    if _json(args):
        _out(render.dumps(render.reply_doc(reply)))
    else:
        _out(configview.history_table(reply))
    return EXIT_OK


def cmd_rollback(client: Client, args: argparse.Namespace) -> int:
    base = client.config_get().version
    plan = client.config_rollback(args.seq, dry_run=True)
    assert isinstance(plan, p.ConfigPlanView)
    _show(args, plan)
    if not plan.ok:
        code, message, _ = plan_refusal(plan)
        raise KtdError(code, message, {"plan": render.builtins(plan)})
    if not _confirmed(args, "roll back to this version?"):
        _out("not applied")
        return EXIT_FAILED
    reply = client.config_rollback(args.seq, base=base)
    assert isinstance(reply, p.ConfigApplyReply)
    if _json(args):
        _out(render.dumps({"plan": reply.plan, "applied": True, **_applied(reply)}))
    else:
        _out(configview.applied_text(reply))
    return EXIT_OK


COMMANDS: dict[str, Callable[[Client, argparse.Namespace], int]] = {
    "get": cmd_get,
    "plan": cmd_plan,
    "apply": cmd_apply,
    "set": cmd_set,
    "add": cmd_add,
    "remove": cmd_remove,
    "edit": cmd_edit,
    "history": cmd_history,
    "rollback": cmd_rollback,
}


def run(client: Client, args: argparse.Namespace) -> int:
    return COMMANDS[args.config_command](client, args)
