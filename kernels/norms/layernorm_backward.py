"""LayerNorm backward over the last dim of a 2-D tensor: dx, dweight, dbias from x, dy and the weight.

The statistics are recomputed from x (the forward saves nothing), in fp32 and mean-subtracted like the forward.
With x̂ = (x - mean) * rstd and g = dy * w:

    dx = rstd * (g - mean(g) - x̂ * mean(g * x̂)),    dweight = Σ_rows dy * x̂,    dbias = Σ_rows dy

Persistent grid: min(tiles, PROGRAMS_PER_SM × SMs) programs (SMs from the device fingerprint; the interpreter,
which has none, counts 2 so CPU tests run several programs). Program p takes row tiles p, p + programs, ...:
at any moment neighbouring programs read neighbouring rows (DRAM pages stay open, every row load is a coalesced
run of one row), the split is fixed by (M, config, SM count), and programs differ by at most one tile. Each keeps
its dweight/dbias sums in fp32 registers for its whole run and writes ONE partial row of a workspace
[programs, N] at the end; `_sum_partials` adds those rows in a fixed order. The workspace is a few rows per SM
(PROGRAMS_PER_SM is searched, 1-8, kept to counts whose programs are resident at once), not one per row block:
before this design, workspace traffic and its reduction cost more than the gradients (0.23 of copy bandwidth at
2048×16384). No atomics: the result is bitwise repeatable for a config on a device.

Two variants (see search_spaces/norms/layernorm_backward.py): `single` holds [ROWS, BLOCK_N] tiles of whole rows in
registers and reads x and dy once (up to 8192 columns: 32 warps at 8 elements a thread fit 64 registers); the
weight is re-read per tile (an L1 hit) rather than held, which keeps one register per element free for that.
`looped` walks one row in BLOCK_N chunks twice (one pass of per-lane Welford mean/M2 and co-moment of x and g,
then dx), adding into its workspace row in memory. Looped is for rows wider than 8192, outside the widths this
kernel is tuned for; it was kept rather than split into column blocks: a column split keeps dweight slices in
registers but needs every row's mean(g) and mean(g·x̂) first, i.e. a statistics pass reading x and dy again
(10 bytes moved per bf16 element instead of 6), and the looped re-read mostly hits L2 for one row.
Loads keep the DIV trick (a power of two dividing N and the row strides) for 16-byte vectors on odd widths.

The same kernels compute RMSNorm's backward (IS_RMS: no mean, no dbias); kernels/norms/rmsnorm_backward.py declares it.

The @triton.jit bodies are exempt from typing (mypy does not check kernels/); host code is typed.
"""

from __future__ import annotations

# First: it sets TRITON_INTERPRET when there is no GPU, and triton reads that when it is imported.
import tunekit.core.backend  # noqa: F401

# isort: split

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
import triton

from tunekit.core.device import fingerprint
from tunekit.core.space import Config, Problem
from tunekit.core.spec import DTYPE_NAMES, DTYPES, Inputs, Outputs, ProblemKey, Tolerance, row_bucket
from tunekit.kernels.common import (
    check_shape,
    element_bytes,
    normal_sampler,
    pow2_divisor,
    prev_pow2,
    problems_from_shapes,
    row_flops,
    warps_for,
)
from tunekit.kernels.norms.layernorm import ROWS_USAGE, norm_spec
from tunekit.kernels.norms.layernorm_backward_jit import _norm_bwd_looped, _norm_bwd_single
from tunekit.kernels.norms.rmsnorm import GPU_SHAPES
from tunekit.kernels.persistent import SUM_BLOCK_G, SUM_BLOCK_N, SUM_WARPS, TILING, _sum_partials, autograd_baseline
from tunekit.kernels.rows_perf_model import backward_model, norm_params
from tunekit.kernels.tolerances import ONE_ULP_UP_TO_4
from tunekit.search_spaces.norms.layernorm_backward import MAX_BLOCK_N, SPACE, persistent_programs
from tunekit.search_spaces.rows import MAX_CHUNKS, single_block_n

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint

DEFAULT_EPS = 1e-5


