"""RMSNorm backward over the last dim of a 2-D tensor: dx and dweight from x, dy and the weight.

With rstd = rsqrt(mean(x²) + eps), x̂ = x * rstd and g = dy * w:

    dx = rstd * (g - x̂ * mean(g * x̂)),    dweight = Σ_rows dy * x̂

It runs the LayerNorm backward kernels (kernels/norms/layernorm_backward.py) with IS_RMS set: rstd recomputed from x in
fp32, per-program fp32 partial dweight sums reduced by a second kernel in a fixed order (deterministic, no
atomics), and the same search space and heuristic (a persistent grid; see kernels/norms/layernorm_backward.py).
"""

from __future__ import annotations

# First: it sets TRITON_INTERPRET when there is no GPU, and triton reads that when it is imported.
import tunekit.core.backend  # noqa: F401

# isort: split

import torch

from tunekit.core.space import Config, Problem
from tunekit.core.spec import DTYPE_NAMES, Inputs, Outputs, ProblemKey, row_bucket
from tunekit.kernels.common import check_shape, problems_from_shapes, row_flops
from tunekit.kernels.norms import layernorm_backward as ln_backward
from tunekit.kernels.norms.layernorm import ROWS_USAGE, norm_spec
from tunekit.kernels.norms.layernorm_backward import (
    INTERPRETER_SHAPES,
    SHARED_DECLARATION,
    launch_backward,
)
from tunekit.kernels.norms.layernorm_backward import bytes_moved as bytes_moved  # the spec's, as heuristic below
from tunekit.kernels.norms.layernorm_backward import heuristic as heuristic
from tunekit.kernels.norms.rmsnorm import GPU_SHAPES
from tunekit.kernels.persistent import autograd_baseline

DEFAULT_EPS = 1e-6


def launch(config: Config, inputs: Inputs, outputs: Outputs) -> None:
    """inputs (x, dy, weight | None, want_dweight, eps); outputs (dx, [dweight])."""
    x, dy, weight, want_dw, eps = inputs
    launch_backward(config, x, dy, weight, eps, outputs[0], outputs[1] if want_dw else None, None, is_rms=True)


def alloc_outputs(inputs: Inputs) -> Outputs:
    x, _, weight, want_dw, _ = inputs
    return (torch.empty_like(x), torch.empty_like(weight)) if want_dw else (torch.empty_like(x),)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y * weight if weight is not None else y


def reference(inputs: Inputs) -> Outputs:
    """torch autograd on float64 copies, cast back to the outputs' dtypes."""
    x, dy, weight, want_dw, eps = inputs
    x64 = x.double().requires_grad_()
    w64 = weight.double().requires_grad_() if weight is not None else None
    leaves = [x64] + ([w64] if want_dw else [])
    grads = torch.autograd.grad(_rms_norm(x64, w64, eps), leaves, dy.double())
    dtypes = [x.dtype] + ([weight.dtype] if want_dw else [])
    return tuple(g.to(d) for g, d in zip(grads, dtypes))


def _torch_forward(inputs: Inputs) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x, _, weight, want_dw, eps = inputs
    xr = x.detach().requires_grad_()
    wr = weight.detach().requires_grad_(bool(want_dw)) if weight is not None else None
    y = torch.nn.functional.rms_norm(xr, (x.shape[1],), wr, eps)
    return y, [xr] + ([wr] if wr is not None and want_dw else [])


def torch_baseline(inputs: Inputs) -> tuple[torch.Tensor, ...]:
    """What a user runs today: the backward of torch.nn.functional.rms_norm (autograd) in the input dtype."""
    return autograd_baseline(inputs, _torch_forward)


def make_inputs(problem: Problem, device: torch.device, seed: int) -> Inputs:
    x, dy, weight, want_dw, _, _ = ln_backward.make_inputs({**problem, "bias": False}, device, seed)
    return (x, dy, weight, want_dw, DEFAULT_EPS)


def problem_from_shape(shape: tuple[int, ...], dtype: str) -> Problem:
    check_shape("rmsnorm_backward", shape, dtype, ROWS_USAGE, (2,))
    m, n = shape
    return {"rows": row_bucket(m), "cols": n, "dtype": dtype, "weight": True}


def key_of(inputs: Inputs) -> ProblemKey:
    x, _, weight, _, _ = inputs
    m, n = x.shape
    return (row_bucket(m), n, DTYPE_NAMES[x.dtype], weight is not None)


default_problems = problems_from_shapes(problem_from_shape, INTERPRETER_SHAPES, GPU_SHAPES)


flops = row_flops(9)


SPEC = norm_spec(
    __name__,
    name="rmsnorm_backward",
    description="RMSNorm backward over the last dim of a 2-D tensor: dx, dweight (rstd recomputed)",
    **SHARED_DECLARATION,  # LayerNorm backward's: its launch's version, space, tolerances; weight partials
)
