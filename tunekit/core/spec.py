"""The one declaration each kernel makes. Everything generic reads this and nothing kernel-specific."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import torch

from tunekit.core.buckets import TokenBuckets
from tunekit.core.errors import TunekitError
from tunekit.core.identity import HostWalk, SourceOf, function_source, make_identity, space_digest, walk_host, walk_jit
from tunekit.core.space import Config, Problem, SearchSpace, Value

if TYPE_CHECKING:
    from tunekit.core.device import DeviceFingerprint
    from tunekit.core.geometry import KernelModel

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


def _no_key(inputs: Inputs) -> ProblemKey:
    raise TunekitError("this kernel declares no key_of: no op dispatches it by its launch inputs")


# The callables a kernel module defines under these names, for KernelSpec.of_module.
MODULE_CALLABLES = (
    "launch",
    "alloc_outputs",
    "reference",
    "make_inputs",
    "problem_from_shape",
    "default_problems",
    "heuristic",
    "bytes_moved",
    "flops",
    "key_of",
)
OPTIONAL_MODULE_CALLABLES = ("torch_baseline", "torch_timing_inputs")


@dataclass(frozen=True)
class KernelSpec:
    """Everything the tuner, cache, dispatch, CLI and tests need to know about one kernel.

    Contract of the callables:
    - `launch(config, inputs, outputs)` writes every element of `outputs` and returns nothing.
    - `alloc_outputs(inputs)` returns uninitialised output tensors; the tuner poisons them with NaN.
    - `reference(inputs)` returns the expected outputs (torch, computed in higher precision).
    - `make_inputs(problem, device, seed)` returns random inputs (never zeros) for a problem.
    - `problem_from_shape(shape, dtype)` parses a user-given shape (CLI) into a problem.
    - `torch_baseline(inputs)` (optional) returns the outputs torch's own ops compute in the input dtype, what the
      kernel's op runs where dispatch serves torch: outputs like `reference`'s, so the same check compares them.
    - `torch_timing_inputs(inputs)` (optional) returns the inputs torch's op is timed on against the candidates:
      the bench inputs as the op's commonest call passes them, where the problem key leaves a scalar open whose
      value costs torch work the kernel does for free (GEMM's alpha and beta).
    - `key_of(inputs)` is the problem key (in `problem_fields` order) of a launch's inputs: what an op dispatches
      on, so `key_of(make_inputs(problem, ...)) == problem_key(problem)`. It runs on every op call: keep it cheap.

    A kernel module declares its spec with `KernelSpec.of_module(__name__, ...)`: the callables are the module's
    functions of those names.
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
    # Bumped by hand when host-side launch meaning changes (core/identity.py; tests/core/test_identity.py guards it).
    version: int
    shape_help: str = ""
    # What a user runs today without tunekit (e.g. F.layer_norm in the input dtype): the benchmark baseline.
    torch_baseline: Callable[[Inputs], Outputs] | None = None
    torch_timing_inputs: Callable[[Inputs], Inputs] | None = None
    key_of: Callable[[Inputs], ProblemKey] = _no_key
    # The tile geometry the quantization model reads (tunekit/core/geometry.py); None: the tuner searches unmodelled.
    model: KernelModel | None = None
    # Parameters the space's rules pin once another parameter changes (GEMM: SPLIT_K with the variant, GROUP_M
    # with BLOCK_M): the tuner's pattern search counts a move changing one of these alongside another as one step.
    dependent_params: frozenset[str] = frozenset()
    # The kernel's op runs torch's own implementation where dispatch serves TORCH (an untuned problem on a GPU, an
    # entry torch beat, a demoted entry). Declared here, not registered by the op when imported: a problem resolves
    # to the same layer in every process, whatever it imported (`tunekit show` imports no op).
    torch_fallback: bool = False
    # The values a problem field may take, where not every value of its type is a problem: a tuple of values (a
    # layout, an activation) or a range of ints (a size that may be 0). Undeclared: dtype is one of `tolerances`,
    # an int field a size in [1, 2^40) (tunekit/core/problems.py checks every problem that enters by these).
    problem_values: Mapping[str, tuple[Value, ...] | range] = field(default_factory=dict)
    # The problem field that counts tokens (rows), where the key holds it exact, and its bucket edges
    # (tunekit/core/buckets.py): plans record the edges around a count, and dispatch may serve a count between two
    # tuned edges from the upper one's entry (tunekit/runtime/buckets.py). None: every count is its own problem.
    token_buckets: TokenBuckets | None = None

    @classmethod
    def of_module(cls, module: str, **declared: Any) -> KernelSpec:
        """The spec of kernel module `module` (its __name__): the contract's callables (MODULE_CALLABLES, and
        OPTIONAL_MODULE_CALLABLES where present) are the module's functions of those names; `declared` holds the
        rest (name, description, space, problem_fields, tolerances, version, ...)."""
        namespace = vars(sys.modules[module])
        missing = [name for name in MODULE_CALLABLES if not callable(namespace.get(name))]
        if missing:
            raise TypeError(f"kernel module {module} defines no {missing}: a kernel module defines {MODULE_CALLABLES}")
        found = [name for name in MODULE_CALLABLES + OPTIONAL_MODULE_CALLABLES if callable(namespace.get(name))]
        return cls(**{name: namespace[name] for name in found}, **declared)

    def launch_path(self, source_of: SourceOf = function_source) -> HostWalk:
        """The host code from the launch and the problem parser: where the launched jit functions are found."""
        packages = ("tunekit.", self.launch.__module__)
        return walk_host((self.launch, self.problem_from_shape), packages, source_of)

    def identity(self, source_of: SourceOf = function_source) -> str:
        """jit code, space data and version (tunekit/core/identity.py); `source_of` lets tests edit the code."""
        code = walk_jit(self.launch_path(source_of).jit_roots, source_of).digest()
        return make_identity(self.version, code, space_digest(self.space.params))

    @cached_property
    def source_hash(self) -> str:
        """The kernel's identity, as cache keys carry it."""
        return self.identity()

    def problem_key(self, problem: Problem) -> ProblemKey:
        return tuple(problem[f] for f in self.problem_fields)

    def problem_dict(self, key: ProblemKey) -> dict[str, Value]:
        return dict(zip(self.problem_fields, key))

    def describe_problem(self, problem: Problem) -> str:
        return ",".join(f"{f}={problem[f]}" for f in self.problem_fields)


def row_bucket(rows: int) -> int:
    """Bucket a row count to the next power of two (the tuned config barely moves within a bucket)."""
    return 1 if rows <= 1 else 1 << (rows - 1).bit_length()
