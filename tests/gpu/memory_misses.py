"""Why the row kernels miss their copy targets on the H200: each tuned config against the ceiling of its own tiling.

For problems covering every memory-suite miss of cache/bench/h200-sm90-132sm/memory.json, with aligned controls,
timed as the bench times them (tuning.bench.CudaEventTimer: do_bench medians, L2 flushed; inputs from the kernel's
make_inputs; tunekit's output checked against the reference before it is timed; every skeleton checked too):
  tunekit   the kernel with the config dispatch serves (the shipped database: the config the bench ran);
  skeleton  a row copy with that config's tiling and no arithmetic, y = x: the same program -> rows mapping,
            BLOCK_N, ROWS (rows per program), num_warps, num_stages, and for looped variants the same passes over
            each row (the last one writes, last chunk first). Reductions: the same [BLOCK_M, BLOCK_N] chunk walk,
            reading only (one sum per row written); LayerNorm backward: x and dy read, dx = x + dy written, on
            the kernel's persistent grid (PROGRAMS_PER_SM programs per SM, each striding over row tiles);
  +params   the skeleton plus the kernel's other traffic: weight / bias loads where the kernel loads them; for the
            backward also the fp32 partial dweight / dbias rows and the kernel's own _sum_partials launch;
  copy      torch's device-to-device copy of the same bytes (the bench's "copy" column);
  flat      a flat Triton copy of the same bytes in 16-byte-aligned blocks (best of two block sizes): the best a
            Triton kernel streams without rows; "flat read" reads the bytes only (reductions);
  aligned   widths that are no multiple of 8 again on the next multiple of 8 (4104 for 4097): the skeleton with
            its row length and stride known to be whole 16-byte vectors, and tunekit with the same config (the
            norms' DIV then proves 16-byte rows; softmax and reduction have no DIV).
The last table gives fractions of copy (the copy's time / the other's, as the report's tunekit/copy) and
tunekit/skeleton (the skeleton's time / tunekit's: what the arithmetic leaves of the tiling's ceiling).

  python3 tests/gpu/memory_misses.py           # GPU: < 4 min on an H200; JSON to $OUT/memory_misses.json
  python3 tests/gpu/memory_misses.py --smoke   # interpreter: 8-row problems with the bench's configs
  python3 tests/gpu/memory_misses.py --ptx     # CPU: LayerNorm's global loads/stores in PTX for sm_90
"""

from __future__ import annotations

import os
import sys

import tunekit.core.backend  # noqa: F401  (first: without a GPU it selects Triton's interpreter)

# --ptx compiles for sm_90 on the CPU: every @triton.jit (here and in the kernel modules) must make a compilable
# function, so the interpreter is switched off before any is decorated.
os.environ["TRITON_INTERPRET"] = "0" if "--ptx" in sys.argv else os.environ.get("TRITON_INTERPRET", "0")

# isort: split

import argparse
import collections
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl

from tunekit.core import backend
from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.core.space import Config, Problem
from tunekit.core.spec import KernelSpec
from tunekit.evaluation.checked_timing import check_then_time
from tunekit.evaluation.names import COPY, TUNEKIT
from tunekit.evaluation.reference_rates import copy_measurement
from tunekit.evaluation.report import kernel_runner
from tunekit.evaluation.results import BenchRun, read_run, timing_method
from tunekit.evaluation.suite import SEED, families
from tunekit.kernels.common import pow2_divisor
from tunekit.kernels.persistent import SUM_BLOCK_G, SUM_BLOCK_N, SUM_WARPS, _sum_partials
from tunekit.runtime.dispatch import dispatcher
from tunekit.search_spaces.norms.layernorm_backward import persistent_programs
from tunekit.search_spaces.rows import single_block_n
from tunekit.tuning.bench import Timer, default_timer
from tunekit.tuning.verify import KNOWN_KERNEL_FAILURES

BENCH = Path(__file__).resolve().parents[2] / "cache" / "bench" / "h200-sm90-132sm" / "memory.json"
FLAT_CONFIGS = ((1024, 4), (4096, 8))  # (int32 words per program, warps): 2 and 4 16-byte vectors per thread
SMOKE_ROWS = 8
PASSES = {"looped": 2, "online": 2}  # reads of each row by a looped forward (softmax `looped`: 3)


