#!/usr/bin/env python3
"""Install (or reuse) the cached venvs that run the REAL SGLang for tests.

    python3 tests/real/install.py          # upstream sglang 0.5.23, CPU torch
    python3 tests/real/install.py --kt     # + the kt fork (sglang-kt 0.7.2)
    python3 tests/real/install.py --kt --check   # install nothing; list what is missing

Everything the tier opens is made here, the tiny model included (``artefacts()``
lists it; tests/real/engine_env.py takes its paths from there, and an install
that ends with any of them missing exits non-zero).

The last stdout line is the path of the venv's python (with --kt: the fork's
venv's python).  Stdlib only.  The venvs live outside the repo, under
$KTD_REAL_CACHE (default ~/.cache/ktd-real/), one directory per package set,
named after a hash of the pinned steps below: changing a pin makes a new venv.
A directory counts as installed only once its marker file exists; the marker
is written after every step and a smoke import succeeded, so a re-run on a
complete directory is a quick stat, and an interrupted install starts over.

Upstream venv: CPU torch first (torch==2.13.0; a CPU wheel is on this disk,
and a constraints file pins it for every later step so nothing pulls a CUDA
torch), then sglang with --no-deps (its own pins would pull CUDA torch,
sglang-kernel, flashinfer...), then the pure-Python/CPU dependencies that the
server actually imports, then torchvision and kt-kernel with --no-deps.

kt venv: only the fork's ``sglang`` package (sglang-kt, --no-deps) in a venv
of its own; every other package is reused from the upstream venv through a
``.pth`` line that adds a *view* of the upstream site-packages: a directory of
symlinks to all of it except upstream's ``sglang`` and its dist-info, so the
fork's ``sglang`` is the only one and importlib.metadata sees only sglang-kt.
"""

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

SGLANG = "sglang==0.5.23"
SGLANG_KT = "sglang-kt==0.7.2"
TORCH = "torch==2.13.0"