def launch_backward(
    config: Config,
    x: torch.Tensor,
    dy: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    dx: torch.Tensor,
    dw: torch.Tensor | None,
    db: torch.Tensor | None,
    is_rms: bool,
) -> None:
    """Write dx, and dw / db where given, for 2-D x, dy, dx with unit stride along N. No validation: hot path."""
    m, n = x.shape
    if n == 0:
        return
    if m == 0:  # a sum over no rows
        for t in (dw, db):
            if t is not None:
                t.zero_()
        return
    n_programs = persistent_programs(config, m, fingerprint(x.device.index).sm_count)
    want_dw, want_db = dw is not None, db is not None
    # fp32 workspaces of partial sums, one row per program (every element the sum kernel reads is written first);
    # an unwanted one is a placeholder pointer, never read. Separate allocations keep both 16-byte aligned.
    dw_part = torch.empty((n_programs, n), dtype=torch.float32, device=x.device) if want_dw else x
    db_part = torch.empty((n_programs, n), dtype=torch.float32, device=x.device) if want_db else x
    common = {
        "IS_RMS": is_rms,
        "HAS_WEIGHT": weight is not None,
        "WANT_DW": want_dw,
        "WANT_DB": want_db,
        "DIV": pow2_divisor(n, x.stride(0), dy.stride(0), dx.stride(0)),
        "BLOCK_N": int(config["BLOCK_N"]),
        "num_warps": int(config["num_warps"]),
        "num_stages": int(config["num_stages"]),
    }
    w = x if weight is None else weight  # an absent weight still needs a pointer; HAS_WEIGHT keeps it unread
    args = (x, dy, dx, w, dw_part, db_part, m, n, x.stride(0), dy.stride(0), dx.stride(0), float(eps))
    if config["variant"] == "single":
        _norm_bwd_single[(n_programs,)](*args, ROWS=int(config["ROWS"]), **common)
    else:
        _norm_bwd_looped[(n_programs,)](*args, **common)
    if want_dw or want_db:
        _sum_partials[(triton.cdiv(n, SUM_BLOCK_N),)](
            dw_part,
            db_part,
            x if dw is None else dw,
            x if db is None else db,
            n_programs,
            n,
            WANT_DW=want_dw,
            WANT_DB=want_db,
            DIV=pow2_divisor(n),
            BLOCK_G=SUM_BLOCK_G,
            BLOCK_N=SUM_BLOCK_N,
            num_warps=SUM_WARPS,
        )


def launch(config: Config, inputs: Inputs, outputs: Outputs) -> None:
    """inputs (x, dy, weight | None, want_dweight, want_dbias, eps); outputs (dx, [dweight], [dbias])."""
    x, dy, weight, want_dw, want_db, eps = inputs
    dx = outputs[0]
    dw = outputs[1] if want_dw else None
    db = outputs[1 + int(want_dw)] if want_db else None
    launch_backward(config, x, dy, weight, eps, dx, dw, db, is_rms=False)


def alloc_outputs(inputs: Inputs) -> Outputs:
    x, _, weight, want_dw, want_db, _ = inputs
    outputs = [torch.empty_like(x)]
    if want_dw:
        outputs.append(torch.empty_like(weight))
    if want_db:
        outputs.append(x.new_empty(x.shape[1]))
    return tuple(outputs)


def reference(inputs: Inputs) -> Outputs:
    """torch autograd on float64 copies, cast back to the outputs' dtypes."""
    x, dy, weight, want_dw, want_db, eps = inputs
    x64 = x.double().requires_grad_()
    w64 = weight.double().requires_grad_() if weight is not None else None
    b64 = torch.zeros(x.shape[1], dtype=torch.float64, device=x.device, requires_grad=True) if want_db else None
    y = F.layer_norm(x64, (x.shape[1],), w64, b64, eps)
    leaves = [x64] + ([w64] if want_dw else []) + ([b64] if want_db else [])
    grads = torch.autograd.grad(y, leaves, dy.double())
    dtypes = [x.dtype] + ([weight.dtype] if want_dw else []) + ([x.dtype] if want_db else [])
    return tuple(g.to(d) for g, d in zip(grads, dtypes))


def _torch_forward(inputs: Inputs) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x, _, weight, want_dw, want_db, eps = inputs
    xr = x.detach().requires_grad_()
    wr = weight.detach().requires_grad_(bool(want_dw)) if weight is not None else None
    br = torch.zeros_like(x[0]).requires_grad_() if want_db else None
    y = F.layer_norm(xr, (x.shape[1],), wr, br, eps)
    return y, [xr] + ([wr] if wr is not None and want_dw else []) + ([br] if br is not None else [])


def torch_baseline(inputs: Inputs) -> tuple[torch.Tensor, ...]:
    """What a user runs today: torch's LayerNorm backward (autograd) in the input dtype."""
    return autograd_baseline(inputs, _torch_forward)


def make_inputs(problem: Problem, device: torch.device, seed: int) -> Inputs:
    rows, cols, dtype = int(problem["rows"]), int(problem["cols"]), DTYPES[str(problem["dtype"])]
    randn = normal_sampler(device, seed)
    # An offset mean catches a kernel that forgets to subtract it; weights near 1.
    x = (randn(rows, cols) * 2.0 + 0.5).to(dtype)
    dy = randn(rows, cols).to(dtype)
    weight = (1.0 + 0.1 * randn(cols)).to(dtype) if problem["weight"] else None
    return (x, dy, weight, bool(problem["weight"]), bool(problem["bias"]), DEFAULT_EPS)


