"""What the suite measures tunekit against: the torch a user would write for each family, and how it is run."""

from __future__ import annotations

# First: it sets TRITON_INTERPRET when there is no GPU, and triton reads that when it is imported.
import tunekit.core.backend  # noqa: F401

# isort: split

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
import triton

from tunekit.core.errors import TunekitError
from tunekit.core.spec import Inputs

Runner = Callable[[], Any]


@dataclass(frozen=True)
class TorchProgram:
    """What a user writes in torch for one problem: `fn(*args)`, or with `grad` the backward of fn's output.

    `grad` is (dy, leaves): the forward runs once when the runner is built and only the backward is timed.
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    grad: tuple[torch.Tensor, tuple[torch.Tensor, ...]] | None = None


@dataclass(frozen=True)
class Baseline:
    """A named extra baseline: `build(inputs)` returns a runner, or a string saying why it does not apply."""

    name: str
    build: Callable[[Inputs], Runner | str]


@triton.jit
def empty_kernel() -> None:
    """Does nothing: timed like a launch-bound problem, it is the launch floor those are reported against."""
    pass


def eager_runner(program: TorchProgram) -> Runner:
    return _runner(program.fn, program)


def compiled_runner(program: TorchProgram, mode: str | None, backend: str = "inductor") -> Runner:
    """torch.compile of the eager program, specialised to this shape (dynamic=False), from a clean dynamo cache.

    The reset matters: a suite compiles the same function for dozens of shapes, and past dynamo's recompile limit
    it would quietly run eager.
    """
    torch._dynamo.reset()
    compiled = torch.compile(program.fn, mode=mode, dynamic=False, backend=backend)
    return _runner(compiled, program)


@dataclass(frozen=True)
class AutogradRunner:
    """The backward of a forward run once (`y`): torch.autograd.grad, the part a backward benchmark times.

    evaluation.report never captures one in a CUDA graph: autograd runs the backward ops from its device thread on the
    stream the forward ran on (here, before and outside the capture), which a capture only records by joining that
    stream. On the H200 the same program's capture failed for fp16 ("operation failed due to a previous error
    during capture") and went through for bf16; it is timed with CUDA events instead.
    """

    y: Any
    leaves: tuple[torch.Tensor, ...]
    dy: torch.Tensor

    def __call__(self) -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(self.y, self.leaves, self.dy, retain_graph=True)


def _runner(fn: Callable[..., Any], program: TorchProgram) -> Runner:
    if program.grad is None:
        return lambda: fn(*program.args)
    dy, leaves = program.grad
    return AutogradRunner(fn(*program.args), leaves, dy)


# ---------------------------------------------------------------------------------------------- norms


def _layer_norm(x: torch.Tensor, w: torch.Tensor | None, b: torch.Tensor | None, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def _rms_norm(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def layernorm_program(inputs: Inputs) -> TorchProgram:
    x, w, b, eps = inputs
    return TorchProgram(_layer_norm, (x, w, b, eps))


def rmsnorm_program(inputs: Inputs) -> TorchProgram:
    x, w, eps = inputs
    return TorchProgram(_rms_norm, (x, w, eps))


def layernorm_backward_program(inputs: Inputs) -> TorchProgram:
    """The backward of F.layer_norm through autograd: torch's saved mean/rstd path, timed without its forward."""
    x, dy, w, want_dw, want_db, eps = inputs
    xr = x.detach().requires_grad_()
    wr = w.detach().requires_grad_(bool(want_dw)) if w is not None else None
    br = torch.zeros(x.shape[-1], dtype=x.dtype, device=x.device, requires_grad=True) if want_db else None
    leaves = (xr,) + ((wr,) if wr is not None and want_dw else ()) + ((br,) if br is not None else ())
    return TorchProgram(_layer_norm, (xr, wr, br, eps), grad=(dy, leaves))


# ---------------------------------------------------------------------------------------------- gelu


