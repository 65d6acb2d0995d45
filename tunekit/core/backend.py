"""Where kernels run: a CUDA GPU, or Triton's interpreter on the CPU when there is none.

Imported before any kernel module, because `triton.jit` picks the interpreter at decoration time.
"""

from __future__ import annotations

import logging
import os
import sys

import torch

from tunekit.core import settings

# A child of "tunekit": the CLI, which says where kernels run in the commands where it matters, mutes this one.
logger = logging.getLogger("tunekit.backend")

_INTERPRETER_NOTICE = (
    "tunekit: no CUDA GPU found; kernels run in Triton's interpreter on the CPU "
    "(correct results, CPU speed). Timings are interpreter wall-clock and cached under their own device."
)


def _select() -> bool:
    """Return True when kernels run in the interpreter; set TRITON_INTERPRET=1 if we chose it."""
    if settings.interpret_requested():
        return True
    if torch.cuda.is_available():
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    if "triton" in sys.modules:  # imported before tunekit: its jit functions were built for a GPU
        from tunekit.core.triton_adapter import interpret_jit_functions

        interpret_jit_functions()
    logger.warning(_INTERPRETER_NOTICE)
    return True


INTERPRETED: bool = _select()


def torch_device() -> torch.device:
    """The device tensors must live on for tunekit's kernels."""
    return torch.device("cpu") if INTERPRETED else torch.device("cuda", torch.cuda.current_device())
