"""Kernel name -> module holding its SPEC. Adding a kernel is one line here."""

from __future__ import annotations

import importlib

# backend first: it selects the GPU or the interpreter before any kernel is decorated
from tunekit.core import backend, settings  # noqa: F401
from tunekit.core.errors import TunekitError, UnknownKernelError
from tunekit.core.spec import KernelSpec

KERNELS: dict[str, str] = {
    "layernorm": "tunekit.kernels.norms.layernorm",
    "layernorm_backward": "tunekit.kernels.norms.layernorm_backward",
    "rmsnorm": "tunekit.kernels.norms.rmsnorm",
    "rmsnorm_backward": "tunekit.kernels.norms.rmsnorm_backward",
    "pointwise": "tunekit.kernels.pointwise.pointwise",
    "pointwise_backward": "tunekit.kernels.pointwise.pointwise_backward",
    "reduction": "tunekit.kernels.reduction.reduction",
    "softmax": "tunekit.kernels.row_softmax.softmax",
    "cross_entropy": "tunekit.kernels.row_softmax.cross_entropy",
    "rope": "tunekit.kernels.rope.rope",
    "rope_backward": "tunekit.kernels.rope.rope_backward",
    "swiglu": "tunekit.kernels.glu.swiglu",
    "gemm": "tunekit.kernels.gemm",
}


def _register_extra() -> None:
    """TUNEKIT_EXTRA_KERNELS (tests, and kernels outside the package) joins the table once, at import."""
    for name, module in settings.extra_kernels().items():
        if KERNELS.get(name, module) != module:
            raise TunekitError(f"TUNEKIT_EXTRA_KERNELS: {name!r} is already {KERNELS[name]}; pick another name")
        KERNELS[name] = module


_register_extra()
_loaded: dict[str, KernelSpec] = {}


def kernel_names() -> list[str]:
    return sorted(KERNELS)


def get_spec(name: str) -> KernelSpec:
    spec = _loaded.get(name)
    if spec is not None:
        return spec
    module_name = KERNELS.get(name)
    if module_name is None:
        raise UnknownKernelError(f"unknown kernel {name!r}. Available: {kernel_names()}")
    spec = importlib.import_module(module_name).SPEC
    _loaded[name] = spec
    return spec
