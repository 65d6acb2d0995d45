"""tunekit.ops.swiglu: `torch.nn.functional.silu(gate) * up`, the gated MLP of Llama, Qwen and Mistral, fused.

The `swiglu` kernel reads gate and up once and writes the result once, with fp32 math and one rounding to the
inputs' dtype (fp16, bf16 or fp32). gate and up of one shape, dtype and device, any leading dims: both are viewed as
[M, N] rows (N the last dim; rows of any stride, so the gate and up halves of a fused projection are read in place;
a last dim that is not unit-stride is copied first). The result is a new contiguous tensor of gate's shape.

Everything else (mixed dtypes, float64 and other dtypes, broadcasting shapes, tensors off the kernel's device, empty
tensors, rows wider than the kernel's grid) runs torch's formula: the same results, the same errors.

Training runs torch's formula too: where gradients flow to gate or up, the call is torch's own silu and product, and
torch's autograd computes their gradients (there is no backward kernel in this family). Otherwise the op is a torch
custom op (`torch.ops.tunekit.swiglu`) for torch.compile, and eager calls skip the custom-op dispatch (the hot path).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tunekit.core import backend
from tunekit.core.errors import InvalidInputError
from tunekit.core.spec import DTYPE_NAMES, row_bucket
from tunekit.kernels.glu.swiglu import torch_swiglu
from tunekit.launch import watch as launch_watch
from tunekit.ops._checks import grads_flow
from tunekit.ops._launch import dispatch_launch
from tunekit.ops.declaration import OpDeclaration, Screen, declare, public_op
from tunekit.runtime.dispatch import dispatcher
from tunekit.search_spaces.glu.swiglu import MAX_COLS

_SWIGLU_KERNEL = dispatcher("swiglu")
_DEVICE_TYPE = backend.torch_device().type


def kernel_takes(gate: object, up: object) -> bool:
    """Whether the kernel computes what torch's formula does for these arguments (metadata only, no copies)."""
    if not isinstance(gate, Tensor) or not isinstance(up, Tensor):
        return False
    if gate.dtype not in DTYPE_NAMES or up.dtype != gate.dtype:
        return False
    if gate.device.type != _DEVICE_TYPE or up.device != gate.device:
        return False
    if gate.shape != up.shape or gate.numel() == 0:
        return False
    return (gate.shape[-1] if gate.dim() > 0 else 1) <= MAX_COLS


def _rows(t: Tensor) -> Tensor:
    """t as the kernel's [M, N] rows: a view where its leading dims merge, a copy where they do not (or where the
    last dim is not unit-stride)."""
    n = t.shape[-1] if t.dim() > 0 else 1
    rows = t.reshape(-1, n)
    return rows if rows.stride(1) == 1 or n == 1 else rows.contiguous()


def _checked(gate: Tensor, up: Tensor) -> None:
    if not kernel_takes(gate, up):
        raise InvalidInputError(
            "tunekit::swiglu takes only what its kernel takes; call tunekit.ops.swiglu, which runs torch's formula "
            "for the rest"
        )


def _swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """The kernel into a new contiguous tensor of gate's shape; torch's formula where dispatch serves torch."""
    _checked(gate, up)
    g, u = _rows(gate), _rows(up)
    y = torch.empty(g.shape, dtype=gate.dtype, device=gate.device)
    if not dispatch_launch(_SWIGLU_KERNEL, (g, u), (y,)):
        torch.mul(torch.nn.functional.silu(g), u, out=y)
    return y.view(gate.shape)


def _swiglu_fake(gate: Tensor, up: Tensor) -> Tensor:
    _checked(gate, up)
    return torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)


# No autograd: the front runs torch's formula wherever gradients flow.
_SWIGLU = declare(OpDeclaration("swiglu", _swiglu, _swiglu_fake))


def _torch_call(gate: Tensor, up: Tensor) -> Tensor:
    """torch's formula for the whole call. The hot path may replay such a call as torch's own op (a training call
    included: torch's autograd records it), as where dispatch serves torch."""
    launch_watch.note_torch_served()
    return torch_swiglu(gate, up)


def _swiglu_rows(gate: Tensor, *_: object, **__: object) -> tuple[int, int, str]:
    cols = gate.shape[-1]
    return row_bucket(gate.numel() // cols if cols else 0), cols, DTYPE_NAMES[gate.dtype]


@public_op(torch_swiglu, _SWIGLU_KERNEL, runs=_SWIGLU, screen=Screen(_swiglu_rows, ("rows", "cols", "dtype")))
def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up in one pass. Where gradients flow to gate or up: torch's formula and its autograd."""
    if not kernel_takes(gate, up) or grads_flow(gate, up):
        return _torch_call(gate, up)
    return _SWIGLU.run(gate, up)
