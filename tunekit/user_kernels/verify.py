"""A user kernel as a tunekit KernelSpec, for one launch's problem: what lets tunekit's tuner search it and tunekit's
verification check it (fresh random inputs, outputs poisoned with NaN, compared with the user's reference).

The user's `reference(args)` receives the kernel's arguments by name (fresh random inputs) and returns
`{output argument: expected tensor}`; it is called before the kernel runs, so an in-place kernel is checked too.
Without a reference nothing is checked (as with triton.autotune).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from triton import Config as TritonConfig

from tunekit.core.errors import TunekitError
from tunekit.core.space import Choice, Config, Problem, SearchSpace
from tunekit.core.spec import Inputs, KernelSpec, Outputs, Tolerance
from tunekit.user_kernels.configs import Candidates, as_triton
from tunekit.user_kernels.launch import Call, Hooks, launch

Reference = Callable[[dict[str, Any]], Mapping[str, torch.Tensor]]

DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "float16": Tolerance(atol=1e-2, rtol=1e-2),
    "bfloat16": Tolerance(atol=2e-2, rtol=2e-2),
    "float32": Tolerance(atol=1e-4, rtol=1e-4),
}


def fresh(named: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """The arguments with every floating tensor replaced by random values of its shape, dtype and strides; other
    tensors copied; everything else as it is."""
    generators: dict[torch.device, torch.Generator] = {}  # drawn where the tensor lives: no copy from the host
    out: dict[str, Any] = {}
    for name, value in named.items():
        if isinstance(value, torch.Tensor) and value.dtype.is_floating_point:
            generator = generators.get(value.device)
            if generator is None:
                generator = generators[value.device] = torch.Generator(value.device).manual_seed(seed)
            copy = torch.empty_like(value)
            copy.copy_(torch.randn(value.shape, generator=generator, device=value.device, dtype=torch.float32))
            out[name] = copy
        elif isinstance(value, torch.Tensor):
            out[name] = value.clone()
        else:
            out[name] = value
    return out


@dataclass(frozen=True)
class UserSpec(KernelSpec):
    """A KernelSpec whose identity is the user kernel's (tunekit.user_kernels.stored.kernel_identity)."""

    user_identity: str = ""

    @property
    def source_hash(self) -> str:
        return self.user_identity


def output_names(reference: Reference | None, call: Call, seed: int) -> tuple[str, ...]:
    """The arguments the reference says the kernel writes (it is asked once, on fresh inputs)."""
    if reference is None:
        return ()
    expected = reference(fresh(call.named, seed))
    unknown = [name for name in expected if name not in call.named]
    if unknown or not expected:
        raise TunekitError(
            f"{call.kernel}: reference= must return {{output argument: expected tensor}}, but returned keys "
            f"{sorted(expected)}; the kernel's arguments: {sorted(call.named)}"
        )
    return tuple(expected)


def user_spec(
    name: str,
    fn: Any,
    call: Call,
    candidates: Candidates,
    hooks: Hooks,
    identity: str,
    fields: tuple[str, ...],
    reference: Reference | None,
    tolerances: Mapping[str, Tolerance],
    by_id: Callable[[Config], TritonConfig | None],
) -> UserSpec:
    """The spec of kernel `fn` for the problem of `call`: inputs are fresh copies of the call's arguments."""
    outputs = output_names(reference, call, 0)
    space = candidates.space or SearchSpace((Choice("config", (0,)),))  # a list's configs are measured one by one

    def make_inputs(problem: Problem, device: torch.device, seed: int) -> Inputs:
        named = fresh(call.named, seed)
        expected = tuple(t.detach().clone() for t in reference(named).values()) if reference is not None else ()
        return (named, expected)

    def alloc_outputs(inputs: Inputs) -> Outputs:
        return tuple(inputs[0][n] for n in outputs)

    def run(config: Config, inputs: Inputs, outs: Outputs) -> None:
        triton_config = by_id(config) or as_triton(config)
        launch(fn, call.with_named(inputs[0]), triton_config, hooks)

    def expected(inputs: Inputs) -> Outputs:
        return inputs[1] if reference is not None else alloc_outputs(inputs)  # no reference: nothing to compare

    def heuristic(problem: Problem, device: Any) -> Config:
        valid = space.valid_configs(problem, device)
        if not valid:
            raise TunekitError(f"{name}: no config of the space passes its rules for {dict(problem)}")
        return valid[0]

    def unsupported(*_: Any) -> Any:
        raise TunekitError(f"{name} is a user kernel: it is tuned from its launches (or a plan), not from a shape")

    return UserSpec(
        name=name,
        description=f"user kernel {name}",
        space=space,
        problem_fields=fields,
        launch=run,
        alloc_outputs=alloc_outputs,
        reference=expected,
        make_inputs=make_inputs,
        problem_from_shape=unsupported,
        default_problems=lambda device: [],
        heuristic=heuristic,
        tolerances=tolerances,
        bytes_moved=lambda problem: 0,
        flops=lambda problem: 0,
        version=0,
        user_identity=identity,
    )
