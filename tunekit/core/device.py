"""Device fingerprint: what a tuned config is valid for."""

from __future__ import annotations

import functools
import os
from dataclasses import asdict, dataclass
from typing import Any

import torch
import triton

from tunekit.core import backend
from tunekit.core.canonical import digest
from tunekit.core.triton_adapter import max_shared_memory_optin

INTERPRETER_VENDOR = "triton-interpreter"


@dataclass(frozen=True)
class DeviceFingerprint:
    vendor: str
    name: str
    compute_capability: str
    sm_count: int
    smem_per_block: int  # bytes, the opt-in maximum a block can be given
    l2_bytes: int
    regs_per_sm: int
    triton_version: str
    torch_version: str
    cuda_version: str

    @property
    def is_interpreter(self) -> bool:
        return self.vendor == INTERPRETER_VENDOR

    def key_fields(self) -> dict[str, Any]:
        """What the cache key uses: the hardware and the version that changes code generation.

        The name is included too (a departure from DESIGN.md, which calls it advisory): two parts with equal
        SM count, L2 and shared memory can still differ in memory bandwidth, and a foreign entry must not
        be served.
        """
        fields = asdict(self)
        del fields["torch_version"], fields["cuda_version"]
        return fields

    @property
    def key(self) -> str:
        return digest(self.key_fields())

    @property
    def label(self) -> str:
        if self.is_interpreter:
            return f"interpreter-triton{self.triton_version}"
        slug = self.name.lower().replace("nvidia ", "").replace(" ", "-")
        return f"{slug}-sm{self.compute_capability.replace('.', '')}-{self.sm_count}sm"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DeviceFingerprint:
        return cls(**{f: data[f] for f in cls.__dataclass_fields__})


def _interpreter_fingerprint() -> DeviceFingerprint:
    return DeviceFingerprint(
        vendor=INTERPRETER_VENDOR,
        name="cpu",
        compute_capability="none",
        sm_count=0,
        smem_per_block=0,
        l2_bytes=0,
        regs_per_sm=0,
        triton_version=triton.__version__,
        torch_version=torch.__version__,
        cuda_version="none",
    )


def _cuda_fingerprint(index: int) -> DeviceFingerprint:
    props = torch.cuda.get_device_properties(index)
    smem_optin = int(getattr(props, "shared_memory_per_block_optin", 0))
    if smem_optin == 0:
        smem_optin = max_shared_memory_optin(index)
    return DeviceFingerprint(
        vendor="nvidia" if torch.version.hip is None else "amd",
        name=props.name,
        compute_capability=f"{props.major}.{props.minor}",
        sm_count=int(props.multi_processor_count),
        smem_per_block=smem_optin,
        l2_bytes=int(getattr(props, "L2_cache_size", 0)),
        regs_per_sm=int(getattr(props, "regs_per_multiprocessor", 0)),
        triton_version=triton.__version__,
        torch_version=torch.__version__,
        cuda_version=str(torch.version.cuda or torch.version.hip or "none"),
    )


@functools.cache
def fingerprint(index: int | None = None) -> DeviceFingerprint:
    """Fingerprint of the device kernels run on (the current CUDA device, or the interpreter)."""
    if backend.INTERPRETED:
        return _interpreter_fingerprint()
    return _cuda_fingerprint(torch.cuda.current_device() if index is None else index)


@functools.cache
def memory_bytes() -> int:
    """The memory problems' tensors live in: the current GPU's, or in the interpreter the host's (its physical
    memory, less where a cgroup caps this process lower)."""
    if not backend.INTERPRETED:
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:  # cgroup v2; "max" where there is no cap
            capped = f.read().strip()
    except OSError:
        capped = ""
    return min(host, int(capped)) if capped.isdigit() else host


def all_fingerprints() -> list[DeviceFingerprint]:
    if backend.INTERPRETED:
        return [_interpreter_fingerprint()]
    return [fingerprint(i) for i in range(torch.cuda.device_count())]
