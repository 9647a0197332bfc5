"""Test-only stand-in, loaded through PYTHONPATH by the real SGLang engine.

PyPI's torchvision wheel is linked against CUDA torch, so its ``_C`` extension
does not load with the CPU torch used here; ``torchvision._meta_registrations``
then dies with ``operator torchvision::nms does not exist``.  This hook defines
the two schemas that module registers fake kernels for (``nms`` and ``qnms``)
right before it runs.  Nothing else is changed: if torchvision's own ops are
present the hook does nothing.
"""

import importlib.abc
import sys

_TARGET = "torchvision._meta_registrations"
_LIBS = []  # keep the Library objects alive: dropping one unregisters its ops


def _define_torchvision_schemas():
    import torch

    def has(name):
        try:
            getattr(torch.ops.torchvision, name)
            return True
        except (AttributeError, RuntimeError):
            return False

    missing = [n for n in ("nms", "qnms") if not has(n)]
    if not missing:
        return
    lib = torch.library.Library("torchvision", "DEF")
    for name in missing:
        lib.define(f"{name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIBS.append(lib)


class _TorchvisionSchemaHook(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == _TARGET:
            sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
            _define_torchvision_schemas()
        return None  # let the ordinary finders load the real module


sys.meta_path.insert(0, _TorchvisionSchemaHook())