def nine_op_gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """tanh-GELU the way it is written in model code: nine eager ops, each a kernel and a round trip to memory."""
    cube = x * x
    cube = cube * x
    inner = cube * 0.044715
    inner = x + inner
    inner = inner * math.sqrt(2.0 / math.pi)
    t = torch.tanh(inner)
    t = 1.0 + t
    half = 0.5 * x
    return half * t


def _gelu_chain(x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None) -> torch.Tensor:
    y = nine_op_gelu_tanh(x + bias if bias is not None else x)
    return y + residual if residual is not None else y


def _gelu_fused(x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None) -> torch.Tensor:
    y = F.gelu(x + bias if bias is not None else x, approximate="tanh")
    return y + residual if residual is not None else y


def unit_scale(inputs: Inputs) -> Inputs:
    """scale = 1: make_inputs uses 0.5 to catch a kernel ignoring it; model code has no scale op to pay for."""
    x, bias, residual, _, activation = inputs
    return (x, bias, residual, 1.0, activation)


def _gelu_args(inputs: Inputs) -> tuple[Any, ...]:
    x, bias, residual, _, activation = inputs
    if activation != "gelu_tanh":
        raise TunekitError(f"the gelu family's torch baselines compute gelu_tanh, not {activation!r}")
    return (x, bias, residual)


def gelu_program(inputs: Inputs) -> TorchProgram:
    return TorchProgram(_gelu_chain, _gelu_args(inputs))


def torch_fused_gelu(inputs: Inputs) -> Runner:
    args = _gelu_args(inputs)
    return lambda: _gelu_fused(*args)


# ---------------------------------------------------------------------------------------------- softmax, reduce


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, -1)


def _log_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x, -1)


def softmax_program(inputs: Inputs) -> TorchProgram:
    x, log = inputs
    return TorchProgram(_log_softmax if log else _softmax, (x,))


def _sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(1)


def _mean(x: torch.Tensor) -> torch.Tensor:
    return x.mean(1)


def _max(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = torch.max(x, 1)
    return values, indices


def reduction_program(inputs: Inputs) -> TorchProgram:
    x, op, _ = inputs  # dim 1 is the reduced one of [M, N] (inner) and of [B, M, N] (outer), as in the kernel
    return TorchProgram({"sum": _sum, "mean": _mean, "max": _max}[str(op)], (x,))


# ---------------------------------------------------------------------------------------------- gemm


def _activation(y: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "none":
        return y
    if activation == "relu":
        return torch.relu(y)
    if activation == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    if activation == "gelu":
        return F.gelu(y)
    if activation == "silu":
        return F.silu(y)
    raise TunekitError(f"no torch baseline for the GEMM activation {activation!r}")


def _gemm_eager(
    a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None, activation: str
) -> torch.Tensor:
    y = a @ b
    if bias is not None:
        y = y + bias
    y = _activation(y, activation)
    return y + residual if residual is not None else y


def unit_alpha_beta(inputs: Inputs) -> Inputs:
    """alpha = beta = 1: make_inputs uses 0.75 / 0.5 to catch a kernel ignoring them; model code has neither."""
    a, b, bias, residual, activation, _, _ = inputs
    return (a, b, bias, residual, activation, 1.0, 1.0)


def gemm_program(inputs: Inputs) -> TorchProgram:
    a, b, bias, residual, activation, _, _ = inputs
    return TorchProgram(_gemm_eager, (a, b, bias, residual, activation))


def cublaslt_runner(inputs: Inputs) -> Runner | str:
    """cuBLASLt's fused bias + ReLU / GELU(tanh) epilogue through torch._addmm_activation, where one exists."""
    a, b, bias, residual, activation, _, _ = inputs
    if bias is None or residual is not None or activation not in ("relu", "gelu_tanh"):
        return "cuBLASLt has no fused epilogue for this (only bias+relu and bias+gelu)"
    use_gelu = activation == "gelu_tanh"
    return lambda: torch._addmm_activation(bias, a, b, use_gelu=use_gelu)
