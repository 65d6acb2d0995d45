"""A small kernel written here for the tunekit.autotune tests: the same jit function under triton.autotune and under
tunekit.autotune (tests/user_kernels/test_user_kernels.py; a second process imports this module by name)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import tunekit

CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((16, 1), (32, 2), (64, 4))]


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # x_ptr, y_ptr, out_ptr: (n,)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


@triton.jit
def add_even_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    # x_ptr, y_ptr, out_ptr: (n,); EVEN (a triton.heuristics value): n is a multiple of every BLOCK, no mask
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs))
    else:
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def grid(meta: dict) -> tuple[int]:
    return (triton.cdiv(meta["n"], meta["BLOCK"]),)


class FakeBench:
    """A do_bench that runs the launch once and answers times in turn (the interpreter has no GPU timer):
    with TIMES, the second config of each sweep is the fastest."""

    TIMES = (3.0, 1.0, 2.0)

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, fn, quantiles=None):
        fn()
        self.calls += 1
        return [self.TIMES[(self.calls - 1) % len(self.TIMES)]] * 3


def add_inputs(problem: dict) -> tuple:
    """A launch of a stored key (what `tunekit tune --plan` tunes): random inputs of its size and dtypes."""
    n = problem["n"]
    x, y, out = (torch.randn(n, dtype=getattr(torch, problem[f"dtype.{a}"])) for a in ("x_ptr", "y_ptr", "out_ptr"))
    return grid, (x, y, out, n), {}


triton_bench, tunekit_bench = FakeBench(), FakeBench()
triton_add = triton.autotune(configs=CONFIGS, key=["n"], do_bench=triton_bench)(add_kernel)
tunekit_add = tunekit.autotune(
    configs=CONFIGS, key=["n"], do_bench=tunekit_bench, name="user_kernel_example:tunekit_add", inputs=add_inputs
)(add_kernel)
