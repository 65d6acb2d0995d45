"""GEMM problems and their inputs, the launch-side problem key, the heuristic default config and the references."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from tunekit.core.space import Config, Problem
from tunekit.core.spec import DTYPE_NAMES, DTYPES, Inputs, Outputs, ProblemKey
from tunekit.kernels.common import (
    TORCH_ACTIVATIONS,
    cdiv,
    check_shape,
    element_bytes,
    next_pow2,
    normal_sampler,
    torch_activation,
)
from tunekit.kernels.gemm.host import layout_of, tensors_aligned16
from tunekit.search_spaces.gemm.gemm import SPACE, has_tma, is_aligned16

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint


def alloc_outputs(inputs: Inputs) -> Outputs:
    a, b = inputs[0], inputs[1]
    return (torch.empty((a.shape[0], b.shape[1]), device=a.device, dtype=a.dtype),)


def epilogue_reference(
    acc: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    activation: str,
    alpha: float,
    beta: float,
) -> torch.Tensor:
    """The epilogue in torch, in acc's dtype: act(alpha * acc + bias) + beta * residual."""
    y = acc * alpha
    if bias is not None:
        y = y + bias.to(acc.dtype)
    y = torch_activation(y, activation)
    if residual is not None:
        y = y + beta * residual.to(acc.dtype)
    return y


def reference(inputs: Inputs) -> Outputs:
    a, b, bias, residual, activation, alpha, beta = inputs
    acc = a.double() @ b.double()
    return (epilogue_reference(acc, bias, residual, activation, alpha, beta).to(a.dtype),)


def torch_gemm(inputs: Inputs) -> torch.Tensor:
    """The GEMM of the kernel's inputs in torch's own ops, in the input dtype: cuBLAS's mm or addmm (bias and alpha
    fused), then torch applying the epilogue cuBLASLt does not fuse. What tunekit.ops.matmul and linear run where
    dispatch serves torch (linear's replayed calls run F.linear: the same addmm or mm, alpha and beta being 1)."""
    a, b, bias, residual, activation, alpha, beta = inputs
    if bias is None:
        z = torch.mm(a, b) if alpha == 1.0 else torch.mm(a, b).mul_(alpha)
    else:  # alpha scales the product only: act(alpha * a @ b + bias)
        z = torch.addmm(bias, a, b, alpha=alpha)
    y = TORCH_ACTIVATIONS[activation](z)
    if residual is not None:
        y = y + residual if beta == 1.0 else y.add(residual, alpha=beta)
    return y


def torch_baseline(inputs: Inputs) -> Outputs:
    """What a user runs without tunekit: torch_gemm, the op's torch branch, on the kernel's inputs as they are."""
    return (torch_gemm(inputs),)


def torch_timing_inputs(inputs: Inputs) -> Inputs:
    """The bench inputs with alpha = beta = 1, as every linear call (and a patched model's) passes them: torch then
    runs one cuBLAS call where alpha = 0.75 costs it a second pass over the output, which the kernel's epilogue
    fuses for free. The key holds neither scalar, so torch is timed at its cheapest call of the problem."""
    return (*inputs[:5], 1.0, 1.0)


def _operand(rows: int, cols: int, layout: str, pad: int, randn) -> torch.Tensor:
    """A [rows, cols] tensor of the layout, its leading dim padded by `pad` elements (pad > 0: unaligned)."""
    if layout == "row":
        return randn(rows, cols + pad)[:, :cols]
    return randn(cols, rows + pad)[:, :rows].T