class Case(NamedTuple):  # no dataclass: the module also loads without an entry in sys.modules
    kernel: str
    rows: int
    cols: int
    dtype: str
    op: str = ""  # reductions: sum | max


# In order of what the closing note needs most (a run past --budget skips the rest).
CASES = (
    Case("layernorm", 8192, 4096, "float16"),  # control: 0.93 of copy
    Case("layernorm", 2048, 12288, "float16"),
    Case("layernorm", 2048, 16384, "float16"),
    Case("layernorm", 1024, 25600, "float16"),
    Case("layernorm", 4096, 4097, "float16"),
    Case("layernorm_backward", 8192, 4096, "float16"),  # single variant; exhaustive table: 0.57 at best
    Case("layernorm_backward", 2048, 16384, "float16"),
    Case("softmax", 8192, 4096, "float16"),  # control
    Case("softmax", 4096, 4097, "float16"),
    Case("softmax", 1024, 32768, "float16"),
    Case("softmax", 1024, 50257, "float16"),
    Case("reduction", 8192, 4096, "bfloat16", "sum"),
    Case("reduction", 8192, 4096, "bfloat16", "max"),
    Case("reduction", 4096, 4097, "bfloat16", "sum"),
    Case("reduction", 4096, 4097, "bfloat16", "max"),
    Case("reduction", 32768, 768, "bfloat16", "sum"),  # control for max 32768x768
    Case("reduction", 32768, 768, "bfloat16", "max"),
    Case("rmsnorm", 8192, 4096, "float16"),  # control
    Case("rmsnorm", 4096, 4097, "float16"),
)

# ---------------------------------------------------------------------------------------------- skeleton kernels
# Kept compact by hand (one line per group of arguments, each pointer's shape beside it): ruff would give every
# argument its own line. DIV > 1 is the norms' DIV (kernels/norms/layernorm.py): what the host found dividing N and the
# row strides; softmax and reduction have none, so their mirrors pass 1 (Triton's own multiple-of-16 knowledge).
# fmt: off


@triton.jit
def _whole(v, DIV: tl.constexpr):
    """v (a size or stride the host found DIV dividing) rounded down to a multiple of DIV: Triton learns that."""
    if DIV > 1:
        v = v // DIV * DIV
    return v


@triton.jit
def _copy_rows(
    X, Y,  # [M, N] input and output, unit stride along N
    P0, P1,  # [N] parameter vectors (read when NPARAMS >= 1 / == 2)
    M, N, stride_x, stride_y,
    NPARAMS: tl.constexpr, DIV: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):
    """The `single` variants' tiling: ROWS whole rows per program, one [ROWS, BLOCK_N] load and store."""
    N, stride_x, stride_y = _whole(N, DIV), _whole(stride_x, DIV), _whole(stride_y, DIV)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = (rows < M)[:, None] & col_mask[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    y = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0)
    if NPARAMS >= 1:  # once per program, as the kernels load weight and bias
        y += tl.load(P0 + cols, mask=col_mask, other=0.0)[None, :]
    if NPARAMS == 2:
        y += tl.load(P1 + cols, mask=col_mask, other=0.0)[None, :]
    tl.store(Y + rows64 * stride_y + cols[None, :], y, mask=mask)


@triton.jit
def _copy_row_chunks(
    X, Y,  # [M, N] input and output, unit stride along N
    P0, P1,  # [N] parameter vectors (read when NPARAMS >= 1 / == 2)
    S,  # [M] fp32: each row's sum over the read-only passes (keeps their loads live)
    N, stride_x, stride_y,
    NPARAMS: tl.constexpr, DIV: tl.constexpr, BLOCK_N: tl.constexpr, PASSES: tl.constexpr,
):
    """The looped variants' tiling: one row per program in BLOCK_N chunks, PASSES reads, the last one writing."""
    N, stride_x, stride_y = _whole(N, DIV), _whole(stride_x, DIV), _whole(stride_y, DIV)
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    y_row = Y + row * stride_y
    cols = tl.arange(0, BLOCK_N)
    n_chunks = tl.cdiv(N, BLOCK_N)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for _ in tl.static_range(PASSES - 1):
        for k in range(0, n_chunks):
            offs = k * BLOCK_N + cols
            acc += tl.load(x_row + offs, mask=offs < N, other=0.0).to(tl.float32)
    tl.store(S + row, tl.sum(acc, axis=0))
    for k in range(0, n_chunks):  # last chunk first, as the kernels' writing pass
        offs = (n_chunks - 1 - k) * BLOCK_N + cols
        mask = offs < N
        y = tl.load(x_row + offs, mask=mask, other=0.0)
        if NPARAMS >= 1:  # per chunk, as the kernels' writing pass loads weight and bias
            y += tl.load(P0 + offs, mask=mask, other=0.0)
        if NPARAMS == 2:
            y += tl.load(P1 + offs, mask=mask, other=0.0)
        tl.store(y_row + offs, y, mask=mask)


