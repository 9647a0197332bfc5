"""Where the real SGLang lives for tests, and how to launch it.  Stdlib only.

    from tests.real import engine_env as ee
    py = ee.venv_python()                      # upstream sglang 0.5.23
    cmd = [py, "-m", "sglang.launch_server", "--model", ee.model_dir(),
           "--host", "127.0.0.1", "--port", str(port),
           "--served-model-name", "tiny", *ee.ENGINE_FLAGS]
    subprocess.Popen(cmd, env=ee.engine_env(), start_new_session=True)

Every path here comes from tests/real/install.py (its ``artefacts()``), the one step
that makes them all. Nothing here installs anything unless asked: ``venv_python()`` and
``model_dir()`` raise EngineNotInstalled (with the command to run) when the cache is
missing; pass ``install=True`` (or set KTD_REAL_INSTALL=1) to run install.py on demand.
"""

import json
import os
import subprocess
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_INSTALL = os.path.join(_HERE, "install.py")

# CPU-only flags that the real server needs on this machine (no GPU, no
# CUDA graphs, no flashinfer).  --skip-server-warmup: the ready line is still
# logged, right after uvicorn starts, without SGLang's own warm-up request.
ENGINE_FLAGS = [
    "--device",
    "cpu",
    "--attention-backend",
    "torch_native",
    "--sampling-backend",
    "pytorch",
    "--disable-cuda-graph",
    "--skip-server-warmup",
    "--mem-fraction-static",
    "0.5",
    "--max-total-tokens",
    "4096",
    # What ktd adds for a model that sleeps: an idle scheduler waits on its sockets
    # instead of turning its loop (which makes a spinning one measurable, issue 40).
    "--sleep-on-idle",
]

READY_LINE = "The server is fired up and ready to roll!"


class EngineNotInstalled(RuntimeError):
    pass


def _install_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("_ktd_real_install", _INSTALL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _want_install(install):
    return install if install is not None else os.environ.get("KTD_REAL_INSTALL") == "1"


def _ensure(kt: bool, install: bool | None) -> object:
    """install.py's module, once every artefact the tier opens exists (installed on demand
    when asked), else EngineNotInstalled naming what is missing and the command."""
    inst = _install_module()
    gaps = inst.missing(kt)
    if gaps and _want_install(install):
        cmd = [sys.executable, _INSTALL] + (["--kt"] if kt else [])
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        gaps = inst.missing(kt)
    if gaps:
        raise EngineNotInstalled(
            "not installed: "
            + "; ".join(f"{what} (expected {path})" for what, path in gaps)
            + f"; run: python3 {os.path.relpath(_INSTALL)}{' --kt' if kt else ''}"
        )
    return inst


def venv_dir(kt: bool = False, install=None) -> str:
    """The cache directory of the venv (upstream, or the kt fork's)."""
    inst = _ensure(kt, install)
    return inst.kt_dir() if kt else inst.upstream_dir()


def venv_python(kt: bool = False, install=None) -> str:
    """Path of the venv's python (kt=True: the fork's venv)."""
    return os.path.join(venv_dir(kt, install), "venv", "bin", "python")


def standins_dir() -> str:
    return os.path.join(_HERE, "standins")


def engine_env(base=None) -> dict:
    """Environment for the engine process: the given one (default os.environ)
    plus what the CPU engine needs.  The stand-ins go on PYTHONPATH only here."""
    env = dict(os.environ if base is None else base)
    for k in ("PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"):
        env.pop(k, None)
    env.update(
        SGLANG_USE_CPU_ENGINE="1",
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        PYTHONPATH=standins_dir(),
        PYTHONUNBUFFERED="1",
    )
    return env


def model_dir(install=None) -> str:
    """The tiny Qwen2 model (tests/real/make_model.py), made by install.py beside the venv."""
    return _ensure(False, install).model_dir()


def ktd_config(
    root: "os.PathLike[str] | str",
    python: str,
    models: list[dict[str, object]],
    daemon: dict[str, object],
    frontend: dict[str, object] | None = None,
) -> tuple[str, dict[str, str]]:
    """A ktd config under ``root`` (``etc/config.json`` + ``models.json``) for engines of
    the real venv's ``python``, and the environment ktd runs in (its runtime and state
    directories under ``root``, this repo importable): for a real-tier module's daemon."""
    etc = os.path.join(str(root), "etc")
    os.makedirs(etc, exist_ok=True)
    cfg = {"ktransformers": {"python": python}, "models_file": "models.json", "daemon": daemon}
    if frontend is not None:
        cfg["frontend"] = frontend
    with open(os.path.join(etc, "models.json"), "w") as f:
        json.dump(models, f)
    with open(os.path.join(etc, "config.json"), "w") as f:
        json.dump(cfg, f)
    env = dict(os.environ)
    env["KTD_RUNTIME_DIR"] = os.path.join(str(root), "run")
    env["KTD_STATE_DIR"] = os.path.join(str(root), "state")
    repo = os.path.dirname(os.path.dirname(_HERE))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    return os.path.join(etc, "config.json"), env
