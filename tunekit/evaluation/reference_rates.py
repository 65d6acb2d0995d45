"""The rates a benchmark run holds its rows to, measured in the same run: the copy bandwidth, the bf16 matmul rate and
the launch floor, and a copy of one row's own bytes (what a problem of that size can reach)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tunekit.evaluation.runners import Runner
    from tunekit.tuning.bench import Timer

from tunekit.evaluation.checked_timing import error_note, time_graphed, time_run
from tunekit.evaluation.names import COPY
from tunekit.evaluation.results import COPY_BYTES, MATMUL_SIZE, Measurement


def copy_runner(nbytes: int) -> Runner:
    """One device-to-device copy of `nbytes` (read + write: 2 * nbytes moved)."""
    import torch

    from tunekit.core import backend

    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=backend.torch_device())
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def copy_bandwidth_gbps(timer: Timer, nbytes: int = COPY_BYTES) -> float:
    """Device-to-device copy, counting bytes read plus bytes written (the practical memory roofline)."""
    ms = timer(copy_runner(nbytes), {})
    return 2 * nbytes / (ms * 1e-3) / 1e9


def copy_measurement(bytes_moved: int, method: str, timer: Timer) -> Measurement:
    """A copy moving the row's bytes (half read, half written), timed like the row: what a problem of this size
    can reach. 32-64 MiB do not reach the 1 GiB copy's rate (launch, ramp-up and tail), not even as a copy."""
    try:
        ms, timing, note = time_run(copy_runner(max(bytes_moved // 2, 1)), method, timer)
    except Exception as exc:  # e.g. out of memory: the row keeps its roofline ratio
        return Measurement(COPY, "failed", note=error_note(exc))
    return Measurement(COPY, ms=float(ms), timing=timing, note=note)


def matmul_tflops(timer: Timer, size: int = MATMUL_SIZE) -> float:
    """The tensor-core roofline: torch.matmul of random bf16 size³ (cuBLAS), in TFLOP/s."""
    import torch

    from tunekit.core import backend

    device = backend.torch_device()
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    ms = timer(lambda: torch.matmul(a, b), {})
    return 2 * size**3 / (ms * 1e-3) / 1e12


def launch_floor_ms(timer: Timer, interpreted: bool) -> float:
    """An empty Triton kernel, timed as launch-bound problems are (CUDA graph; wall-clock in the interpreter)."""
    from tunekit.evaluation.runners import empty_kernel

    def run() -> None:
        empty_kernel[(1,)]()

    if interpreted:
        return timer(run, {})
    return time_graphed(timer, run)
