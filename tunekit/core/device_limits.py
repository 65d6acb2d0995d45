"""What bounds occupancy on a device: SMs, and the registers, shared memory, threads and blocks of one SM.

Read from the device (torch's device properties and the CUDA driver), never hard-coded; recorded timing tables
carry the limits of the device they were measured on, so a CPU machine can model that device. Not part of the
cache key: the fingerprint (tunekit.core.device) already names the part.
"""

from __future__ import annotations

import ctypes
import functools
from dataclasses import asdict, dataclass
from typing import Any

# CUDA driver attributes (cuDeviceGetAttribute) for what torch's properties may not expose.
_CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR = 82
_CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR = 106
# Used only if the driver cannot be asked: every NVIDIA architecture since Maxwell except Turing allows 32.
_FALLBACK_MAX_BLOCKS_PER_SM = 32


@dataclass(frozen=True)
class DeviceLimits:
    sm_count: int
    warp_size: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    regs_per_sm: int
    smem_per_sm: int  # bytes
    smem_per_block: int  # bytes, the opt-in maximum one block can be given

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeviceLimits:
        return cls(**{f: int(data[f]) for f in cls.__dataclass_fields__})


def _driver_attribute(index: int, attribute: int) -> int | None:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        device = ctypes.c_int()
        value = ctypes.c_int()
        if lib.cuInit(0) != 0 or lib.cuDeviceGet(ctypes.byref(device), index) != 0:
            return None
        if lib.cuDeviceGetAttribute(ctypes.byref(value), attribute, device) != 0 or value.value <= 0:
            return None
        return int(value.value)
    except OSError:
        return None


def _smem_per_block_optin(props: Any, index: int) -> int:
    optin = int(getattr(props, "shared_memory_per_block_optin", 0))
    if optin == 0:  # older torch: ask Triton's driver, which reads the same attribute
        from tunekit.core.triton_adapter import max_shared_memory_optin

        optin = max_shared_memory_optin(index)
    return optin


@functools.cache
def device_limits(index: int | None = None) -> DeviceLimits | None:
    """The limits of a CUDA device (the current one by default); None in the interpreter, which has no SMs."""
    import torch

    from tunekit.core import backend

    if backend.INTERPRETED or not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(index)
    return DeviceLimits(
        sm_count=int(props.multi_processor_count),
        warp_size=int(getattr(props, "warp_size", 32)),
        max_threads_per_sm=int(props.max_threads_per_multi_processor),
        max_blocks_per_sm=_driver_attribute(index, _CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR)
        or _FALLBACK_MAX_BLOCKS_PER_SM,
        regs_per_sm=int(getattr(props, "regs_per_multiprocessor", 0))
        or _driver_attribute(index, _CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)
        or 0,
        smem_per_sm=int(props.shared_memory_per_multiprocessor),
        smem_per_block=_smem_per_block_optin(props, index),
    )
