"""Host cost per eager call: every op in `tunekit.ops` next to torch's equivalent, torch's call inside one Python
function (the floor of any wrapper written in Python), the bare launch of the op's own compiled kernels, an empty
Triton launch, and the GPU time of the same problem (a host time above the GPU time is a host-bound problem).

Times are per call in a loop of `calls` calls after warm-up, synchronized once at the end: what a model's Python
loop pays when the GPU keeps up. tunekit's call, torch's and the wrapped one are timed in turn for `rounds` rounds;
each column is its median, the ratio the median of the rounds' ratios. The GPU time is the median of CUDA-graph
replays (`do_bench_cudagraph`). Needs a CUDA GPU. Run as `tunekit bench-host`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

# First: it sets TRITON_INTERPRET when there is no GPU, and triton reads that when it is imported.
import tunekit.core.backend  # noqa: F401

# isort: split

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tunekit.core.errors import TunekitError
from tunekit.core.triton_adapter import compiled_launch


@dataclass
class HostRow:
    op: str
    problem: str
    served: str  # the dispatch layer that served it
    tunekit_us: float  # per call, host loop
    torch_us: float
    wrapped_us: float  # torch's call inside one Python function
    bare_launch_us: float | None  # the op's compiled kernels fired with ready arguments (None: torch serves)
    gpu_us: float  # the GPU time of the tunekit call (median of CUDA-graph replays: no host cost in it)

    ratio: float  # torch's time over tunekit's, median of the rounds: above 1.0 tunekit's call is cheaper
    wrapped_ratio: float  # torch's over the wrapped call's: what any Python wrapper reaches at best


Case = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any], Callable[[], Any]]


def _cases(rows: int, width: int, dtype: torch.dtype) -> dict[str, Case]:
    """name -> (tunekit op, its args, its kwargs, torch's call) on one decode-sized problem."""
    import tunekit.ops as ops

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=dtype)

    x, w, b, r = rand(rows, width), rand(width), rand(width), rand(rows, width)
    lw = rand(width, width) / width**0.5
    return {
        "layer_norm": (ops.layer_norm, (x, (width,), w, b), {}, lambda: F.layer_norm(x, (width,), w, b)),
        "rms_norm": (ops.rms_norm, (x, (width,), w, 1e-6), {}, lambda: F.rms_norm(x, (width,), w, 1e-6)),
        "softmax": (ops.softmax, (x, -1), {}, lambda: torch.softmax(x, -1)),
        "log_softmax": (ops.log_softmax, (x, -1), {}, lambda: torch.log_softmax(x, -1)),
        "sum": (ops.sum, (x, -1), {}, lambda: torch.sum(x, -1)),
        "mean": (ops.mean, (x, -1), {}, lambda: torch.mean(x, -1)),
        "max": (ops.max, (x, -1), {}, lambda: torch.max(x, -1)),
        "gelu": (ops.gelu, (x,), {}, lambda: F.gelu(x)),
        "bias_act": (ops.bias_act, (x, b, "silu"), {}, lambda: F.silu(x + b)),
        "bias_act_residual": (ops.bias_act_residual, (x, b, r, "gelu"), {}, lambda: F.gelu(x + b) + r),
        "linear": (ops.linear, (x, lw), {}, lambda: F.linear(x, lw)),
        "linear+bias+silu": (ops.linear, (x, lw, b, "silu"), {}, lambda: F.silu(F.linear(x, lw, b))),
        "matmul": (ops.matmul, (x, lw.T), {}, lambda: torch.mm(x, lw.T)),
    }


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    for _ in range(max(calls // 20, 20)):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def _bare_launch(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], calls: int) -> float | None:
    """The call's replay plan's launches with every argument already resolved: the floor of any eager call."""
    from tunekit.launch.plan import Replay, call_signature

    plan = op.plans.get(call_signature(args, kwargs))
    if not isinstance(plan, Replay):
        return None
    return per_call_us(plan.prepared(args, kwargs), calls)


@triton.jit
def _empty(x_ptr, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    pass


def _empty_launch_us(calls: int) -> tuple[float, float]:
    """(an empty kernel through Triton's JIT path, the same kernel through its compiled launcher)."""
    x = torch.empty(16, device="cuda")
    compiled = _empty[(1,)](x, BLOCK=16)
    stream = torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())
    launch, values = compiled_launch(compiled, (1, 1, 1), direct=False), [x, 16]
    jit = per_call_us(lambda: _empty[(1,)](x, BLOCK=16), calls)
    bare = per_call_us(lambda: launch(values, stream), calls)
    return jit, bare


def _wrapped(fn: Callable[[], Any]) -> Callable[[], Any]:
    def call() -> Any:
        return fn()

    return call


def _row(name: str, case: Case, rows: int, width: int, dtype: torch.dtype, calls: int, rounds: int) -> HostRow:
    from triton.testing import do_bench_cudagraph

    from tunekit.runtime.dispatch import _DISPATCHERS

    op, args, kwargs, ref = case
    before = {k: len(d.served_by) for k, d in _DISPATCHERS.items()}
    stats = getattr(op, "stats", None)  # a HotPath's counters
    direct_before = stats.torch_direct if stats is not None else 0

    def call() -> Any:
        return op(*args, **kwargs)

    wrapped = _wrapped(ref)
    times: list[tuple[float, float, float]] = []
    for _ in range(rounds):
        times.append((per_call_us(call, calls), per_call_us(ref, calls), per_call_us(wrapped, calls)))
    tk_us, torch_us, wrapped_us = (statistics.median(column) for column in zip(*times))
    ratio = statistics.median(t / k for k, t, _ in times)
    wrapped_ratio = statistics.median(t / w for _, t, w in times)
    served = {layer for n, d in _DISPATCHERS.items() for layer in list(d.served_by.values())[before.get(n, 0) :]}
    if stats is not None and stats.torch_direct > direct_before:  # no entry serves a kernel for this problem's size
        served.add("torch-direct")
    bare = _bare_launch(op, args, kwargs, calls)
    gpu = do_bench_cudagraph(call, return_mode="median") * 1e3  # replayed as a graph: the GPU's time alone
    problem = f"{rows}x{width} {str(dtype).removeprefix('torch.')}"
    return HostRow(
        name, problem, ",".join(sorted(served)) or "?", tk_us, torch_us, wrapped_us, bare, gpu, ratio, wrapped_ratio
    )


def measure(
    rows: int = 8, width: int = 1024, dtype: torch.dtype = torch.float16, calls: int = 3000, rounds: int = 5
) -> dict[str, Any]:
    """One run on this host: a row per op, and the empty-launch floors."""
    if not torch.cuda.is_available():
        raise TunekitError("bench-host needs a CUDA GPU: it times eager launches")
    cases = _cases(rows, width, dtype).items()
    out = [_row(name, case, rows, width, dtype, calls, rounds) for name, case in cases]
    jit, bare = _empty_launch_us(calls)
    return {"rows": [asdict(r) for r in out], "empty_jit_us": jit, "empty_bare_us": bare}


def table(result: dict[str, Any]) -> str:
    lines = [
        f"{'op':20s} {'problem':14s} {'served':12s} {'tunekit us':>10s} {'torch us':>9s} {'torch/tk':>8s} "
        f"{'torch/wrap':>10s} {'bare us':>8s} {'tk-bare':>8s} {'gpu us':>8s}"
    ]
    for r in result["rows"]:
        bare = r["bare_launch_us"]
        gap = f"{r['tunekit_us'] - bare:8.1f}" if bare is not None else f"{'-':>8s}"
        bare_s = f"{bare:8.1f}" if bare is not None else f"{'-':>8s}"
        lines.append(
            f"{r['op']:20s} {r['problem']:14s} {r['served']:12s} {r['tunekit_us']:10.1f} {r['torch_us']:9.1f} "
            f"{r['ratio']:8.2f} {r['wrapped_ratio']:10.2f} {bare_s} {gap} {r['gpu_us']:8.1f}"
        )
    lines.append(
        f"empty Triton kernel: {result['empty_jit_us']:.1f} us through the JIT, {result['empty_bare_us']:.1f} us bare"
    )
    return "\n".join(lines)
