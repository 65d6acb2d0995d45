"""How a benchmark runs what it times besides tunekit's kernels: a torch program eager, under torch.compile or as an
autograd backward, and the empty Triton kernel whose launch is the floor launch-bound rows are held to."""

from __future__ import annotations

# First: it sets TRITON_INTERPRET when there is no GPU, and triton reads that when it is imported.
import tunekit.core.backend  # noqa: F401

# isort: split

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import triton

Runner = Callable[[], Any]


@dataclass(frozen=True)
class TorchProgram:
    """What a user writes in torch for one problem: `fn(*args)`, or with `grad` the backward of fn's output.

    `grad` is (dy, leaves): the forward runs once when the runner is built and only the backward is timed.
    """

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    grad: tuple[torch.Tensor, tuple[torch.Tensor, ...]] | None = None


@triton.jit
def empty_kernel() -> None:
    """Does nothing: timed like a launch-bound problem, it is the launch floor those are reported against."""
    pass


def eager_runner(program: TorchProgram) -> Runner:
    return _runner(program.fn, program)


def compiled_runner(program: TorchProgram, mode: str | None, backend: str = "inductor") -> Runner:
    """torch.compile of the eager program, specialised to this shape (dynamic=False), from a clean dynamo cache.

    The reset matters: a suite compiles the same function for dozens of shapes, and past dynamo's recompile limit
    it would quietly run eager.
    """
    torch._dynamo.reset()
    compiled = torch.compile(program.fn, mode=mode, dynamic=False, backend=backend)
    return _runner(compiled, program)


@dataclass(frozen=True)
class AutogradRunner:
    """The backward of a forward run once (`y`): torch.autograd.grad, the part a backward benchmark times.

    evaluation.report never captures one in a CUDA graph: autograd runs the backward ops from its device thread on the
    stream the forward ran on (here, before and outside the capture), which a capture only records by joining that
    stream. On the H200 the same program's capture failed for fp16 ("operation failed due to a previous error
    during capture") and went through for bf16; it is timed with CUDA events instead.
    """

    y: Any
    leaves: tuple[torch.Tensor, ...]
    dy: torch.Tensor

    def __call__(self) -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(self.y, self.leaves, self.dy, retain_graph=True)


def _runner(fn: Callable[..., Any], program: TorchProgram) -> Runner:
    if program.grad is None:
        return lambda: fn(*program.args)
    dy, leaves = program.grad
    return AutogradRunner(fn(*program.args), leaves, dy)