# Every package the upstream CPU server needs, with the exact version that
# was installed and run here (python 3.11, 2026-12).  Found by iterating on
# the import errors of `python -m sglang.launch_server --help` and of serving
# a chat completion.  torch is pinned by the constraints file.
PURE_DEPS = [
    "aiohappyeyeballs==2.7.1",
    "aiohttp==3.14.5",
    "aiosignal==1.4.0",
    "airportsdata==20260905",
    "annotated-doc==0.0.7",
    "annotated-types==0.8.0",
    "anthropic==2.15.0",
    "anyio==4.16.0",
    "apache-tvm-ffi==0.1.15.post2",
    "asttokens==3.0.2",
    "attrs==26.1.0",
    "blobfile==3.0.0",
    "certifi==2026.10.19.post1",
    "cffi==2.1.1",
    "charset-normalizer==3.5.3",
    "click==8.5.1",
    "cloudpickle==3.1.3",
    "compressed-tensors==0.18.0",
    "dill==0.4.1",
    "diskcache==5.6.3",
    "distro==1.9.0",
    "docstring_parser==0.18.0",
    "einops==0.8.2",
    "executing==2.3.0",
    "fastapi==0.165.0",
    "filelock==4.3.1",
    "frozenlist==1.8.0",
    "fsspec==2026.9.0",
    "gguf==0.19.0",
    "h11==0.16.0",
    "hf-xet==1.8.0",
    "httpcore2==2.16.2",
    "httpcore==1.0.9",
    "httpx2==2.16.2",
    "httpx==0.28.1",
    "huggingface_hub==1.33.0",
    "idna==3.20",
    "interegular==0.3.3",
    "ipython==9.18.1",
    "ipython_pygments_lexers==1.1.1",
    "jedi==0.20.1",
    "Jinja2==3.1.6",
    "jiter==0.19.0",
    "jsonschema-specifications==2025.9.1",
    "jsonschema==4.26.0",
    "lark==1.3.1",
    "llguidance==1.9.1",
    "loguru==0.7.3",
    "lxml==6.1.3",
    "markdown-it-py==4.3.0",
    "MarkupSafe==3.0.4",
    "matplotlib-inline==0.2.2",
    "mdurl==0.1.2",
    "mpmath==1.3.0",
    "msgspec==0.23.0",
    "multidict==7.2.1",
    "nest-asyncio==1.6.0",
    "networkx==3.6.1",
    "numpy==2.4.6",
    "openai-harmony==0.0.4",
    "openai==2.8.0",
    "opentelemetry-api==1.45.2",
    "orjson==3.13.0",
    "outlines==0.1.11",
    "outlines_core==0.1.26",
    "packaging==26.4",
    "parso==0.8.7",
    "partial-json-parser==0.2.1.1.post7",
    "pexpect==4.9.0",
    "pillow==13.0.0",
    "prometheus_client==0.26.0",
    "prompt_toolkit==3.0.53",
    "propcache==0.5.4",
    "psutil==7.2.2",
    "ptyprocess==0.7.0",
    "pure_eval==0.2.4",
    "pybase64==1.5.1",
    "pycountry==26.2.16",
    "pycparser==3.12",
    "pycryptodomex==3.24.2",
    "pydantic==2.14.4",
    "pydantic_core==2.50.5",
    "Pygments==2.21.0",
    "python-dateutil==2.9.0.post0",
    "python-multipart==0.0.34",
    "PyYAML==6.0.4",
    "pyzmq==27.3.0",
    "referencing==0.37.0",
    "regex==2026.11.19",
    "requests==2.34.2",
    "rich==15.0.0",
    "rpds-py==2026.9.1",
    "safetensors==0.8.0",
    "scipy==1.17.1",
    "sentencepiece==0.2.1",
    "setproctitle==1.3.8",
    "setuptools==84.2.1",
    "shellingham==1.5.4",
    "six==1.17.0",  # for python-dateutil<3 (sglang pins it below 3)
    "sniffio==1.3.1",
    "soundfile==0.14.0",
    "stack-data==0.6.3",
    "starlette==1.10.0",
    "sympy==1.14.0",
    "tiktoken==0.14.0",
    "tokenizers==0.23.2",
    "tqdm==4.70.1",
    "traitlets==5.16.1",
    "transformers==5.19.0",
    "triton==3.9.0",
    "truststore==0.10.5",
    "typer==0.29.2",
    "typing-inspection==0.4.5",
    "typing_extensions==4.16.0",
    "tzdata==2026.6",
    "urllib3==2.8.0",
    "uvicorn==0.54.0",
    "uvloop==0.23.0",
    "watchfiles==1.3.0",
    "wcwidth==0.9.4",
    "xgrammar==0.2.7",
    "xxhash==4.1.0",
    "yarl==1.25.1",
    "zstandard==0.25.0",
]

NO_DEPS = [
    "torchvision==0.28.0",  # CUDA-linked _C; see standins/sitecustomize.py
    "kt-kernel==0.7.2",  # so `import kt_kernel` works (CPU variants inside)
]

MARKER = ".ktd-real-complete"
MODEL_MARKER = ".ktd-tiny-model-complete"  # written by make_model.py once the model is whole
MAKE_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "make_model.py")


def steps_upstream():
    return [
        ["install", TORCH],
        ["install", "--no-deps", SGLANG],
        ["install", *PURE_DEPS],
        ["install", "--no-deps", *NO_DEPS],
    ]


def steps_kt():
    return [["install", "--no-deps", SGLANG_KT]]


def cache_root():
    root = os.environ.get("KTD_REAL_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "ktd-real"
    )
    return os.path.abspath(root)