def make_inputs(problem: Problem, device: torch.device, seed: int) -> Inputs:
    m, n, k = int(problem["m"]), int(problem["n"]), int(problem["k"])
    dtype = DTYPES[str(problem["dtype"])]
    a_layout, b_layout = str(problem["a_layout"]), str(problem["b_layout"])
    normal = normal_sampler(device, seed)

    def randn(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (scale * normal(*shape)).to(dtype)

    # An unaligned problem whose sizes happen to be aligned gets unaligned leading strides, as in real use: one
    # element of padding leaves each leading stride 2 or 4 bytes past a multiple of 16 bytes.
    pad = 1 if not problem["aligned16"] and is_aligned16(m, n, k, str(problem["dtype"]), a_layout) else 0
    # B scaled by 1/sqrt(K) keeps A @ B ~ N(0, 1) for any K, so fixed tolerances hold at every size.
    a = _operand(m, k, a_layout, pad, randn)
    b = _operand(k, n, b_layout, pad, lambda *shape: randn(*shape, scale=1 / math.sqrt(max(k, 1))))
    bias = randn(n, scale=0.5) if problem["has_bias"] else None
    residual = randn(m, n) if problem["has_residual"] else None
    # alpha, beta != 1 so that a kernel ignoring either fails verification.
    return (a, b, bias, residual, str(problem["activation"]), 0.75, 0.5)


def make_problem(
    m: int,
    n: int,
    k: int,
    dtype: str,
    *,
    a_layout: str = "row",
    b_layout: str = "row",
    activation: str = "none",
    has_bias: bool = False,
    has_residual: bool = False,
) -> Problem:
    """The problem of contiguous operands of these sizes (alignment in bytes from the exact sizes and dtype)."""
    return {
        "m": m,
        "n": n,
        "k": k,
        "dtype": dtype,
        "a_layout": a_layout,
        "b_layout": b_layout,
        "activation": activation,
        "has_bias": has_bias,
        "has_residual": has_residual,
        "aligned16": is_aligned16(m, n, k, dtype, a_layout),
    }


def problem_from_shape(shape: tuple[int, ...], dtype: str) -> Problem:
    check_shape("gemm", shape, dtype, "a 3-D shape MxNxK (e.g. 4096x4096x4096)", (3,))
    m, n, k = shape
    return make_problem(m, n, k, dtype)


def key_of(inputs: Inputs) -> ProblemKey:
    """The problem key of a launch's inputs (the op's, after its copies): exact sizes, layouts, epilogue flags and
    aligned16 from the sizes, strides and pointers. C adds nothing to aligned16: the op allocates it row-major
    [M, N] (torch's allocators align it), and its leading dim N is among the sizes `is_aligned16` checks."""
    a, b, bias, residual, activation, _, _ = inputs
    m, k = a.shape
    n = b.shape[1]
    dtype = DTYPE_NAMES[a.dtype]
    a_layout = layout_of(a)
    aligned = is_aligned16(m, n, k, dtype, a_layout) and tensors_aligned16(a, b, bias, residual)
    return (m, n, k, dtype, a_layout, layout_of(b), activation, bias is not None, residual is not None, aligned)


def default_problems(device: DeviceFingerprint) -> list[Problem]:
    # The interpreter runs every program in Python: tiny problems, tuned in seconds.
    if device.is_interpreter:
        return [
            # K >= 128 so that splitk (K >= 2 * SPLIT_K * BLOCK_K, BLOCK_K >= 32) is explored too; 136 is no
            # multiple of 16.
            make_problem(32, 32, 128, "float32", activation="relu", has_bias=True),
            make_problem(17, 33, 136, "float16", b_layout="col", has_residual=True),
        ]
    return [
        make_problem(4096, 4096, 4096, "bfloat16", activation="gelu", has_bias=True),
        # Skinny M (decode / small-batch linear layers): weights [out, in] make B column-major.
        make_problem(128, 8192, 8192, "bfloat16", b_layout="col"),
        make_problem(16, 4096, 4096, "bfloat16", b_layout="col"),
        make_problem(3000, 3000, 3000, "bfloat16", activation="gelu", has_bias=True),
        make_problem(4097, 4096, 4096, "bfloat16"),
    ]


_SAFE = {
    "variant": "grouped",
    "BLOCK_M": 16,
    "BLOCK_N": 16,
    "BLOCK_K": 16,
    "GROUP_M": 1,
    "SPLIT_K": 1,
    "num_warps": 4,
    "num_stages": 3,
}


def heuristic(problem: Problem, device: DeviceFingerprint) -> Config:
    """A grouped (or, for few tiles and long K on a GPU, splitk; for unaligned sizes on Hopper past skinny M,
    staged) config sized to the problem, always valid.

    GPU shapes follow what measured best on an H200 among hand-picked configs (bf16): 128x256x64, 8 warps, 4
    stages for large M and N; 16..64 x 64 x 128, 5 stages for skinny M (memory-bound: deep K tiles, many tiles).
    """
    m, n, k = int(problem["m"]), int(problem["n"]), int(problem["k"])
    wide = problem["dtype"] != "float32"  # 2-byte elements: twice the K per byte of shared memory
    if device.is_interpreter:
        edge_m, edge_n, bk, stages = 32, 32, 32, 3
    elif m <= 64:
        edge_m, edge_n, bk, stages = 64, 64, 128 if wide else 64, 5
    else:
        edge_m, edge_n, bk, stages = 128, 256 if wide else 128, 64 if wide else 32, 4 if wide else 3
    # Tensor-core tiles are at least 64 wide unless the problem itself is smaller (the space's block_*_at_least_64).
    bm = max(min(edge_m, max(16, next_pow2(m))), min(64, next_pow2(m)))
    bn = max(min(edge_n, max(16, next_pow2(n))), min(64, next_pow2(n)))
    bk = min(bk, max(16, next_pow2(k)))
    grouped: dict = {
        "variant": "grouped",
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "GROUP_M": 1 if cdiv(m, bm) == 1 else 8,
        "SPLIT_K": 1,
        "num_warps": 8 if bm * bn >= 128 * 128 else 4,
        "num_stages": stages,
    }
    candidates = [grouped]
    unaligned = not is_aligned16(m, n, k, str(problem["dtype"]), str(problem["a_layout"]))
    if m > 64 and unaligned and has_tma(device):
        # Rows of unaligned length load element by element: bf16 2053^3 ran 5x faster on aligned copies (H200).
        candidates.insert(0, dict(grouped, variant="staged"))
    if device.sm_count > 0:  # few tiles and a long K: split K until the programs fill the SMs
        tiles = cdiv(m, bm) * cdiv(n, bn)
        split = 1
        while split < 8 and tiles * split * 2 <= device.sm_count and k >= 2 * (split * 2) * bk:
            split *= 2
        if split > 1:
            candidates.insert(0, dict(grouped, variant="splitk", SPLIT_K=split))
    for config in candidates:
        while config["num_stages"] > 3 and not SPACE.is_valid(config, problem, device):
            config["num_stages"] -= 1
        if SPACE.is_valid(config, problem, device):
            return config
    return next(iter(SPACE.valid_configs(problem, device)), dict(_SAFE))


def bytes_moved(problem: Problem) -> int:
    m, n, k = int(problem["m"]), int(problem["n"]), int(problem["k"])
    size = element_bytes(str(problem["dtype"]))
    return (m * k + k * n + m * n * (2 if problem["has_residual"] else 1) + n * bool(problem["has_bias"])) * size


def flops(problem: Problem) -> int:
    return 2 * int(problem["m"]) * int(problem["n"]) * int(problem["k"])