def problem_from_shape(shape: tuple[int, ...], dtype: str) -> Problem:
    check_shape("layernorm_backward", shape, dtype, ROWS_USAGE, (2,))
    m, n = shape
    return {"rows": row_bucket(m), "cols": n, "dtype": dtype, "weight": True, "bias": True}


def key_of(inputs: Inputs) -> ProblemKey:
    x, _, weight, _, want_db, _ = inputs
    m, n = x.shape
    return (row_bucket(m), n, DTYPE_NAMES[x.dtype], weight is not None, want_db)


INTERPRETER_SHAPES = ((16, 256), (8, 1000), (4, 2049))


default_problems = problems_from_shapes(problem_from_shape, INTERPRETER_SHAPES, GPU_SHAPES)


# Heuristic constants, from a sweep of this kernel on an H200 (bf16, LayerNorm and RMSNorm, N 1535-8192: ROWS 1-4 x
# PROGRAMS_PER_SM 1-8 x 2-32 warps; 2026-11-24, tests/gpu/norm_backward_bench.py sweeps around them). The fastest
# configs held 64 bytes of a tile per thread (32 bf16 values, plus the prefetched next tile) in tiles of at least
# 8 KiB, and ran 8 warps per SM: 2 programs of 4 warps, or 1 of 8. Rows wider than 8192 take the looped variant in
# 2048-wide chunks (4096 past 16 chunks). RMSNorm's backward uses it too; the tiling itself is TILING
# (kernels/persistent.py), which the pointwise backward shares.
LOOPED_PER_THREAD = 8
LOOPED_BLOCK_N = 2048
WIDE_LOOPED_BLOCK_N = 4096


def heuristic(problem: Problem, device: DeviceFingerprint) -> Config:
    rows, cols = int(problem["rows"]), int(problem["cols"])
    size = element_bytes(str(problem["dtype"]))
    width = single_block_n(cols)
    if width <= MAX_BLOCK_N:
        variant, block_n = "single", width
        tile_rows = TILING.tile_rows(width, size, prev_pow2(rows))
        warps = TILING.warps(tile_rows * block_n, size)
    else:
        variant, tile_rows = "looped", 1
        block_n = LOOPED_BLOCK_N if cols <= LOOPED_BLOCK_N * MAX_CHUNKS else WIDE_LOOPED_BLOCK_N
        warps = warps_for(block_n, LOOPED_PER_THREAD, 32)
    config: Config = {
        "variant": variant,
        "BLOCK_N": block_n,
        "ROWS": tile_rows,
        "PROGRAMS_PER_SM": 1,
        "num_warps": warps,
        "num_stages": 1,
    }
    per_sm = TILING.programs_per_sm(warps)
    while per_sm > 1 and not SPACE.is_valid({**config, "PROGRAMS_PER_SM": per_sm}, problem, device):
        per_sm //= 2  # fewer resident programs, or fewer than the rows have work for
    return {**config, "PROGRAMS_PER_SM": per_sm}


def bytes_moved(problem: Problem) -> int:
    """x and dy read, dx written, the weight read and dweight/dbias written; the workspace is not counted."""
    rows, cols = int(problem["rows"]), int(problem["cols"])
    vectors = 2 * int(bool(problem["weight"])) + int(bool(problem.get("bias", False)))
    return (3 * rows * cols + vectors * cols) * element_bytes(str(problem["dtype"]))


flops = row_flops(12)


# fp32: dweight sums `rows` products whose order differs from torch's; an error of ~1e-5 on sums of O(sqrt(rows))
# is expected. fp16/bf16: as the forward.
TOLERANCES = {"float32": Tolerance(atol=1e-3, rtol=1e-4), **ONE_ULP_UP_TO_4}

# What LayerNorm's and RMSNorm's backward declare alike: they run launch_backward (so share its version), with one
# space (RMSNorm has no space file of its own), heuristic and tolerance table; the model's partials are
# the weight vectors (dweight, and dbias for LayerNorm).
SHARED_DECLARATION = {
    "space": SPACE,
    "tolerances": TOLERANCES,
    "version": 3,
    "model": backward_model(partials=norm_params),
}

SPEC = norm_spec(
    __name__,
    name="layernorm_backward",
    description="LayerNorm backward over the last dim of a 2-D tensor: dx, dweight, dbias (stats recomputed)",
    **SHARED_DECLARATION,
)
