"""TEMPORARY local stand-in until the installer lands (lead's dev copy)."""


def venv_python(kt: bool = False) -> str:
    return "/tmp/mykt/bin/python" if kt else "/tmp/rs/v1/bin/python"


def standins_dir() -> str:
    return "/work/wt-real/tests/real/standins"


def model_dir() -> str:
    return "/tmp/rs/m1"


def engine_env() -> dict:
    return {
        "SGLANG_USE_CPU_ENGINE": "1",
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": standins_dir(),
    }


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
]
