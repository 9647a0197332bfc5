"""The engine command line and environment (pure).

Exactly the seed's argv form, as a list, never through a shell:
``<python> -m sglang.launch_server --host H --port P --model M --kt-weight-path W
--served-model-name A --context-length C [placement flags] [extra_args]``.

Why it needs the installed SGLang's option catalogue: real SGLang exits 2 on a
flag it does not declare (upstream has no ``--kt-numa-nodes``) and reads
abbreviations (``--tp 2``), so a derived flag is emitted only when SGLang
knows it and the user did not set the same option under any spelling.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec

from ktd.core.config import ModelSpec
from ktd.core.sglang_options import Option, OptionError, SGLangOptions, UserFlag, parse_user_args
from ktd.core.userflags import flag_names, user_flags

# Set on every engine so the daemon can recognise its own processes (and a
# re-started daemon its predecessor's) from /proc/<pid>/environ.
ENGINE_MARK = "KTD_ENGINE"
# The spec's launch digest, beside the marker: a ktd that lost the state file can
# still tell whether a recovered engine runs the configured launch.
DIGEST_MARK = "KTD_ENGINE_DIGEST"


# The flags ktd derives, in ktd's spelling (the seed's). SGLang's argparse ``dest``
# differs between packages (``tp_size`` upstream, ``tensor_parallel_size`` in the
# fork), so flags are matched through the catalogue by option, never by dest name.
KTD_FLAGS = (
    "--host",
    "--port",
    "--model",
    "--kt-weight-path",
    "--served-model-name",
    "--context-length",
    "--tp-size",
    "--nnodes",
    "--kt-numa-nodes",
    "--kt-threadpool-count",
    "--kt-cpuinfer",
)
# ktd must know these to reach the engine, so they come from the config alone.
OWNED = {
    "--host": "host",
    "--port": "port",
    "--model": "path (or model_path)",
    "--served-model-name": "alias (or model_id)",
}
# Flags of a multi-host launch: kt-kernel cannot span hosts (ktransformers #874).
MULTI_HOST = ("--nnodes", "--node-rank", "--dist-init-addr")


class LaunchError(ValueError):
    """A command line the installed SGLang would refuse: a load error before any launch."""


@dataclass(frozen=True)
class Command:
    """The argv, plus what ktd left out and why (shown by ``--dry-run`` and status)."""

    argv: list[str]
    notes: tuple[str, ...] = ()
    # The engine can sleep: ``"sleep": true`` and its SGLang has the memory saver.
    sleeps: bool = False


#: What ``"sleep": true`` adds to the argv (issue 28; docs/sglang.md, "Sleep"): the
#: memory saver makes /release_memory_occupation free the GPU memory (without it the
#: call answers 200 and frees nothing), the CPU backup keeps a host copy of the GPU
#: weights to resume from, and sleep-on-idle keeps an asleep engine's scheduler off
#: the CPUs an awake engine placed beside it works on. The first is required.
SAVER = "--enable-memory-saver"
SLEEP_FLAGS = (SAVER, "--enable-weights-cpu-backup", "--sleep-on-idle")


def user_flag_names(extra_args: Sequence[str]) -> set[str]:
    """Flags the user wrote in extra_args, exactly as written (no SGLang catalogue known)."""
    return flag_names(extra_args)


def read_user_args(extra_args: Sequence[str], catalog: SGLangOptions) -> list[UserFlag]:
    """``extra_args`` as SGLang will read them, or the reason it would refuse them."""
    try:
        flags = parse_user_args(extra_args, catalog)
    except OptionError as exc:
        raise LaunchError(f"extra_args {exc}") from None
    for f in flags:
        spelled = spelling(f.option)
        if spelled in OWNED:
            raise LaunchError(
                f"extra_args {f.written}: ktd sets this flag from the config's "
                f"`{OWNED[spelled]}` (it must know it to reach the engine); set it there"
            )
        if spelled in MULTI_HOST and not (spelled == "--nnodes" and f.values == ("1",)):
            raise LaunchError(
                f"extra_args {f.written}: kt engines cannot span hosts; run one ktd per host "
                "behind sglang-router instead"
            )
    return flags


def spelling(option: Option) -> str:
    """How ktd writes ``option``: its own spelling when SGLang has it, else the first long flag."""
    for f in option.flags:
        if f in KTD_FLAGS or f in MULTI_HOST:
            return f
    return next((f for f in option.flags if f.startswith("--")), option.flags[0])


def planner_args(extra_args: Sequence[str], catalog: SGLangOptions | None) -> tuple[str, ...]:
    """``extra_args`` with each flag spelled ktd's way, so the planner sees ``--tp 2`` as
    ``--tp-size 2``: a user's abbreviated placement flag must still win."""
    if catalog is None:
        return tuple(extra_args)
    out: list[str] = []
    for f in read_user_args(extra_args, catalog):
        out.append(spelling(f.option))
        out.extend(f.values)
    return tuple(out)