def key(*parts):
    blob = json.dumps([sys.version_info[:2], *parts], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def upstream_dir():
    return os.path.join(cache_root(), f"sglang-0.5.23-{key(TORCH, steps_upstream())}")


def kt_dir():
    base = os.path.basename(upstream_dir())
    return os.path.join(cache_root(), f"sglang-kt-0.7.2-{key(base, steps_kt())}")


def venv_python(d):
    return os.path.join(d, "venv", "bin", "python")


def is_complete(d):
    return os.path.exists(os.path.join(d, MARKER)) and os.path.exists(venv_python(d))


def model_dir():
    """The tiny Qwen2 model the tier serves; made with (and kept beside) the upstream venv."""
    return os.path.join(upstream_dir(), "model-tiny-qwen2")


def artefacts(kt):
    """Every file the tier opens, as (what, path): tests/real/engine_env.py hands the tier
    these paths and no others, and an install is complete only when all of them exist."""
    out = [
        ("upstream sglang venv", venv_python(upstream_dir())),
        ("tiny model", os.path.join(model_dir(), MODEL_MARKER)),
    ]
    if kt:
        out.append(("sglang-kt venv", venv_python(kt_dir())))
    return out


def missing(kt):
    return [(what, path) for what, path in artefacts(kt) if not os.path.exists(path)]


def log(msg):
    print(f"[ktd-real install {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def locked(d):
    import fcntl

    os.makedirs(os.path.dirname(d), exist_ok=True)
    with open(d + ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def run(cmd, logf, env=None):
    shown = cmd if len(cmd) < 12 else [*cmd[:8], f"... ({len(cmd) - 8} more)"]
    if shown[1:2] == ["-c"]:
        shown = [*shown[:2], "<smoke test>"]
    log("$ " + " ".join(shown))
    logf.write("$ " + " ".join(cmd) + "\n")
    logf.flush()
    r = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
    if r.returncode != 0:
        raise SystemExit(
            f"install step failed (exit {r.returncode}): {' '.join(cmd)}\nsee {logf.name}"
        )


def pip_env():
    env = dict(os.environ)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.pop("PYTHONPATH", None)
    return env


def standins_dir():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "standins")


def smoke_env():
    env = dict(os.environ)
    env.update(
        SGLANG_USE_CPU_ENGINE="1",
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=standins_dir(),
    )
    return env


SMOKE_UPSTREAM = """
import torch
assert torch.__version__.startswith("2.13.0"), torch.__version__
assert torch.version.cuda is None, "a CUDA torch got installed"
import kt_kernel, torchvision, transformers
import sglang.srt.entrypoints.http_server
import sglang.srt.managers.scheduler
import sglang.srt.managers.detokenizer_manager
import sglang.srt.models.qwen2
from sglang.srt.server_args import prepare_server_args
prepare_server_args(["--model-path", "x", "--device", "cpu"])
print("smoke ok", torch.__version__, kt_kernel.__version__)
"""

# The fork's argparse only: building its ServerArgs (prepare_server_args)
# imports sglang.srt.layers.quantization.fp8, which calls
# torch.cuda.get_device_capability() at import time, so it needs a GPU even
# with --device cpu.  parse_args is what the tests need.
SMOKE_KT = """
import argparse, importlib.metadata as m
dists = m.packages_distributions().get("sglang")
assert dists == ["sglang-kt"], dists
from sglang.srt.server_args import ServerArgs
p = argparse.ArgumentParser()
ServerArgs.add_cli_args(p)
ns = p.parse_args(["--model-path", "x", "--kt-numa-nodes", "0", "1"])
assert ns.kt_numa_nodes == [0, 1], ns.kt_numa_nodes
import sglang.srt.server_args as sa
print("smoke ok (kt fork)", sa.__file__)
"""


def make_venv(d):
    shutil.rmtree(os.path.join(d, "venv"), ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(d, MARKER))
    os.makedirs(d, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", os.path.join(d, "venv")], check=True)


def install_into(d, what, label, steps, smoke, prepare=None, finish=None):
    """Both installs' frame: lock, fresh venv, ``prepare(cons)`` (write the
    constraints file), the pip ``steps``, ``finish()``, the ``smoke`` test, then the
    marker that makes the next run skip it all."""
    if is_complete(d):
        return d
    with locked(d):
        if is_complete(d):
            return d
        t0 = time.monotonic()
        log(f"installing {what} into {d}")
        make_venv(d)
        cons = os.path.join(d, "constraints.txt")
        prepare(cons)
        py = venv_python(d)
        with open(os.path.join(d, "install.log"), "w") as logf:
            for step in steps():
                run([py, "-m", "pip", *step[:1], "-c", cons, *step[1:]], logf, pip_env())
            if finish is not None:
                finish()
            run([py, "-c", smoke], logf, smoke_env())
        write_marker(d, steps(), time.monotonic() - t0)
        log(f"{label} venv ready in {time.monotonic() - t0:.0f}s")
    return d


def install_upstream():
    def prepare(cons):
        with open(cons, "w") as f:
            f.write(TORCH + "\n")

    d = install_into(
        upstream_dir(), "upstream sglang", "upstream", steps_upstream, SMOKE_UPSTREAM, prepare
    )
    make_model()
    return d


def make_model():
    """The tiny model, made by the venv's own python (torch, transformers); idempotent:
    make_model.py builds beside the target and renames it into place once whole."""
    out = model_dir()
    if os.path.exists(os.path.join(out, MODEL_MARKER)):
        return out
    with locked(out):
        if not os.path.exists(os.path.join(out, MODEL_MARKER)):
            t0 = time.monotonic()
            log(f"making the tiny model in {out}")
            with open(os.path.join(upstream_dir(), "model.log"), "w") as logf:
                run([venv_python(upstream_dir()), MAKE_MODEL, out], logf, smoke_env())
            log(f"tiny model made in {time.monotonic() - t0:.0f}s")
    return out


def site_packages(d):
    py = venv_python(d)
    out = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    return out


def make_view(base_sp, view):
    """Symlinks to every entry of base_sp except upstream's sglang package."""
    shutil.rmtree(view, ignore_errors=True)
    os.makedirs(view)
    for name in sorted(os.listdir(base_sp)):
        if name == "sglang" or (name.startswith("sglang-") and name.endswith(".dist-info")):
            continue
        os.symlink(os.path.join(base_sp, name), os.path.join(view, name))


def install_kt():
    base = install_upstream()
    d = kt_dir()
    view = os.path.join(d, "upstream-deps")

    def prepare(cons):
        shutil.copy(os.path.join(base, "constraints.txt"), cons)
        make_view(site_packages(base), view)

    def finish():
        # Appended after the venv's own site-packages, so the fork wins;
        # addsitedir also runs the .pth files of the upstream packages.
        with open(os.path.join(site_packages(d), "ktd-real-upstream-deps.pth"), "w") as f:
            f.write(f"import site; site.addsitedir({view!r})\n")

    return install_into(d, "the kt fork", "kt", steps_kt, SMOKE_KT, prepare, finish)


def write_marker(d, steps, seconds):
    tmp = os.path.join(d, MARKER + ".tmp")
    with open(tmp, "w") as f:
        json.dump(
            {"steps": steps, "seconds": round(seconds, 1), "python": sys.version.split()[0]},
            f,
            indent=1,
        )
    os.replace(tmp, os.path.join(d, MARKER))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kt", action="store_true", help="also install the kt fork (sglang-kt)")
    p.add_argument(
        "--check",
        action="store_true",
        help="install nothing: list what the tier needs and is missing (exit 1 if anything is)",
    )
    p.add_argument(
        "--print-dir",
        action="store_true",
        help="print the cache directory instead of the python path",
    )
    a = p.parse_args(argv)
    if a.check:
        gaps = missing(a.kt)
        for what, path in artefacts(a.kt):
            print(f"{'MISSING' if (what, path) in gaps else 'ok':8} {what}: {path}")
        sys.exit(1 if gaps else 0)
    d = install_kt() if a.kt else install_upstream()
    gaps = missing(a.kt)  # the post-condition: everything the tier opens is there
    if gaps:
        sys.exit("install finished but the tier would miss: " + "; ".join(map(": ".join, gaps)))
    print(d if a.print_dir else venv_python(d))


if __name__ == "__main__":
    main()
