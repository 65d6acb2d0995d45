"""Input validation shared by the ops: clear one-line errors instead of wrong answers."""

from __future__ import annotations

import torch

from tunekit.core import backend
from tunekit.core.errors import InvalidInputError
from tunekit.core.spec import DTYPE_NAMES

_DEVICE_TYPE = backend.torch_device().type


def dtype_name(t: torch.Tensor, what: str) -> str:
    name = DTYPE_NAMES.get(t.dtype)
    if name is None:
        raise InvalidInputError(f"{what} dtype must be one of {sorted(DTYPE_NAMES.values())}, but got {t.dtype}")
    return name


def check_device(t: torch.Tensor, what: str) -> None:
    if t.device.type != _DEVICE_TYPE:
        where = "CUDA tensors" if _DEVICE_TYPE == "cuda" else "CPU tensors (Triton interpreter, no GPU found)"
        raise InvalidInputError(f"{what} must be on the kernel's device ({where}), but is on {t.device}")


def check_same_device(t: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    if t.device != ref.device:
        raise InvalidInputError(f"{what} must be on {ref.device} like the input, but is on {t.device}")


def grads_flow(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd must see this call: grad mode on and some input requires grad."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def use_custom_op(*tensors: torch.Tensor | None) -> bool:
    """Go through the torch custom op (its fake and autograd formulas) rather than the direct eager launch:
    under torch.compile, or when gradients flow."""
    return torch.compiler.is_compiling() or grads_flow(*tensors)
