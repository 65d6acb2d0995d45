"""The dispatch step every op takes: the problem key of the kernel's inputs, the config dispatch serves for it, the
launch."""

from __future__ import annotations

from tunekit.core.spec import Inputs, Outputs
from tunekit.runtime.dispatch import TORCH, Dispatcher


def dispatch_launch(kernel: Dispatcher, inputs: Inputs, outputs: Outputs) -> bool:
    """Launch the config dispatch serves for these inputs into `outputs`. False, with nothing launched, where it
    serves torch's own op: the caller then runs torch."""
    spec = kernel.spec
    config = kernel.config(spec.key_of(inputs))
    if config is TORCH:
        return False
    spec.launch(config, inputs, outputs)
    return True
