"""Host-side helpers every kernel and search space shares, each in one place: powers of two, ceil division, warps
per block, element sizes, alignment, shape parsing, random inputs and torch's activations (for references).

No Triton here: spaces and the quantization model import this without compiling anything.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from tunekit.core.errors import InvalidInputError, InvalidShapeError
from tunekit.core.space import Config, Problem
from tunekit.core.spec import DTYPES, KernelSpec

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

THREADS_PER_WARP = 32
FP32_BYTES = 4  # what the kernels accumulate in, and their workspaces hold
VECTOR_BYTES = 16  # the widest global load or store one thread issues; also TMA's alignment unit
# The largest alignment (in elements) the kernels' DIV / ALIGN hints claim: Triton itself only specialises integer
# arguments on divisibility by 16, and 16-byte vectors need no more than 8 elements of a 2-byte type.
MAX_ALIGN = 16
INT32_LIMIT = 2**31 - 1  # past this element offset, kernels compute offsets in int64


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def prev_pow2(n: int) -> int:
    """The largest power of two <= n (1 for n <= 1)."""
    return 1 << (max(n, 1).bit_length() - 1)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def warps_for(elements: int, per_thread: int, most: int) -> int:
    """Warps for a block of `elements`: one per 32 * per_thread elements, between 1 and `most`."""
    return min(most, max(1, elements // (THREADS_PER_WARP * per_thread)))


def threads(config: Config) -> int:
    """Threads of one program of the config."""
    return THREADS_PER_WARP * int(config["num_warps"])


def element_bytes(dtype: str) -> int:
    return DTYPES[dtype].itemsize


def vector_elements(dtype: str) -> int:
    """Elements per 16-byte vector."""
    return max(1, VECTOR_BYTES // element_bytes(dtype))


def pow2_divisor(*values: int) -> int:
    """The largest power of two, at most MAX_ALIGN, dividing every value (0 is divisible by anything): the
    alignment a kernel's DIV / ALIGN hint may claim for sizes and strides."""
    return math.gcd(*values, MAX_ALIGN)


def check_shape(
    kernel: str, shape: tuple[int, ...], dtype: str, usage: str, ranks: Collection[int] | None = None
) -> None:
    """Refuse a user-given shape (the CLI's --shape) of another rank (None: any but 0), a size below 1, or an
    unknown dtype. `usage` completes "{kernel} takes ...", e.g. "a 2-D shape MxN (e.g. 4096x1024)"."""
    if not (len(shape) >= 1 if ranks is None else len(shape) in ranks):
        raise InvalidShapeError(f"{kernel} takes {usage}, but got {len(shape)}-D {shape}")
    if min(shape) < 1:
        raise InvalidShapeError(f"{kernel} shape sizes must be >= 1, but got {'x'.join(map(str, shape))}")
    if dtype not in DTYPES:
        raise InvalidInputError(f"{kernel} dtype must be one of {sorted(DTYPES)}, but got {dtype!r}")


def problems_from_shapes(
    parse: Callable[[tuple[int, ...], str], Problem],
    interpreter_shapes: Sequence[tuple[int, ...]],
    gpu_shapes: Sequence[tuple[tuple[int, ...], str]],
) -> Callable[[DeviceFingerprint], list[Problem]]:
    """A kernel's `default_problems`: fp32 `interpreter_shapes` in the interpreter (it runs every program in
    Python: the set stays small enough to tune in seconds), `gpu_shapes` with their dtypes on a GPU."""

    def default_problems(device: DeviceFingerprint) -> list[Problem]:
        if device.is_interpreter:
            return [parse(shape, "float32") for shape in interpreter_shapes]
        return [parse(shape, dtype) for shape, dtype in gpu_shapes]

    return default_problems


def row_flops(per_element: int) -> Callable[[Problem], int]:
    """A row kernel's `flops(problem)`: `per_element` operations per element of its rows x cols input."""

    def flops(problem: Problem) -> int:
        return per_element * int(problem["rows"]) * int(problem["cols"])

    return flops


def normal_sampler(device: torch.device, seed: int) -> Callable[..., torch.Tensor]:
    """randn(*shape): fp32 standard normals on `device`, drawn in call order from one generator seeded with `seed`."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    return randn


# torch's own activations by the names the kernels' epilogues use (references apply them in float64, baselines in
# the input dtype).
TORCH_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda v: v,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda v: F.gelu(v, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}


def torch_activation(v: torch.Tensor, activation: str) -> torch.Tensor:
    fn = TORCH_ACTIVATIONS.get(activation)
    if fn is None:
        raise InvalidInputError(f"activation must be one of {list(TORCH_ACTIVATIONS)}, but got {activation!r}")
    return fn(v)


@contextlib.contextmanager
def quiet_masked_math() -> Iterator[None]:
    """In Triton's interpreter, numpy computes every lane, masked or not, and warns (RuntimeWarning: divide by zero
    in log, inf * 0) for lanes a kernel computes and then discards by design (cross entropy's ignored rows). Those
    warnings are tunekit's doing, not the user's: silenced around such a launch. On a GPU: nothing."""
    from tunekit.core import backend

    if not backend.INTERPRETED:
        yield
        return
    import numpy as np

    with np.errstate(divide="ignore", invalid="ignore"):
        yield


def op_kernel_spec(module: str, **declared: Any) -> KernelSpec:
    """The declaration of a kernel that a tunekit op serves (`KernelSpec.of_module`): its op runs torch's own
    implementation where dispatch serves torch (torch_fallback)."""
    return KernelSpec.of_module(module, torch_fallback=True, **declared)
