"""The layout's rules, read from the code itself (``ast``), so a change that breaks one fails here.

``docs/architecture.md`` states them: the frontend and ktctl never import the daemon
(they are other processes, and ktctl must start fast), the pure core imports none of
the processes' code, no module grows over 600 lines, a class name means one thing, an
error code is ``ErrorCode``'s name. What still breaks a rule is listed here, by name,
and the lists only shrink.
Every import counts, those inside functions and ``TYPE_CHECKING`` blocks and
``importlib.import_module("...")`` with a literal name too: a lazy import is still an
arrow. ``tests/test_exports.py`` checks what importing really loads; this reads every
path, the ones no test runs included.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("ktd", "ktctl")
MAX_LINES = 600

# Modules still over MAX_LINES, each with the line count it may not exceed (issue 45).
# A module leaves the list when it is split; the list only shrinks, and a count only
# goes down: a change that grows one of these splits it first.
OVER_MAX_LINES: dict[str, int] = {}


@cache
def modules() -> dict[str, Path]:
    """Every module of ktd and ktctl by its dotted name (a package by its own)."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


@cache
def tree(module: str) -> ast.Module:
    """The module's syntax tree, parsed once for every test here."""
    path = modules()[module]
    return ast.parse(path.read_text(), str(path))


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


@cache
def imports(module: str) -> frozenset[str]:
    """The modules of ktd and ktctl that ``module`` imports, wherever in it."""
    known = modules()
    path = known[module]
    found: set[str] = set()
    for node in ast.walk(tree(module)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node, path.name == "__init__.py")
            subs = [f"{base}.{a.name}" for a in node.names]
            names = [s for s in subs if s in known]
            if len(names) < len(subs):  # a name defined in the module itself
                names.append(base)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        found.update(n for n in names if n in known and n != module)
    return frozenset(found)


