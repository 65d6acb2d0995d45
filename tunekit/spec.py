"""The one declaration each kernel makes. Everything generic reads this and nothing kernel-specific."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from tunekit.space import Config, Problem, SearchSpace, Value

if TYPE_CHECKING:
    from tunekit.device import DeviceFingerprint

Inputs = tuple[Any, ...]
Outputs = tuple[torch.Tensor, ...]
ProblemKey = tuple[Value, ...]

DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


@dataclass(frozen=True)
class KernelSpec:
    """Everything the tuner, cache, dispatch, CLI and tests need to know about one kernel.

    Contract of the callables:
    - `launch(config, inputs, outputs)` writes every element of `outputs` and returns nothing.
    - `alloc_outputs(inputs)` returns uninitialised output tensors; the tuner poisons them with NaN.
    - `reference(inputs)` returns the expected outputs (torch, computed in higher precision).
    - `make_inputs(problem, device, seed)` returns random inputs (never zeros) for a problem.
    - `problem_from_shape(shape, dtype)` parses a user-given shape (CLI) into a problem.
    """

    name: str
    description: str
    space: SearchSpace
    problem_fields: tuple[str, ...]
    launch: Callable[[Config, Inputs, Outputs], None]
    alloc_outputs: Callable[[Inputs], Outputs]
    reference: Callable[[Inputs], Outputs]
    make_inputs: Callable[[Problem, torch.device, int], Inputs]
    problem_from_shape: Callable[[tuple[int, ...], str], Problem]
    default_problems: Callable[[DeviceFingerprint], list[Problem]]
    heuristic: Callable[[Problem, DeviceFingerprint], Config]
    tolerances: Mapping[str, Tolerance]
    bytes_moved: Callable[[Problem], int]
    flops: Callable[[Problem], int]
    source_hash: str
    shape_help: str = ""
    # What a user runs today without tunekit (e.g. F.layer_norm in the input dtype): the benchmark baseline.
    torch_baseline: Callable[[Inputs], Any] | None = None

    def problem_key(self, problem: Problem) -> ProblemKey:
        return tuple(problem[f] for f in self.problem_fields)

    def problem_dict(self, key: ProblemKey) -> dict[str, Value]:
        return dict(zip(self.problem_fields, key))

    def describe_problem(self, problem: Problem) -> str:
        return ",".join(f"{f}={problem[f]}" for f in self.problem_fields)


def source_digest(modules: Sequence[ModuleType]) -> str:
    """Hash of the kernel's and its space's source: an edit to either retires the cached entries."""
    h = hashlib.sha256()
    for module in modules:
        h.update(inspect.getsource(module).encode())
    return h.hexdigest()[:16]


def row_bucket(rows: int) -> int:
    """Bucket a row count to the next power of two (the tuned config barely moves within a bucket)."""
    return 1 if rows <= 1 else 1 << (rows - 1).bit_length()
