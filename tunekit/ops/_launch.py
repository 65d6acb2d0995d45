"""The dispatch step every op takes: the problem key of the kernel's inputs, the config dispatch serves for it, the
launch; and, for an op with a backward kernel, whether torch's own op trains an eager call."""

from __future__ import annotations

import torch

from tunekit.core.spec import Inputs, Outputs
from tunekit.ops._checks import grads_flow
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


def torch_trains_it(backward: Dispatcher, inputs: Inputs, input: torch.Tensor, *leaves: torch.Tensor | None) -> bool:
    """Eager training (gradients flow to input or a leaf, not compiling, input not empty) whose backward problem,
    the `backward` kernel's problem of `inputs` (stand-ins: key_of reads shapes and dtypes), dispatch serves with
    torch's own op. Then the op runs torch's whole op and torch's autograd trains it, forward and backward, as
    without tunekit (by default a problem untuned on a GPU: nothing measured says a kernel beats torch there)."""
    if torch.compiler.is_compiling() or not grads_flow(input, *leaves) or input.numel() == 0:
        return False
    return backward.config(backward.spec.key_of(inputs)) is TORCH
