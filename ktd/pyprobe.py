"""What the engine's Python can run: which SGLang (package, real version, options), kt-kernel.

Why a subprocess of that Python: the engine usually runs in another venv than
ktd, so only that interpreter can answer. Why read the options from SGLang's
own argparse (``ServerArgs.add_cli_args``, which both ``sglang`` and the kt
fork ``sglang-kt`` build their parser with): the two packages differ in their
``--kt-*`` flags and real SGLang refuses an unknown flag with exit 2, so argv
is built only from flags the installed SGLang declares (:mod:`ktd.core.sglang_options`).
Why package metadata: the fork reports ``sglang.__version__ == "0.0.0.dev0"``;
``packages_distributions()["sglang"]`` names the distribution that installed
the module (``sglang`` or ``sglang-kt``) and its real version.

Kept out of ``ktd/daemon/`` (issue 45): ``ktctl doctor`` runs the same probe in
its own process when the daemon is down, and ktctl never imports the daemon.
The daemon's cached, trio-run probe is ``ktd.daemon.engine.probe``.
"""

from __future__ import annotations

import os
import subprocess

import msgspec

from ktd import foreign
from ktd.core.command import build_env
from ktd.core.config import ModelSpec
from ktd.core.sglang_options import CatalogData, SGLangOptions

# Stdlib only in the engine's interpreter; every step guarded so one missing
# piece (an SGLang without server_args) still reports the rest.
PROBE_CODE = r"""
import json, sys
out = {"python": sys.executable, "version": sys.version.split()[0]}
for name in ("sglang", "kt_kernel"):
    try:
        mod = __import__(name)
        out[name] = str(getattr(mod, "__version__", "unknown"))
    except Exception as exc:
        out[name] = None
        out[name + "_error"] = f"{type(exc).__name__}: {exc}"
try:
    import kt_kernel
    out["kt_variant"] = str(getattr(kt_kernel, "__cpu_variant__", ""))
except Exception:
    pass
if out.get("sglang") is not None:
    try:
        import importlib.metadata as md
        dists = md.packages_distributions().get("sglang") or []
        out["sglang_dists"] = list(dists)
        for d in dists:
            out["sglang_package"] = d
            out["sglang_package_version"] = md.version(d)
            break
    except Exception:
        pass
    try:
        import argparse
        from sglang.srt.server_args import ServerArgs
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        opts = []
        for a in parser._actions:
            if not a.option_strings or a.dest == "help":
                continue
            d = a.default
            if isinstance(d, (list, tuple)):
                d = [x for x in d if isinstance(x, (str, int, float))]
            elif not isinstance(d, (str, int, float, bool, type(None))):
                d = None
            t = a.type
            c = a.choices
            if isinstance(c, (set, frozenset)):  # a set's order changes with the hash seed
                c = sorted(c, key=str)
            opts.append({
                "flags": list(a.option_strings),
                "dest": a.dest,
                "nargs": a.nargs,
                "choices": None if c is None else [str(x) for x in c],
                "type": None if t is None else getattr(t, "__name__", type(t).__name__),
                "default": d,
                "action": type(a).__name__.strip("_").replace("Action", "").lower() or "store",
            })
        out["options"] = opts
    except BaseException as exc:
        out["options_error"] = f"{type(exc).__name__}: {exc}"
print("KTD_PROBE " + json.dumps(out))
"""

# The packages a kt engine needs; named in every advice ktd gives.
KT_FORK = "sglang-kt"
UPSTREAM = "sglang"


