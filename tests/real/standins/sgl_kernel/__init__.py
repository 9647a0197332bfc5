"""Test-only stand-in for ``sgl_kernel`` (no CPU build of it is on PyPI).

SGLang's modules import ``sgl_kernel`` unconditionally, while the non-AMX CPU
path never calls into it.  Every attribute of this package, and of any
``sgl_kernel.<sub>`` module, is a stub: importing names works, calling one
raises NotImplementedError naming what was called.
"""

import importlib.abc
import importlib.machinery
import sys


class _Stub:
    """A name from sgl_kernel: attributes are stubs too, calling raises."""

    def __init__(self, qualname):
        self._qualname = qualname

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Stub(f"{self._qualname}.{name}")

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self._qualname} (sgl_kernel stand-in for tests)")

    def __repr__(self):
        return f"<sgl_kernel stand-in {self._qualname}>"


def _module_getattr(modname):
    def __getattr__(name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Stub(f"{modname}.{name}")

    return __getattr__


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__path__ = []  # a package, so deeper submodules import too
        module.__getattr__ = _module_getattr(module.__name__)


class _StubFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, _StubLoader(), is_package=True)
        return None


if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
    sys.meta_path.append(_StubFinder())

__getattr__ = _module_getattr(__name__)