def _pairs(flat: Sequence[str]) -> list[tuple[str, list[str]]]:
    """``["--a", "1", "--b", "0", "1"]`` -> ``[("--a", ["1"]), ("--b", ["0", "1"])]``."""
    out: list[tuple[str, list[str]]] = []
    for tok in flat:
        if tok.startswith("--"):
            out.append((tok, []))
        elif out:
            out[-1][1].append(tok)
    return out


def _derived(
    spec: ModelSpec, port: int, placement_flags: Sequence[str], *, sleeps: bool
) -> list[tuple[str, list[str]]]:
    """The flags ktd derives, in the seed's order, each with its values: the model's own
    (where it listens, what it loads, how it is named), then the placement's, then the
    memory saver's. Which of them reach the argv is ``build_launch``'s to decide."""
    derived: list[tuple[str, list[str]]] = [
        ("--host", [spec.host]),
        ("--port", [str(port)]),
        ("--model", [spec.path]),
    ]
    if spec.kt_weight_path:
        derived.append(("--kt-weight-path", [spec.kt_weight_path]))
    derived.append(("--served-model-name", [spec.alias]))
    if spec.ctx:
        derived.append(("--context-length", [str(spec.ctx)]))
    if spec.tp_size is not None:
        derived.append(("--tp-size", [str(spec.tp_size)]))
    if spec.nnodes is not None:
        derived.append(("--nnodes", [str(spec.nnodes)]))
    derived += _pairs(placement_flags)
    if sleeps:
        derived += [(flag, []) for flag in SLEEP_FLAGS]
    return derived


def build_launch(
    spec: ModelSpec,
    port: int,
    placement_flags: Sequence[str] = (),
    catalog: SGLangOptions | None = None,
) -> Command:
    """The engine's argv in the seed's order; ``placement_flags`` are the plan's derived ones.

    With ``catalog`` (the installed SGLang's options) a derived flag is emitted
    only when this SGLang declares it and the user did not set the same
    ``dest`` in ``extra_args`` (however abbreviated); without one, flags are
    matched by name as written. Raises :class:`LaunchError` for a launch
    SGLang would refuse.
    """
    sleeps = spec.sleep and (catalog is None or catalog.exact(SAVER) is not None)
    derived = _derived(spec, port, placement_flags, sleeps=sleeps)
    argv = [spec.python, "-m", "sglang.launch_server"]
    notes: list[str] = []
    if catalog is None:
        user = user_flag_names(spec.extra_args)
        for flag, values in derived:
            if flag not in user or flag in ("--host", "--port", "--model", "--served-model-name"):
                argv += [flag, *values]
        return Command([*argv, *spec.extra_args], sleeps=sleeps)

    if spec.kt_weight_path and not catalog.has_kt:
        raise LaunchError(
            f"kt_weight_path is set, but {catalog.label} in {spec.python} has no "
            "--kt-weight-path: install the kt fork there (`pip install sglang-kt`)"
        )
    user_set = {id(f.option) for f in read_user_args(spec.extra_args, catalog)}
    if spec.sleep and not sleeps:
        notes.append(
            f"sleep off: {catalog.label} has no {SAVER}; this model's swaps stop and reload"
        )
    for flag, values in derived:
        option = catalog.exact(flag)
        if option is None:
            notes.append(f"{flag} left out: not an option of {catalog.label}")
            continue
        if id(option) in user_set:
            continue
        argv += [flag, *values]
    return Command([*argv, *spec.extra_args], tuple(notes), sleeps=sleeps)


#: How ktd hands an engine its API key (issue 32): in a YAML file SGLang reads with
#: ``--config`` (``ConfigArgumentMerger``: each key becomes ``--<key> <value>`` ahead of
#: the command line, so the key is spelled as the flag, ``api-key``), never on the
#: command line, which every local user can read in ``/proc/PID/cmdline``.
CONFIG_FLAG = "--config"
KEY_FLAG = "--api-key"
#: With ``--admin-api-key`` set, SGLang's admin-level routes (the memory calls, the
#: pause, continue and flush of a sleep's fence) want that key and no other
#: (``utils/auth.py``, ``decide_request_auth``): ktd carries the user's, from the same file.
ADMIN_KEY_FLAG = "--admin-api-key"


