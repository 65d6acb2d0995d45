"""Backward of the rotary position embedding (kernels/rope/rope.py): the gradients of q and k in one pass.

y = x * cos + R(x) * sin with R(x) = cat(-x2, x1) is linear in x, so with g the incoming gradient

    dx = g * cos + R^T(g * sin),    R^T(v) = cat(v2, -v1)

i.e. dx1 = g1 c1 + g2 s2 and dx2 = g2 c2 - g1 s1: the forward's jit kernel with BACKWARD set (sin's halves taken
as (-s2, -s1)); it needs neither q nor k. The same space, problem key and heuristic as the forward: the same
streams are read and written.

Inputs tuple: (grad_q, grad_k, cos, sin) in the forward's layout ([B, S, H, D] views, [Bc, S, D] cos and sin).
Outputs: (dq, dk) of grad_q's and grad_k's shapes and dtype.
"""

from __future__ import annotations

import torch

from tunekit.core.space import Config, Problem
from tunekit.core.spec import Inputs, Outputs
from tunekit.kernels.common import op_kernel_spec
from tunekit.kernels.rope import rope
from tunekit.kernels.rope.perf_model import MODEL
from tunekit.kernels.rope.rope import (
    TOLERANCES,
    alloc_outputs,
    bytes_moved,
    default_problems,
    flops,
    heuristic,
    key_of,
    launch_rope,
    make_rope_inputs,
    parse_shape,
    rotate_half,
)
from tunekit.search_spaces.rope.rope import SPACE

# Shared with the forward, and part of this module's spec (KernelSpec.of_module reads them by name).
__all__ = ["alloc_outputs", "bytes_moved", "default_problems", "flops", "heuristic", "key_of"]


def launch(config: Config, inputs: Inputs, outputs: Outputs) -> None:
    launch_rope(config, inputs, outputs, backward=True)


def rotate_half_adjoint(v: torch.Tensor) -> torch.Tensor:
    """R^T(v) = cat(v2, -v1): the adjoint of rotate_half."""
    half = v.shape[-1] // 2
    return torch.cat((v[..., half:], -v[..., :half]), dim=-1)


def reference(inputs: Inputs) -> Outputs:
    """The adjoint in float64, rounded once to the gradients' dtype."""
    gq, gk, cos, sin = inputs
    c, s = cos.double().unsqueeze(2), sin.double().unsqueeze(2)
    dq = gq.double() * c + rotate_half_adjoint(gq.double() * s)
    dk = gk.double() * c + rotate_half_adjoint(gk.double() * s)
    return (dq.to(gq.dtype), dk.to(gk.dtype))


_BASELINE_GRAPH: dict[int, tuple[Inputs, tuple[torch.Tensor, ...], tuple[torch.Tensor, torch.Tensor]]] = {}


def torch_baseline(inputs: Inputs) -> Outputs:
    """What a user runs today: torch's autograd through transformers' formula in the input dtype. The forward
    graph (on stand-in q and k: the gradients do not depend on them) is built once per inputs, so the baseline
    times the backward alone."""
    gq, gk, cos, sin = inputs
    cached = _BASELINE_GRAPH.get(id(inputs))
    if cached is None or cached[0] is not inputs:
        _BASELINE_GRAPH.clear()
        leaves = (gq.detach().clone().requires_grad_(), gk.detach().clone().requires_grad_())
        c, s = cos.unsqueeze(2), sin.unsqueeze(2)
        outputs = tuple(x * c + rotate_half(x) * s for x in leaves)
        cached = _BASELINE_GRAPH[id(inputs)] = (inputs, outputs, leaves)
    _, outputs, leaves = cached
    dq, dk = torch.autograd.grad(outputs, leaves, (gq, gk), retain_graph=True)
    return (dq, dk)


def make_inputs(problem: Problem, device: torch.device, seed: int) -> Inputs:
    return make_rope_inputs(problem, device, seed)


def problem_from_shape(shape: tuple[int, ...], dtype: str) -> Problem:
    return parse_shape("rope_backward", shape, dtype)


SPEC = op_kernel_spec(
    __name__,
    name="rope_backward",
    description="Backward of the rotary position embedding: d q and d k in one pass",
    space=SPACE,
    problem_fields=("rows", "q_heads", "k_heads", "head_dim", "dtype", "heads_inner"),
    tolerances=TOLERANCES,
    version=1,
    model=MODEL,
    shape_help=rope.SHAPE_USAGE,
)
