"""Physical floors of a measured time: what no measurement of a problem on a device can beat.

- A launch: no kernel launch completes, as a timer sees it, in under a microsecond on a GPU (the fastest time in
  the shipped H200 database, measured with CUDA events, is 5.3 us); a kernel whose declaration launches Triton
  code, in Triton's interpreter, which runs each program in Python, under 0.1 ms (a 4-element gelu takes ~4 ms
  there). A kernel whose launch is plain torch (tests' toy kernel) has the GPU's floor there too.
- Bytes: no device moves memory faster than 20 TB/s (2.5x the fastest HBM shipping today, 8 TB/s). The fingerprint
  does not give a part's bandwidth, and a small problem's writes may complete in L2 faster than DRAM would take
  them, so the bound is the same for every device.
- FLOPs: no SM does more than 16,384 FLOPs a clock at 3 GHz (Blackwell's dense 16-bit tensor cores do ~7,700 at
  ~2 GHz, Hopper's ~4,100), so a device's peak is bounded by its SM count.
An imported time below its floor is refused; a store row's is ignored (never served).
"""

from __future__ import annotations

from typing import Any

from tunekit.core.device import DeviceFingerprint
from tunekit.core.spec import KernelSpec

LAUNCH_FLOOR_MS = 1e-3
INTERPRETER_LAUNCH_FLOOR_MS = 0.1
FASTEST_MEMORY_BYTES_PER_S = 20e12
MAX_FLOPS_PER_SM_PER_S = 16384 * 3e9


def _size(measure: Any, problem: dict[str, Any]) -> int:
    try:
        return max(0, int(measure(problem)))
    except (ArithmeticError, LookupError, TypeError, ValueError):
        return 0  # a problem the spec cannot size: no floor from it


_LAUNCHES_TRITON: dict[str, bool] = {}


def _launches_triton(spec: KernelSpec) -> bool:
    """Whether the kernel's launch runs @triton.jit code (its identity's jit roots), once per kernel name."""
    found = _LAUNCHES_TRITON.get(spec.name)
    if found is None:
        found = _LAUNCHES_TRITON[spec.name] = bool(spec.launch_path().jit_roots)
    return found


def time_floor_ms(spec: KernelSpec, problem: dict[str, Any], device: DeviceFingerprint | None = None) -> float:
    """The least time a measurement of `problem` on `device` can take (without a device: on any GPU): its launch
    floor, its minimum bytes at the fastest memory, or its FLOPs at the device's bounded peak, whichever is
    longest."""
    interpreter = device is not None and device.is_interpreter
    floor = INTERPRETER_LAUNCH_FLOOR_MS if interpreter and _launches_triton(spec) else LAUNCH_FLOOR_MS
    floor = max(floor, _size(spec.bytes_moved, problem) / FASTEST_MEMORY_BYTES_PER_S * 1e3)
    if device is not None and not interpreter and device.sm_count > 0:
        floor = max(floor, _size(spec.flops, problem) / (device.sm_count * MAX_FLOPS_PER_SM_PER_S) * 1e3)
    return floor


def floor_text() -> str:
    """How a floor is reckoned, for an error message."""
    launch = "1 us (0.1 ms for Triton code in the interpreter)"
    bandwidth = f"{FASTEST_MEMORY_BYTES_PER_S / 1e12:g} TB/s"
    return f"a launch takes {launch}; its bytes at {bandwidth}; its FLOPs at the device's peak"