def reached(module: str) -> set[str]:
    """Everything ``module`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        for m in imports(todo.pop()):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def _within(module: str, *roots: str) -> bool:
    return any(module == r or module.startswith(r + ".") for r in roots)


def wall_breaks(sources: tuple[str, ...], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for m in modules():
        if _within(m, *sources):
            bad = sorted(r for r in reached(m) if _within(r, *forbidden))
            if bad:
                out[m] = bad
    return out


def test_the_graph_sees_every_kind_of_import() -> None:
    """The reader itself: a graph that missed imports would let every wall pass."""
    assert "ktd.daemon.pool.pool" in imports("ktd.daemon.main")  # from ktd.daemon.pool.pool
    assert "ktd.protocol" in imports("ktctl.client")  # from ktd import protocol as p
    assert "ktd.checkup" in imports("ktctl.cli")  # importlib.import_module("ktd.checkup")
    assert "ktd.daemon.pool.pool" in imports("ktd.daemon.doctor")  # under TYPE_CHECKING
    assert "ktd.daemon.engine.proctree" in reached("ktd.daemon.main")  # through others


def test_frontend_and_ktctl_never_import_the_daemon() -> None:
    assert wall_breaks(("ktd.frontend", "ktctl"), ("ktd.daemon",)) == {}


def test_the_core_imports_no_process_code() -> None:
    forbidden = ("ktd.daemon", "ktd.frontend", "ktctl", "ktd.gateway", "ktd.catalog", "ktd.sim")
    assert wall_breaks(("ktd.core",), forbidden) == {}


def test_the_daemons_rooms_import_downwards() -> None:
    """``ktd/daemon/``'s rooms (``docs/architecture.md``): one engine knows no pool, no
    config desk and no catalog; the pool knows no desk and no catalog; the desk knows
    no catalog. What imports them all is the daemon itself (main, server, dispatch)."""
    rooms = ("ktd.daemon.engine", "ktd.daemon.pool", "ktd.daemon.config", "ktd.daemon.catalog")
    for i, room in enumerate(rooms):
        assert wall_breaks((room,), rooms[i + 1 :]) == {}, room
    everything = ("ktd.daemon.main", "ktd.daemon.server", "ktd.daemon.dispatch")
    assert wall_breaks(rooms, everything) == {}


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_no_module_over_600_lines_but_the_listed() -> None:
    over = {
        str(path.relative_to(REPO)): n
        for path in modules().values()
        if (n := _lines(path)) > MAX_LINES
    }
    grown = {
        name: f"{n} lines, more than {OVER_MAX_LINES.get(name, MAX_LINES)}"
        for name, n in over.items()
        if n > OVER_MAX_LINES.get(name, MAX_LINES)
    }
    assert grown == {}, "split the module along a seam before adding to it"
    gone = sorted(set(OVER_MAX_LINES) - set(over))
    assert gone == [], "under 600 lines now (or gone): take it off OVER_MAX_LINES"


def class_names() -> dict[str, list[str]]:
    """Every class name defined in ktd and ktctl, with where (module:line)."""
    out: dict[str, list[str]] = defaultdict(list)
    for name in modules():
        for node in ast.walk(tree(name)):
            if isinstance(node, ast.ClassDef):
                out[node.name].append(f"{name}:{node.lineno}")
    return out


def _codes() -> frozenset[str]:
    from ktd.protocol import ErrorCode

    return frozenset(v for k, v in vars(ErrorCode).items() if k.isupper())


# Error codes still written as strings, in modules others were changing at the time
# (issue 45): (module, line's code). Only shrinks.
UNTYPED_CODES: set[tuple[str, str]] = {
    ("ktd/daemon/engine/supervisor.py", "load_failed"),
}


def untyped_codes() -> list[tuple[str, int, str]]:
    """Protocol error codes written as string literals where one is set or given:
    ``error_code=``/``code=`` arguments and defaults, ``x.error_code = ...``."""
    codes = _codes()
    out: list[tuple[str, int, str]] = []
    for name, path in modules().items():
        rel = str(path.relative_to(REPO))
        if rel in ("ktd/protocol_base.py", "ktd/protocol_schema.py"):
            continue
        for node in ast.walk(tree(name)):
            values: list[ast.expr] = []
            if isinstance(node, ast.keyword) and node.arg in ("code", "error_code"):
                values = [node.value]
            elif isinstance(node, ast.Assign):
                attrs = [t for t in node.targets if isinstance(t, ast.Attribute)]
                values = [node.value] if any(t.attr == "error_code" for t in attrs) else []
            elif isinstance(node, ast.arguments):
                named = [*node.posonlyargs, *node.args]
                tail = named[len(named) - len(node.defaults) :]
                pairs = list(zip(tail, node.defaults, strict=True))
                kw = zip(node.kwonlyargs, node.kw_defaults, strict=True)
                pairs += [(a, d) for a, d in kw if d]
                values = [d for a, d in pairs if a.arg in ("code", "error_code")]
            for v in values:
                if isinstance(v, ast.Constant) and v.value in codes:
                    out.append((rel, v.lineno, v.value))
    return out


def test_error_codes_are_typed() -> None:
    """A code is ``p.ErrorCode.X``: a typo in a string is a new code no client knows."""
    found = untyped_codes()
    assert [f for f in found if (f[0], f[2]) not in UNTYPED_CODES] == []
    assert {(f[0], f[2]) for f in found} == UNTYPED_CODES, "typed now: take it off the list"


# Class names still defined twice, each with the modules that define it: every rename
# touches a module others were changing at the time (issue 45). Only shrinks.
TWICE: dict[str, set[str]] = {}


def test_no_class_name_is_defined_twice() -> None:
    """A name means one thing: two ``Holder``s (a claim's frontend process and a fit's
    engine) read alike in a diff and in a traceback, and one import away from the wrong one."""
    twice = {
        name: {where.rsplit(":", 1)[0] for where in places}
        for name, places in class_names().items()
        if len(places) > 1
    }
    assert {n: m for n, m in twice.items() if TWICE.get(n) != m} == {}
    assert sorted(set(TWICE) - set(twice)) == [], "defined once now: take it off TWICE"


MAX_FUNCTION_LINES = 60
# No function over MAX_FUNCTION_LINES outside the sim (an engine's stand-in, whose
# handlers copy SGLang's own), issue 45.


def long_functions() -> dict[str, int]:
    """Every function of ktd and ktctl but the sim's over MAX_FUNCTION_LINES, by
    ``path:Class.name``, with its lines."""
    out: dict[str, int] = {}

    def walk(node: ast.AST, path: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, path, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (child.end_lineno or child.lineno) - child.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    out[f"{path}:{prefix}{child.name}"] = n
                walk(child, path, f"{prefix}{child.name}.")

    for name, path in modules().items():
        if not _within(name, "ktd.sim"):
            walk(tree(name), str(path.relative_to(REPO)), "")
    return out


def test_no_function_over_60_lines_outside_the_sim() -> None:
    assert long_functions() == {}, "split the function along its seams"