@triton.jit
def _copy_bwd_tiles(
    X, DY, DX,  # [M, N] input, upstream gradient, dx (written: x + dy, + w with EXTRAS), unit stride along N
    W,  # [N] weight (read when EXTRAS)
    DW_PART, DB_PART,  # [programs, N] fp32 partial sums of x and of dy (written when EXTRAS)
    M, N, stride_x, stride_dy, stride_dx,
    EXTRAS: tl.constexpr, DIV: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
):
    """The backward `single` tiling: [ROWS, BLOCK_N] tiles of whole rows, tile t to program t % programs."""
    N, stride_x = _whole(N, DIV), _whole(stride_x, DIV)
    stride_dy, stride_dx = _whole(stride_dy, DIV), _whole(stride_dx, DIV)
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    dw_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([ROWS, BLOCK_N], dtype=tl.float32)
    for tile in tl.range(pid, tl.cdiv(M, ROWS), tl.num_programs(0)):
        rows = tile * ROWS + tl.arange(0, ROWS)
        mask = (rows < M)[:, None] & col_mask[None, :]
        rows64 = rows.to(tl.int64)[:, None]
        x = tl.load(X + rows64 * stride_x + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(DY + rows64 * stride_dy + cols[None, :], mask=mask, other=0.0)
        g = dy
        if EXTRAS:  # per tile, as the kernel re-reads the weight
            g += tl.load(W + cols, mask=col_mask, other=0.0)[None, :]
        tl.store(DX + rows64 * stride_dx + cols[None, :], x + g, mask=mask)
        if EXTRAS:
            dw_acc += x.to(tl.float32)
            db_acc += dy.to(tl.float32)
    if EXTRAS:
        part = pid.to(tl.int64) * N + cols
        tl.store(DW_PART + part, tl.sum(dw_acc, axis=0), mask=col_mask)
        tl.store(DB_PART + part, tl.sum(db_acc, axis=0), mask=col_mask)


@triton.jit
def _copy_bwd_chunks(
    X, DY, DX,  # [M, N] input, upstream gradient, dx (written: x + dy, + w with EXTRAS), unit stride along N
    W,  # [N] weight (read when EXTRAS)
    DW_PART, DB_PART,  # [programs, N] fp32 partial sums of x and of dy (read-modify-written when EXTRAS)
    S,  # [M] fp32: each row's sum over the first pass (keeps its loads live)
    M, N, stride_x, stride_dy, stride_dx,
    EXTRAS: tl.constexpr, DIV: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """The backward `looped` tiling: row r to program r % programs, each row read twice in BLOCK_N chunks."""
    N, stride_x = _whole(N, DIV), _whole(stride_x, DIV)
    stride_dy, stride_dx = _whole(stride_dy, DIV), _whole(stride_dx, DIV)
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    n_chunks = tl.cdiv(N, BLOCK_N)
    dw_part = DW_PART + pid.to(tl.int64) * N
    db_part = DB_PART + pid.to(tl.int64) * N
    x_row = X + pid.to(tl.int64) * stride_x
    dy_row = DY + pid.to(tl.int64) * stride_dy
    dx_row = DX + pid.to(tl.int64) * stride_dx
    for row in tl.range(pid, M, n_programs):
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for k in tl.range(0, n_chunks):  # the statistics pass: x, dy (and w) read
            offs = k * BLOCK_N + cols
            mask = offs < N
            g = tl.load(dy_row + offs, mask=mask, other=0.0)
            if EXTRAS:
                g += tl.load(W + offs, mask=mask, other=0.0)
            acc += tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32) + g.to(tl.float32)
        tl.store(S + row, tl.sum(acc, axis=0))
        accumulate = row > pid  # the program's first row initialises its partial rows
        for k in tl.range(0, n_chunks):  # the writing pass, last chunk first
            offs = (n_chunks - 1 - k) * BLOCK_N + cols
            mask = offs < N
            x = tl.load(x_row + offs, mask=mask, other=0.0)
            dy = tl.load(dy_row + offs, mask=mask, other=0.0)
            g = dy + tl.load(W + offs, mask=mask, other=0.0) if EXTRAS else dy
            tl.store(dx_row + offs, x + g, mask=mask)
            if EXTRAS:
                dw = tl.load(dw_part + offs, mask=mask & accumulate, other=0.0)
                tl.store(dw_part + offs, dw + x.to(tl.float32), mask=mask)
                db = tl.load(db_part + offs, mask=mask & accumulate, other=0.0)
                tl.store(db_part + offs, db + dy.to(tl.float32), mask=mask)
        x_row += n_programs.to(tl.int64) * stride_x
        dy_row += n_programs.to(tl.int64) * stride_dy
        dx_row += n_programs.to(tl.int64) * stride_dx


@triton.jit
def _read_rows(
    X,  # [M, N] input, unit stride along N
    Y,  # [M] each row's sum
    M, N, stride_xm,
    DIV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """The inner reduction's tiling (kernels/reduction/reduction.py _reduce_inner's sum path), no max or index work."""
    N, stride_xm = _whole(N, DIV), _whole(stride_xm, DIV)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < M
    x_rows = X + rows.to(tl.int64)[:, None] * stride_xm
    cols = tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for start in tl.range(0, N, BLOCK_N):
        offs = start + cols
        mask = row_mask[:, None] & (offs < N)[None, :]
        acc += tl.load(x_rows + offs[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + rows, tl.sum(acc, axis=1).to(Y.dtype.element_ty), mask=row_mask)


@triton.jit
def _flat(
    X,  # [n] int32 words
    Y,  # [n] int32 words (copy), or [programs] one sum per program (READ_ONLY)
    n, READ_ONLY: tl.constexpr, BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask, other=0)
    if READ_ONLY:
        tl.store(Y + tl.program_id(0), tl.sum(x, axis=0))
    else:
        tl.store(Y + offs, x, mask=mask)


# fmt: on
# ---------------------------------------------------------------------------------------------- launching them

Runner = Callable[[], object]
Check = Callable[[], bool]


def _close(got: torch.Tensor, want: torch.Tensor, tol: float) -> bool:
    scale = max(1.0, float(want.float().abs().max()))
    return bool(torch.allclose(got.float(), want.float(), rtol=tol, atol=tol * scale))


def _options(config: Config) -> dict[str, int]:
    return {"num_warps": int(config["num_warps"]), "num_stages": int(config["num_stages"])}


def forward_skeleton(kernel: str, config: Config, inputs: Any, params: bool, div: int | None) -> tuple[Runner, Check]:
    """LayerNorm / RMSNorm / softmax: the config's tiling as a copy (div None: the kernel's own DIV)."""
    x = inputs[0]
    m, n = x.shape
    y = torch.empty_like(x)
    vectors = [v for v in {"layernorm": inputs[1:3], "rmsnorm": inputs[1:2]}.get(kernel, ()) if v is not None]
    vectors = vectors if params else []
    p0, p1 = [*vectors, x, x][:2]
    if div is None:
        div = 1 if kernel == "softmax" else pow2_divisor(n, x.stride(0), y.stride(0))  # softmax has no DIV
    variant, block_n = str(config["variant"]), int(config["BLOCK_N"])
    common = {"NPARAMS": len(vectors), "DIV": div, **_options(config)}
    if variant == "single":
        if kernel == "softmax":  # its launcher sizes the block to the row
            block_n = single_block_n(n)
        rows = int(config["ROWS"])
        grid = (triton.cdiv(m, rows),)

        def run() -> object:
            return _copy_rows[grid](x, y, p0, p1, m, n, x.stride(0), y.stride(0), BLOCK_N=block_n, ROWS=rows, **common)

    elif variant in ("looped", "online"):
        passes = 3 if kernel == "softmax" and variant == "looped" else PASSES[variant]
        sums = torch.empty(m, dtype=torch.float32, device=x.device)

        def run() -> object:
            return _copy_row_chunks[(m,)](
                x, y, p0, p1, sums, n, x.stride(0), y.stride(0), BLOCK_N=block_n, PASSES=passes, **common
            )

    else:
        raise ValueError(f"no skeleton for variant {variant!r} (known: single, looped, online)")
    want = x
    for v in vectors:
        want = want + v
    return run, lambda: _close(y, want, 1e-2)


def backward_skeleton(config: Config, inputs: Any, extras: bool, div: int | None) -> tuple[Runner, Check]:
    """LayerNorm backward: x and dy read, dx written; with extras the weight, the partial sums and their sum."""
    x, dy, weight = inputs[:3]
    m, n = x.shape
    dx = torch.empty_like(x)
    dw, db = torch.empty_like(weight), torch.empty_like(x[0])
    programs = persistent_programs(config, m, fingerprint(x.device.index).sm_count)  # as launch_backward sizes it
    sums = torch.empty(m, dtype=torch.float32, device=x.device)
    strides = (x.stride(0), dy.stride(0), dx.stride(0))
    common = {
        "EXTRAS": extras,
        "DIV": pow2_divisor(n, *strides) if div is None else div,
        "BLOCK_N": int(config["BLOCK_N"]),
        **_options(config),
    }
    single = config["variant"] == "single"

    def run() -> object:
        # The kernel allocates its workspaces per launch (from torch's caching allocator) too.
        parts = (
            [torch.empty((programs, n), dtype=torch.float32, device=x.device) for _ in range(2)] if extras else [x, x]
        )
        if single:
            _copy_bwd_tiles[(programs,)](x, dy, dx, weight, *parts, m, n, *strides, ROWS=int(config["ROWS"]), **common)
        else:
            _copy_bwd_chunks[(programs,)](x, dy, dx, weight, *parts, sums, m, n, *strides, **common)
        if extras:  # exactly the kernel's second launch
            _sum_partials[(triton.cdiv(n, SUM_BLOCK_N),)](
                *parts, dw, db, programs, n, WANT_DW=True, WANT_DB=True, DIV=pow2_divisor(n),
                BLOCK_G=SUM_BLOCK_G, BLOCK_N=SUM_BLOCK_N, num_warps=SUM_WARPS,
            )  # fmt: skip
        return dx

    def check() -> bool:
        ok = _close(dx, x + dy + weight if extras else x + dy, 1e-2)
        return ok and (not extras or (_close(dw, x.float().sum(0), 1e-2) and _close(db, dy.float().sum(0), 1e-2)))

    return run, check


def reduction_skeleton(config: Config, inputs: Any, div: int | None) -> tuple[Runner, Check]:
    x = inputs[0]
    m, n = x.shape
    if config["variant"] != "inner":
        raise ValueError(f"no skeleton for reduction variant {config['variant']!r} (known: inner)")
    y = torch.empty(m, dtype=x.dtype, device=x.device)
    block_m = int(config["BLOCK_M"])
    grid = (triton.cdiv(m, block_m),)
    common = {"DIV": 1 if div is None else div, "BLOCK_N": int(config["BLOCK_N"]), **_options(config)}

    def run() -> object:
        return _read_rows[grid](x, y, m, n, x.stride(0), BLOCK_M=block_m, **common)

    return run, lambda: _close(y, x.float().sum(1), 2e-2)


def skeleton(kernel: str, config: Config, inputs: Any, extras: bool, div: int | None = None) -> tuple[Runner, Check]:
    if kernel == "layernorm_backward":
        return backward_skeleton(config, inputs, extras, div)
    if kernel == "reduction":
        if extras:
            raise ValueError("a reduction reads no parameters")
        return reduction_skeleton(config, inputs, div)
    return forward_skeleton(kernel, config, inputs, extras, div)


def flat_runner(nbytes: int, read_only: bool, block: int, warps: int) -> Runner:
    """A flat Triton copy (or read) of `nbytes` as int32 words, rounded up to whole 16-word (64-byte) groups."""
    words = -(-max(nbytes // 4, 1) // 16) * 16
    device = backend.torch_device()
    src = torch.randint(0, 256, (words,), dtype=torch.int32, device=device)  # sums of a block fit in int32
    dst = torch.empty(triton.cdiv(words, block) if read_only else words, dtype=torch.int32, device=device)
    grid = (triton.cdiv(words, block),)
    return lambda: _flat[grid](src, dst, words, READ_ONLY=read_only, BLOCK=block, num_warps=warps)


# ---------------------------------------------------------------------------------------------- one problem


def describe(config: Config) -> str:
    sizes = " ".join(f"{k}={v}" for k, v in config.items() if k not in ("variant", "num_warps", "num_stages"))
    return f"{config['variant']} {sizes} w{config['num_warps']} s{config['num_stages']}"


def case_problem(case: Case) -> Problem:
    problem = dict(get_spec(case.kernel).problem_from_shape((case.rows, case.cols), case.dtype))
    if case.op:
        problem["op"] = case.op
    return problem


def bench_config(bench: BenchRun, family: str, label: str) -> tuple[Config | None, float | None]:
    """The config the H200 bench ran for this row, and its tunekit/copy."""
    for row in bench.rows:
        if row.family == family and row.label == label:
            m = row.get(TUNEKIT)
            return (None if m is None else m.config), row.speedup(TUNEKIT, COPY)
    return None, None


class Measurer:
    def __init__(self, timer: Timer) -> None:
        self.timer = timer

    def skeleton_ms(self, build: Callable[[], tuple[Runner, Check]]) -> tuple[float | None, str]:
        try:
            run, check = build()
            run()
            if not check():
                return None, "WRONG"
            return self.timer(run, {}), ""
        except (ValueError, *KNOWN_KERNEL_FAILURES) as exc:
            return None, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}"

    def tunekit_ms(self, spec: KernelSpec, config: Config, problem: Problem) -> tuple[float | None, str]:
        inputs = spec.make_inputs(problem, backend.torch_device(), SEED)
        expected = spec.reference(inputs)
        method = timing_method(spec.bytes_moved(problem), backend.INTERPRETED)
        build = lambda: kernel_runner(spec, config, inputs)  # noqa: E731
        m = check_then_time(TUNEKIT, build, spec, expected, method, self.timer, baseline=False)
        return m.ms, "" if m.status == "ok" else f"{m.status}: {m.note}"

    def best_flat(self, nbytes: int, read_only: bool) -> tuple[float | None, str]:
        """The faster of FLAT_CONFIGS, and why one failed (if one did)."""
        timed = [self.skeleton_ms(lambda b=b, w=w: (flat_runner(nbytes, read_only, b, w), lambda: True))
                 for b, w in FLAT_CONFIGS]  # fmt: skip
        ms = [t for t, _ in timed if t is not None]
        return min(ms, default=None), "; ".join(note for _, note in timed if note)


def measure(case: Case, bench: BenchRun, measurer: Measurer, smoke: bool) -> dict[str, Any]:
    spec = get_spec(case.kernel)
    family = families()[case.kernel]
    full = case_problem(case)
    served, bench_frac = bench_config(bench, case.kernel, family.label(full))
    problem = dict(full, rows=SMOKE_ROWS) if smoke else full
    label = family.label(problem)
    if served is None and smoke:
        raise ValueError(f"{family.label(full)} is not a row of {BENCH}")
    # The interpreter's dispatch serves interpreter configs: a smoke run takes the H200 bench's for this shape, unless
    # the bench predates the kernel's parameters (layernorm_backward's ROWS_PER_PROGRAM, now PROGRAMS_PER_SM).
    if smoke and served is not None and set(served) == set(spec.space.names):
        config, served_by = served, "bench"
    else:
        key = spec.problem_key(problem)
        config = dict(dispatcher(spec.name).config(key))
        served_by = dispatcher(spec.name).served_by.get(key, "?")
    result: dict[str, Any] = {"kernel": case.kernel, "label": label, "rows": problem["rows"], "cols": case.cols}
    result["config"] = config
    result.update(served_by=served_by, bench_tunekit_of_copy=bench_frac)
    notes: list[str] = []
    if served is not None and served != config:
        notes.append(f"the bench ran {describe(served)}")
    ms: dict[str, float | None] = {}
    ms[TUNEKIT], note = measurer.tunekit_ms(spec, config, problem)
    notes += [f"tunekit {note}"] if note else []
    inputs = spec.make_inputs(problem, backend.torch_device(), SEED)
    forms = {"skeleton": False} if case.kernel in ("softmax", "reduction") else {"skeleton": False, "+params": True}
    for name, extras in forms.items():
        ms[name], note = measurer.skeleton_ms(lambda e=extras: skeleton(case.kernel, config, inputs, e))
        notes += [f"{name} {note}"] if note else []
    nbytes = spec.bytes_moved(problem)
    ms[COPY] = copy_measurement(nbytes, timing_method(nbytes, backend.INTERPRETED), measurer.timer).ms
    flats = {"flat": (nbytes // 2, False)}  # a copy of half the bytes moves them all, as the bench's copy
    if case.kernel == "reduction":
        flats["flat read"] = (nbytes, True)
    for name, (size, read_only) in flats.items():
        ms[name], note = measurer.best_flat(size, read_only)
        notes += [f"{name} {note}"] if note else []
    if case.cols % 8:
        padded = dict(problem, cols=-(-case.cols // 8) * 8)
        wide = spec.make_inputs(padded, backend.torch_device(), SEED)
        div = pow2_divisor(padded["cols"])
        ms["skeleton aligned"], note = measurer.skeleton_ms(lambda: skeleton(case.kernel, config, wide, False, div))
        notes += [f"skeleton aligned {note}"] if note else []
        ms["tunekit aligned"], note = measurer.tunekit_ms(spec, config, padded)
        notes += [f"tunekit aligned {note}"] if note else []
        result["aligned_cols"] = padded["cols"]
    result["ms"] = ms
    result["notes"] = notes
    return result


# ---------------------------------------------------------------------------------------------- the table


def frac(result: dict[str, Any], impl: str) -> float | None:
    """The copy's time / impl's (per byte: the aligned rows move cols_aligned / cols times the bytes)."""
    copy, ms = result["ms"].get(COPY), result["ms"].get(impl)
    if copy is None or ms is None or ms <= 0:
        return None
    scale = result["aligned_cols"] / result["cols"] if "aligned" in impl else 1.0
    return copy * scale / ms


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(results: list[dict[str, Any]]) -> list[str]:
    head = ["problem", "config", "tunekit ms", "skeleton ms", "+params ms", "copy ms", "flat ms"]
    head += ["tunekit/copy", "skeleton/copy", "+params/copy", "flat/copy", "flat read/copy", "tunekit/skeleton"]
    head += ["aligned skeleton/copy", "aligned tunekit/copy", "bench tunekit/copy"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in results:
        ms = r["ms"]
        tk, sk = ms.get(TUNEKIT), ms.get("skeleton")
        cells = [f"{r['kernel']} {r['label']}", describe(r["config"])]
        cells += [_cell(ms.get(k), 4) for k in (TUNEKIT, "skeleton", "+params", COPY, "flat")]
        cells += [_cell(frac(r, k)) for k in (TUNEKIT, "skeleton", "+params", "flat", "flat read")]
        cells += [_cell(None if tk is None or sk is None else sk / tk)]
        cells += [_cell(frac(r, k)) for k in ("skeleton aligned", "tunekit aligned")]
        cells += [_cell(r["bench_tunekit_of_copy"])]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


# ---------------------------------------------------------------------------------------------- PTX


def ptx_ops(fn: Any, args: dict[str, Any], constexprs: dict[str, Any], num_warps: int, num_stages: int) -> str:
    """Compile fn for sm_90 without a GPU and count its global loads and stores by width (static PTX counts).

    args: a pointer's type string ("*fp16": 16-byte aligned, as torch allocates) or an int / float value; ints
    divisible by 16 get Triton's divisibility specialisation, as a launch with that value would.
    """
    from triton.backends.compiler import GPUTarget

    signature: dict[str, str] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for i, name in enumerate(fn.arg_names):
        value = constexprs.get(name, args.get(name))
        if name in constexprs:
            signature[name] = "constexpr"
        elif isinstance(value, str):
            signature[name] = value
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    source = triton.compiler.ASTSource(fn, signature, constexprs, attrs)
    options = {"num_warps": num_warps, "num_stages": num_stages}
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    ops = collections.Counter(re.findall(r"\b((?:ld|st)\.global(?:\.[a-z0-9]+)*)", ptx))
    return " ".join(f"{op}×{n}" for op, n in sorted(ops.items()))


def ptx_report(bench: BenchRun) -> None:
    """LayerNorm's tuned configs (8192x4096: single, 4096x4097: looped), kernel and skeleton, on 4096, 4097, 4104."""
    from tunekit.kernels.norms import layernorm as ln

    print("| config (tuned for) | width (DIV) | function | global loads and stores in the PTX (static counts) |")
    print("| --- | --- | --- | --- |")
    for tuned_for in ("8192x4096 fp16", "4096x4097 fp16"):
        config, _ = bench_config(bench, "layernorm", tuned_for)
        if config is None:
            raise ValueError(f"layernorm {tuned_for} is not a row of {BENCH}")
        warps, stages = int(config["num_warps"]), int(config["num_stages"])
        for n in (4096, 4097, 4104):
            div = pow2_divisor(n)
            rows = {"M": 4096, "N": n, "stride_x": n, "stride_y": n}
            ptrs = {"X": "*fp16", "Y": "*fp16", "W": "*fp16", "B": "*fp16", "P0": "*fp16", "P1": "*fp16", "S": "*fp32"}
            args = {**ptrs, **rows, "eps": 1e-5}
            norm = {"HAS_WEIGHT": True, "HAS_BIAS": True, "DIV": div}
            if config["variant"] == "single":
                block = {"BLOCK_N": max(int(config["BLOCK_N"]), single_block_n(n)), "ROWS": int(config["ROWS"])}
                pairs = (
                    (ln._layernorm_fwd_single, {**norm, **block}),
                    (_copy_rows, {"NPARAMS": 2, "DIV": div, **block}),
                )
            else:
                block = {"BLOCK_N": int(config["BLOCK_N"])}
                skel = {"NPARAMS": 2, "DIV": div, "PASSES": 2, **block}
                pairs = ((ln._layernorm_fwd_looped, {**norm, **block}), (_copy_row_chunks, skel))
            for fn, constexprs in pairs:
                ops = ptx_ops(fn, args, constexprs, warps, stages)
                print(f"| {describe(config)} ({tuned_for}) | {n} ({div}) | {fn.__name__} | {ops} |", flush=True)


# ---------------------------------------------------------------------------------------------- main


def device_name() -> str:
    return "interpreter (CPU)" if backend.INTERPRETED else torch.cuda.get_device_name()


def write_json(results: list[dict[str, Any]], timer: Timer) -> None:
    out = os.environ.get("OUT")
    if not out:
        return
    doc = {
        "experiment": "tests/gpu/memory_misses.py",
        "device": device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "timer": timer.label,
        "interpreted": backend.INTERPRETED,
        "results": results,
    }
    Path(out, "memory_misses.json").write_text(json.dumps(doc, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="interpreter: 8-row problems, the bench's configs")
    parser.add_argument("--ptx", action="store_true", help="CPU only: LayerNorm's loads and stores in sm_90 PTX")
    parser.add_argument("--budget", type=float, default=200.0, help="seconds after which remaining cases are skipped")
    args = parser.parse_args()
    bench = read_run(BENCH)
    if args.ptx:
        ptx_report(bench)
        return
    timer = default_timer()
    measurer = Measurer(timer)
    print(f"{device_name()}, torch {torch.__version__}, triton {triton.__version__}, timer {timer.label}", flush=True)
    start = time.perf_counter()
    results: list[dict[str, Any]] = []
    for case in CASES:
        elapsed = time.perf_counter() - start
        if not args.smoke and elapsed > args.budget:
            print(f"[{elapsed:5.0f} s] budget spent: skipping {case}", flush=True)
            continue
        result = measure(case, bench, measurer, args.smoke)
        results.append(result)
        write_json(results, timer)
        shown = " ".join(f"{k} {_cell(v, 4)}" for k, v in result["ms"].items())
        print(f"[{time.perf_counter() - start:5.0f} s] {case.kernel} {result['label']} ({describe(result['config'])}, "
              f"{result['served_by']}): {shown} ms {'; '.join(result['notes'])}", flush=True)  # fmt: skip
    print(f"timer: {timer.label}; fractions: the copy's time / the other's; tunekit/skeleton: skeleton's / tunekit's")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