@dataclass(frozen=True)
class Keying:
    """Whether the engine's key is in a file (``config``: ktd writes it and appends
    ``--config FILE``): ktd's own key, or the user's ``--api-key`` from extra_args
    (``user_key``) taken off the command line (``extra_args`` is what is left), or the
    user's key stays on the command line (no ``--config`` in this SGLang), or there is
    none (``note`` says why: its port answers every local user)."""

    config: bool = False
    user_key: str | None = None
    note: str | None = None
    extra_args: tuple[str, ...] | None = None  # extra_args without the user's keys
    admin_key: str | None = None  # the user's --admin-api-key (in the file when ``config``)
    # ktd gives the engine an admin key of its own, in the file: SGLang's admin-level
    # routes (release, resume, the fence's pause, flush and continue) then want it, and
    # the API key that frontends and lease holders get cannot call them.
    own_admin: bool = False


def keyed_launch(
    spec: ModelSpec, port: int, placement_flags: Sequence[str], catalog: SGLangOptions | None
) -> tuple[Command, Keying]:
    """The engine's command and how it is keyed, the user's ``--api-key`` moved out of
    its argv when it goes in the key file (a launch and ``ktctl load --dry-run`` alike)."""
    keyed = keying(spec, catalog)
    if keyed.extra_args is not None:
        spec = msgspec.structs.replace(spec, extra_args=keyed.extra_args)
    return build_launch(spec, port, placement_flags, catalog), keyed


def keying(spec: ModelSpec, catalog: SGLangOptions | None) -> Keying:
    """How ``spec``'s engine is keyed under the installed SGLang (``catalog``).

    Raises :class:`LaunchError` for a ``--config`` of the user's own: SGLang reads one
    config file only ("Multiple config files specified"), and ktd's carries the key."""
    if catalog is None:
        flags = user_flags(spec.extra_args)
        values, admin = flags.get(KEY_FLAG), flags.get(ADMIN_KEY_FLAG)
        blind_admin = admin[-1] if admin else None
        if values:
            return Keying(user_key=values[-1], note=_USER_KEY_NOTE, admin_key=blind_admin)
        note = "no API key: the installed SGLang's options are unknown"
        return Keying(note=note, admin_key=blind_admin)
    user_key: str | None = None
    admin_key: str | None = None
    workers = 1
    key_tokens: set[int] = set()
    admin_tokens: set[int] = set()
    for f in read_user_args(spec.extra_args, catalog):
        if f.option.dest == "api_key" and f.values:
            user_key = f.values[-1]
            key_tokens.update(range(*f.span))
        elif f.option.dest == "admin_api_key" and f.values:
            admin_key = f.values[-1]
            admin_tokens.update(range(*f.span))
        elif f.option.dest == "tokenizer_worker_num" and f.values:
            workers = int(f.values[-1]) if f.values[-1].isdigit() else 1
        elif f.option.dest == "config":
            raise LaunchError(
                f"extra_args {f.written}: ktd gives each engine a config file of its own "
                "(its API key, readable by ktd alone); write those options in extra_args"
            )
    in_file = catalog.exact(CONFIG_FLAG) is not None and catalog.exact(KEY_FLAG) is not None
    # The admin key goes in the file too, unless SGLang's merge would read it as a flag.
    admin_in_file = in_file and admin_key is not None and not admin_key.startswith("-")
    if not admin_in_file:
        admin_tokens = set()
    keyed = _keyed(spec, catalog, in_file, user_key, key_tokens | admin_tokens, workers)
    if admin_key is None:
        own = keyed.config and catalog.exact(ADMIN_KEY_FLAG) is not None
        return dataclasses.replace(keyed, own_admin=own)
    if not (admin_in_file and keyed.config):
        note = (
            f"{ADMIN_KEY_FLAG} from extra_args is on the engine's command line, readable by "
            "every local user (this SGLang reads no key file, or the key starts with '-'); "
            "ktd sends it with its sleep and wake calls"
        )
        keyed = dataclasses.replace(keyed, note="; ".join(n for n in (keyed.note, note) if n))
        if keyed.extra_args is not None:  # the admin key stays where the user wrote it
            keyed = dataclasses.replace(
                keyed,
                extra_args=tuple(t for i, t in enumerate(spec.extra_args) if i not in key_tokens),
            )
    return dataclasses.replace(keyed, admin_key=admin_key)


