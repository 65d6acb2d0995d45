"""The dispatch step every op takes: the problem key of the kernel's inputs, the config dispatch serves for it, the
launch; for an op with a backward kernel, whether torch's own op trains an eager call; and the two ways such an
op trains (its custom op's registered autograd, and the eager Function)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, TypedDict, cast

import torch
from torch.library import CustomOpDef

from tunekit.core.space import Config, Problem
from tunekit.core.spec import Inputs, KernelSpec, Outputs
from tunekit.launch import watch as launch_watch
from tunekit.launch.traced import is_traced, traced_pointers
from tunekit.ops._checks import grads_flow
from tunekit.runtime import recorder
from tunekit.runtime.dispatch import TORCH, Dispatcher, chosen_under_compile, kernel_served_problems
from tunekit.runtime.hotpath import readable


class ServedBy(TypedDict):
    served_problems: Callable[[], tuple[list[Problem], list[Problem]] | None]
    chosen_under_compile: Callable[[], bool]


def _served_problems(forward: Dispatcher, *others: Dispatcher) -> tuple[list[Problem], list[Problem]] | None:
    """The problems dispatch may serve a kernel for here: of every kernel of the op, of its forward kernel."""
    first = kernel_served_problems(forward)
    rest = kernel_served_problems(*others) if others else []
    return None if first is None or rest is None else ([*first, *rest], first)


def served_by(forward: Dispatcher, *others: Dispatcher) -> ServedBy:
    """An op's hot_path arguments that depend on its kernels (the forward one first, then the backward ones):
    the problems they may serve a kernel for here, and whether one of them serves under torch.compile."""
    return ServedBy(
        served_problems=partial(_served_problems, forward, *others),
        chosen_under_compile=partial(chosen_under_compile, forward, *others),
    )


def kernel_op(name: str) -> Callable[[Callable[..., Any]], CustomOpDef]:
    """Register a body as the op `tunekit::name`: a torch.library.triton_op, so that torch.compile decomposes a
    call into the body's launches (Triton-kernel nodes of the graph, launch/traced.py) or torch code, as the
    body decides per problem when traced (served_config); eagerly, the body runs as it is."""

    def register(body: Callable[..., Any]) -> CustomOpDef:
        return cast(CustomOpDef, torch.library.triton_op(f"tunekit::{name}", body, mutates_args=()))

    return register


def _traced(inputs: Inputs) -> bool:
    """torch.compile tracing the op (its Python, or AOT autograd's decomposition of the op on fake tensors)."""
    return torch.compiler.is_compiling() or is_traced(inputs, {})


def _symbolic(inputs: Inputs) -> bool:
    """A traced input whose sizes or strides are symbolic (torch.compile's dynamic shapes)."""
    return any(
        isinstance(d, torch.SymInt)
        for t in inputs
        if isinstance(t, torch.Tensor)
        for d in (*t.shape, *t.stride(), t.storage_offset())
    )


def served_config(kernel: Dispatcher, inputs: Inputs) -> Config:
    """The config dispatch serves for these inputs; while torch.compile traces the op, the one its graph runs
    (Dispatcher.under_compile: TORCH where the kernel does not beat Inductor's code for the problem)."""
    if not _traced(inputs):
        return kernel.config(kernel.spec.key_of(inputs))
    if _symbolic(inputs):  # dynamic shapes: no one problem to choose for; torch's code, which Inductor sizes
        return TORCH
    with traced_pointers():
        return kernel.under_compile(kernel.spec.key_of(inputs))


def dispatch_launch(kernel: Dispatcher, inputs: Inputs, outputs: Outputs) -> bool:
    """Launch the config dispatch serves for these inputs into `outputs`. False, with nothing launched, where it
    serves torch's own op: the caller then runs torch."""
    spec = kernel.spec
    config = served_config(kernel, inputs)
    if config is TORCH:
        return False
    launch_on_their_device(spec, config, inputs, outputs)
    return True


def launch_on_their_device(spec: KernelSpec, config: Config, inputs: Inputs, outputs: Outputs) -> None:
    """Launch on the outputs' GPU. Triton launches on the current device, while torch's ops follow their tensors
    (a DeviceGuard): a call for another GPU than the current one sets that GPU around the launch, as torch does.
    Inputs with torch's negative or conjugate bit (a view derived inside the op keeps them) are resolved first: the
    kernel reads raw memory."""
    inputs = tuple(map(readable, inputs))
    if _traced(inputs):  # each launch becomes a node of the graph being traced (launch/traced.py)
        launch_watch.instrument_kernels()
        with traced_pointers():
            spec.launch(config, inputs, outputs)
        return
    out = outputs[0]
    if out.is_cuda and out.get_device() != torch.cuda.current_device():
        with torch.cuda.device(out.device):
            spec.launch(config, inputs, outputs)
    else:
        spec.launch(config, inputs, outputs)


def torch_trains_it(
    backward: Dispatcher,
    inputs: Inputs,
    input: torch.Tensor,
    *leaves: torch.Tensor | None,
    forward: Callable[[], tuple[Dispatcher, Inputs]] | None = None,
) -> bool:
    """Eager training (gradients flow to input or a leaf, not compiling, input not empty) whose backward problem,
    the `backward` kernel's problem of `inputs` (stand-ins: key_of reads shapes and dtypes), dispatch serves with
    torch's own op. Then the op runs torch's whole op and torch's autograd trains it, forward and backward, as
    without tunekit (by default a problem untuned on a GPU: nothing measured says a kernel beats torch there).
    `forward` (giving its kernel and inputs) is resolved too while a recording is on, so the plan holds the forward
    problem that the call runs once its backward is tuned (without, a pack built from such a recording missed the
    training forwards of RMSNorm and RoPE)."""
    if torch.compiler.is_compiling() or not grads_flow(input, *leaves) or input.numel() == 0:
        return False
    if backward.config(backward.spec.key_of(inputs)) is not TORCH:
        return False
    if forward is not None and recorder.ACTIVE:
        kernel, forward_inputs = forward()
        kernel.config(kernel.spec.key_of(forward_inputs))
    return True
