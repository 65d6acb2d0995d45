"""Device fingerprints for testing rules and heuristics on hardware the tests do not run on.

H200: the fields `tunekit devices` printed on the H200 device machine (Triton 3.6.0, torch 2.11 cu130).
INTERPRETER: the interpreter's own fingerprint, also where the tests run on a GPU.
"""

from __future__ import annotations

from tunekit.core.device import DeviceFingerprint, _interpreter_fingerprint
from tunekit.core.device_limits import DeviceLimits


def gpu(
    vendor: str, name: str, compute_capability: str, sm_count: int, smem_per_block: int, l2_bytes: int,
    cuda_version: str, torch_version: str = "x",
) -> DeviceFingerprint:  # fmt: skip
    """A GPU under Triton 3.6.0 with 64Ki registers per SM (every part here); nothing is launched on it."""
    return DeviceFingerprint(
        vendor=vendor, name=name, compute_capability=compute_capability, sm_count=sm_count,
        smem_per_block=smem_per_block, l2_bytes=l2_bytes, regs_per_sm=65536, triton_version="3.6.0",
        torch_version=torch_version, cuda_version=cuda_version,
    )  # fmt: skip


H200 = gpu("nvidia", "NVIDIA H200", "9.0", 132, 232448, 62914560, "13.0", torch_version="2.11.0+cu130")
A10 = gpu("nvidia", "NVIDIA A10", "8.6", 72, 101376, 6291456, "12.4")
MI300 = gpu("amd", "AMD Instinct MI300X", "9.4", 304, 65536, 4194304, "6.2")  # AMD reports gfx942 as 9.4: no TMA
INTERPRETER = _interpreter_fingerprint()

# The H200's occupancy limits as tunekit.core.device_limits reads them (recorded in cache/timings/h200-sm90-132sm/):
# its fingerprint's SMs, registers and shared memory per block, and what sm_90 allows per SM.
H200_LIMITS = DeviceLimits(
    sm_count=H200.sm_count,
    warp_size=32,
    max_threads_per_sm=2048,
    max_blocks_per_sm=32,
    regs_per_sm=H200.regs_per_sm,
    smem_per_sm=233472,
    smem_per_block=H200.smem_per_block,
)
