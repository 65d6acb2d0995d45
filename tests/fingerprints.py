"""Device fingerprints for testing rules and heuristics on hardware the tests do not run on.

H200: the fields `tunekit devices` printed on the H200 device machine (Triton 3.6.0, torch 2.11 cu130).
"""

from __future__ import annotations

import dataclasses

from tunekit.core.device import INTERPRETER_VENDOR, DeviceFingerprint
from tunekit.core.device_limits import DeviceLimits

H200 = DeviceFingerprint(
    vendor="nvidia",
    name="NVIDIA H200",
    compute_capability="9.0",
    sm_count=132,
    smem_per_block=232448,
    l2_bytes=62914560,
    regs_per_sm=65536,
    triton_version="3.6.0",
    torch_version="2.11.0+cu130",
    cuda_version="13.0",
)
INTERPRETER = dataclasses.replace(
    H200,
    vendor=INTERPRETER_VENDOR,
    name="cpu",
    compute_capability="none",
    sm_count=0,
    smem_per_block=0,
    l2_bytes=0,
    regs_per_sm=0,
    cuda_version="none",
)

# The H200's occupancy limits as tunekit.core.device_limits reads them (recorded in cache/timings/h200-sm90-132sm/).
H200_LIMITS = DeviceLimits(
    sm_count=132,
    warp_size=32,
    max_threads_per_sm=2048,
    max_blocks_per_sm=32,
    regs_per_sm=65536,
    smem_per_sm=233472,
    smem_per_block=232448,
)
