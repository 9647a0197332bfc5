"""The real-SGLang tier: ktd against the real ``sglang`` server (and ``sglang-kt``'s argparse).

Run with ``python -m pytest -m real tests/real`` after ``python3 tests/real/install.py
--kt`` (the README's test command does both; the venvs are cached outside the
repo). Every test here carries the ``real`` marker, which the main suite
deselects. A missing venv is an error, never a skip: a skipped check is not a
check.

The engine is loaded once per module (a real load takes ~30 s here), so the
leak check runs once per module, after the module's daemon is gone, instead
of after every test.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import fail_on_leaks

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.real)
            if item.get_closest_marker("timeout") is None:  # real imports take tens of seconds
                item.add_marker(pytest.mark.timeout(900))


@pytest.fixture(scope="session")
def venv_python() -> Callable[..., str]:
    """``venv_python(kt=False)``: the interpreter of the installed upstream (or fork) venv."""
    from tests.real import engine_env

    def find(*, kt: bool = False) -> str:
        try:
            return engine_env.venv_python(kt=kt)
        except Exception as exc:  # not installed: say how, and fail
            pytest.fail(f"{exc}\nrun: python3 tests/real/install.py --kt", pytrace=False)

    return find


@pytest.fixture(scope="session")
def real_env() -> dict[str, str]:
    """The environment SGLang's modules import in: the stand-ins for the two native pieces."""
    from tests.real import engine_env

    env = dict(os.environ)
    env.update(engine_env.engine_env())
    return env


@pytest.fixture(autouse=True)
def no_leaked_processes() -> Iterator[None]:
    """Per test: nothing (the module's engine lives across its tests); see module_leak_check."""
    yield


@pytest.fixture(scope="module", autouse=True)
def module_leak_check() -> Iterator[None]:
    """Fails the module if any process it started is alive once its fixtures are torn down."""
    yield
    fail_on_leaks("module", 10.0)
