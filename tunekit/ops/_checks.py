"""Input validation shared by the ops: clear one-line errors instead of wrong answers."""

from __future__ import annotations

import builtins
from collections.abc import Sequence

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


INDEX_LIMIT = 2**31 - 1  # the kernels index with int32


def check_input(input: object, op: str) -> torch.Tensor:
    if not isinstance(input, torch.Tensor):
        raise InvalidInputError(f"{op}: input must be a tensor, but got {type(input).__name__}")
    if input.dtype not in DTYPE_NAMES:
        raise InvalidInputError(
            f"{op}: input dtype must be one of {sorted(DTYPE_NAMES.values())}, but got {input.dtype}"
        )
    check_device(input, f"{op} input")
    return input


def check_dtype_arg(dtype: object, op: str) -> None:
    if dtype is not None and dtype not in DTYPE_NAMES:
        raise InvalidInputError(f"{op}: dtype must be None or one of {sorted(DTYPE_NAMES.values())}, but got {dtype}")


def normalize_dim(dim: object, ndim: int, op: str) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise InvalidInputError(f"{op}: dim must be an int, but got {type(dim).__name__} {dim!r}")
    rank = builtins.max(ndim, 1)  # a 0-d tensor accepts dim 0 and -1, like torch
    if not -rank <= dim < rank:
        raise InvalidInputError(f"{op}: dim must be in [{-rank}, {rank - 1}] for a {ndim}-D input, but got {dim}")
    return dim % rank


def normalize_dims(dim: object, ndim: int, op: str) -> list[int]:
    """Sorted non-negative dims. None or () reduces every dim (as torch does); several dims must be adjacent."""
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return list(range(builtins.max(ndim, 1)))
    if isinstance(dim, (tuple, list)):
        dims = sorted(normalize_dim(d, ndim, op) for d in dim)
        if len(set(dims)) != len(dims):
            raise InvalidInputError(f"{op}: each dim may appear once, but got dim={tuple(dim)}")
        if dims != list(range(dims[0], dims[-1] + 1)):
            raise InvalidInputError(
                f"{op}: several dims must be adjacent (they are merged into one), but got dim={tuple(dim)}; "
                "reduce them one at a time instead"
            )
        return dims
    return [normalize_dim(dim, ndim, op)]


def check_sizes(shape: Sequence[int], op: str) -> None:
    for size in shape:
        if size >= INDEX_LIMIT:
            raise InvalidInputError(f"{op}: every dim must be < 2**31 - 1 (int32 indexing), but got {list(shape)}")


def read_dtype(input_dtype: torch.dtype, dtype: torch.dtype | None) -> torch.dtype:
    """The dtype a kernel reads after `cast`: the input's where there is no cast or it widens to fp32, else the
    cast's (what the ops' screens key on without casting)."""
    return input_dtype if dtype is None or dtype == torch.float32 else dtype


def cast(x: torch.Tensor, dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.dtype]:
    """torch's `dtype=` semantics: the input is cast to dtype first. Widening fp16/bf16 -> fp32 is exact, so the
    kernel reads the original and writes fp32 instead (no extra pass)."""
    read = read_dtype(x.dtype, dtype)
    return (x if read == x.dtype else x.to(read)), (x.dtype if dtype is None else dtype)
