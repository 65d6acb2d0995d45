"""tunekit: autotuned Triton kernels with a device-keyed cache."""

__version__ = "0.1.0"

# Before anything imports triton: picks the GPU or Triton's interpreter (TRITON_INTERPRET must be set before
# triton's own @jit helpers are decorated).
from tunekit import backend as _backend  # noqa: F401
from tunekit.recorder import record_problems

__all__ = ["record_problems"]