def _keyed(
    spec: ModelSpec,
    catalog: SGLangOptions,
    in_file: bool,
    user_key: str | None,
    dropped: set[int],
    workers: int,
) -> Keying:
    """``keying`` once the user's flags are read: ``dropped`` are the tokens of the keys
    that go in the file."""
    if user_key is not None:
        if not in_file or user_key.startswith("-"):  # SGLang's merge would read a flag
            return Keying(user_key=user_key, note=_USER_KEY_NOTE)
        rest = tuple(t for i, t in enumerate(spec.extra_args) if i not in dropped)
        return Keying(config=True, user_key=user_key, extra_args=rest)
    if workers > 1:
        # Each tokenizer worker asserts ``api_key is None`` (http_server.py, both packages).
        return Keying(
            note="no API key: SGLang takes none with --tokenizer-worker-num above 1; "
            "its port answers every local user"
        )
    if not in_file:
        return Keying(
            note=f"no API key: {catalog.label} has no {CONFIG_FLAG} and {KEY_FLAG}; "
            "its port answers every local user"
        )
    if dropped:
        rest = tuple(t for i, t in enumerate(spec.extra_args) if i not in dropped)
        return Keying(config=True, extra_args=rest)
    return Keying(config=True)


_USER_KEY_NOTE = (
    f"{KEY_FLAG} from extra_args is on the engine's command line, readable by every local "
    f"user (this SGLang reads no {CONFIG_FLAG} file, or the key starts with '-'); without "
    "it ktd gives the engine a key of its own in a file only ktd reads"
)


def with_key_file(argv: Sequence[str], path: str) -> list[str]:
    """``argv`` reading the engine's key file: ``--config PATH`` as two words (SGLang
    merges the file only when ``--config`` stands alone, not as ``--config=PATH``)."""
    return [*argv, CONFIG_FLAG, path]


def key_file_of(argv: Sequence[str]) -> str | None:
    """The ``--config`` file an engine's argv names (an adopted engine's key is there)."""
    args = list(argv)
    for i, tok in enumerate(args[:-1]):
        if tok == CONFIG_FLAG:
            return args[i + 1]
    return None


def user_key_of(argv: Sequence[str], flag: str = KEY_FLAG) -> str | None:
    """The ``--api-key`` (or ``flag``) an engine's argv carries, as argparse reads it
    (last one wins)."""
    values = user_flags(argv).get(flag)
    return values[-1] if values else None


def build_argv(
    spec: ModelSpec,
    port: int,
    placement_flags: Sequence[str] = (),
    catalog: SGLangOptions | None = None,
) -> list[str]:
    return build_launch(spec, port, placement_flags, catalog).argv


#: What an engine that sleeps needs in its environment: without it SGLang captures its
#: CUDA graphs outside the memory saver, and a release of ``cuda_graph`` frees nothing
#: (``SGLANG_MEMORY_SAVER_CUDA_GRAPH``, read where each graph runner captures).
SLEEP_ENV = {"SGLANG_MEMORY_SAVER_CUDA_GRAPH": "1"}


def build_env(
    spec: ModelSpec,
    base: Mapping[str, str],
    placement_env: Mapping[str, str] | None = None,
    *,
    engine_id: str = "",
    digest: str = "",
    sleeps: bool = False,
) -> dict[str, str]:
    """ktd's environment, then the plan's (CUDA_VISIBLE_DEVICES) and a sleeper's
    (``SLEEP_ENV``), then the user's extra_env.

    The user's values win over the plan's: an operator who pins
    CUDA_VISIBLE_DEVICES by hand means it.
    """
    env = dict(base)
    env.pop("KTD_SOCKET", None)
    env.update(placement_env or {})
    if sleeps:
        env.update(SLEEP_ENV)
    env.update(spec.env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env[ENGINE_MARK] = engine_id or spec.alias
    if digest:
        env[DIGEST_MARK] = digest
    return env


def env_additions(
    spec: ModelSpec, placement_env: Mapping[str, str], *, sleeps: bool = False
) -> dict[str, str]:
    """What ktd adds over its own environment: the dry-run plan shows exactly this."""
    env = dict(placement_env)
    if sleeps:
        env.update(SLEEP_ENV)
    env.update(spec.env)
    return env