class ProbeResult(msgspec.Struct, kw_only=True):
    python: str
    ok_python: bool = True
    version: str | None = None
    sglang: str | None = None  # the real version (package metadata), else __version__
    sglang_package: str | None = None  # "sglang" or "sglang-kt"
    kt_kernel: str | None = None
    kt_variant: str | None = None
    sglang_error: str | None = None
    kt_kernel_error: str | None = None
    options: CatalogData | None = None
    options_error: str | None = None
    error: str | None = None

    @property
    def complete(self) -> bool:
        return self.sglang is not None and self.kt_kernel is not None

    @property
    def catalog(self) -> SGLangOptions | None:
        """SGLang's options, or None when they could not be read (argv is then built blind)."""
        return SGLangOptions.from_data(self.options) if self.options is not None else None

    @property
    def sglang_label(self) -> str:
        if self.sglang is None:
            return "no sglang"
        return f"{self.sglang_package or 'sglang'} {self.sglang}"

    def summary(self) -> dict[str, object]:
        """For doctor and status: what was found, without the option list."""
        cat = self.catalog
        return {
            "python": self.python,
            "sglang": self.sglang,
            "sglang_package": self.sglang_package,
            "kt_fork": cat.kt_fork if cat else None,
            "kt_flags": sorted(f for o in cat.options for f in o.flags if f.startswith("--kt-"))
            if cat
            else None,
            "kt_kernel": self.kt_kernel,
            "kt_variant": self.kt_variant,
            "options_error": self.options_error,
            "error": self.error,
        }


def parse_probe_output(python: str, returncode: int, output: str) -> ProbeResult:
    for line in output.splitlines():
        if line.startswith("KTD_PROBE "):
            try:
                data = foreign.loads(line[len("KTD_PROBE ") :])
            except ValueError:
                break
            sglang = data.get("sglang")
            package = data.get("sglang_package")
            if sglang is not None and data.get("sglang_package_version"):
                sglang = str(data["sglang_package_version"])
            options = None
            options_error = data.get("options_error")
            if sglang is not None and isinstance(data.get("options"), list):
                try:
                    raw = {
                        "package": package or UPSTREAM,
                        "version": sglang,
                        "options": data["options"],
                    }
                    options = msgspec.convert(raw, CatalogData)
                except msgspec.ValidationError as exc:
                    options_error = f"unreadable option list: {exc}"
                else:
                    if package is None and SGLangOptions.from_data(options).kt_fork:
                        options.package = KT_FORK  # no metadata (a source checkout): tell by flags
                        package = KT_FORK
            return ProbeResult(
                python=python,
                version=data.get("version"),
                sglang=sglang,
                sglang_package=package if sglang is not None else None,
                kt_kernel=data.get("kt_kernel"),
                kt_variant=data.get("kt_variant") or None,
                sglang_error=data.get("sglang_error"),
                kt_kernel_error=data.get("kt_kernel_error"),
                options=options,
                options_error=options_error,
            )
    tail = " | ".join(output.strip().splitlines()[-3:])
    return ProbeResult(
        python=python, ok_python=False, error=f"probe exited {returncode}: {tail or 'no output'}"
    )


def missing_message(result: ProbeResult, *, auto_build: bool) -> str | None:
    """The actionable sentence for a load that cannot start, or None when it may go on.

    kt-kernel is checked first: it is never installed by ktd, so pip-installing
    SGLang for an engine that cannot run anyway would waste minutes.
    """
    if not result.ok_python:
        return f"cannot run the engine's Python: {result.error}"
    problems = []
    if result.kt_kernel is None:
        problems.append(
            f"kt_kernel is not importable in {result.python} ({result.kt_kernel_error}); ktd never "
            "builds or installs kt-kernel: install it out of band (see the ktransformers "
            "kt-kernel install guide), then load again"
        )
    if result.sglang is None and (not auto_build or problems):
        problems.append(
            f"sglang is not importable in {result.python} ({result.sglang_error}); install the kt "
            f"fork of SGLang into that environment (`{result.python} -m pip install {KT_FORK}`; "
            "it pins the kt-kernel it needs), or point `ktransformers.python` at its venv, "
            "or set `ktransformers.auto_build: true`"
        )
    return "; ".join(problems) or None


def probe_python(spec: ModelSpec, *, timeout: float = 120.0) -> ProbeResult:
    """Imports, real versions and SGLang's option list in the engine's interpreter,
    run to the end in this thread (doctor's way; the daemon's is ``run_probe``)."""
    env = build_env(spec, os.environ)
    try:
        r = subprocess.run(
            [spec.python, "-c", PROBE_CODE],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ProbeResult(python=spec.python, ok_python=False, error=str(exc))
    return parse_probe_output(spec.python, r.returncode, r.stdout + r.stderr)
