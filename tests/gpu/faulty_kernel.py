"""A deliberately faulty kernel for the GPU run of tests/gpu/fault_run.py: y = 2x, plus planted faults.

`mode` picks the variant (a constexpr, so each is its own compiled kernel):
- ok: y = 2x, correct, the only mode that can win;
- compile_error: a failing tl.static_assert (a CompilationError at compile time);
- smem: a 128x256x128 fp16 tl.dot pipelined over 5 stages, ~480 KiB of shared memory (> 227 KiB on an H200:
  OutOfResources when the binary is loaded);
- hang: spins on a flag that nobody sets (never finishes: the per-candidate timeout must kill the worker);
- illegal: stores 2**40 elements past the output (an illegal memory access: the CUDA context is unusable after).

Fault modes are tried at one config each (BLOCK=1024, num_warps=4); hang and illegal are excluded in the
interpreter (an infinite loop there never ends; a wild store there writes into the CPU process).
"""

from __future__ import annotations

import tunekit.core.backend  # noqa: F401  (first: selects the GPU or the interpreter before @triton.jit)

# isort: split


import torch
import triton
import triton.language as tl

from tunekit.core.space import Choice, Config, PowerOfTwo, Problem, Rule, SearchSpace
from tunekit.core.spec import KernelSpec, Tolerance

MODES = ("ok", "compile_error", "smem", "hang", "illegal")
FAULTS = MODES[1:]
_SMEM_M, _SMEM_N, _SMEM_K, _SMEM_KTOTAL = 128, 256, 128, 1024


@triton.jit
def _faulty(
    x_ptr,  # [n] float32
    y_ptr,  # [n] float32
    a_ptr,  # [128, 1024] float16 (smem mode's operands)
    b_ptr,  # [1024, 256] float16
    c_ptr,  # [128, 256] float32 (smem mode's result)
    flag_ptr,  # [1] int32, always 0
    n,
    MODE: tl.constexpr,
    BLOCK: tl.constexpr,
    SM: tl.constexpr,
    SN: tl.constexpr,
    SK: tl.constexpr,
    SKT: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if MODE == 1:
        tl.static_assert(BLOCK < 0, "planted compile error")
    if MODE == 2:  # noqa: SIM102  (a constexpr test and a runtime one: kept apart for Triton)
        if pid == 0:
            rm = tl.arange(0, SM)
            rn = tl.arange(0, SN)
            rk = tl.arange(0, SK)
            acc = tl.zeros((SM, SN), dtype=tl.float32)
            for k in range(0, SKT, SK):
                a = tl.load(a_ptr + rm[:, None] * SKT + (k + rk)[None, :])
                b = tl.load(b_ptr + (k + rk)[:, None] * SN + rn[None, :])
                acc += tl.dot(a, b)
            tl.store(c_ptr + rm[:, None] * SN + rn[None, :], acc)
    if MODE == 3:
        while tl.load(flag_ptr, volatile=True) == 0:
            pass
    if MODE == 4:
        tl.store(y_ptr + offs.to(tl.int64) + (1 << 40), x, mask=mask)
    tl.store(y_ptr + offs, x * 2, mask=mask)


def launch(config: Config, inputs: tuple, outputs: tuple) -> None:
    x, a, b, c, flag = inputs
    (y,) = outputs
    mode = MODES.index(str(config["mode"]))
    block = int(config["BLOCK"])
    stages = 5 if config["mode"] == "smem" else 2
    grid = (triton.cdiv(x.numel(), block),)
    _faulty[grid](
        x, y, a, b, c, flag, x.numel(),
        MODE=mode, BLOCK=block, SM=_SMEM_M, SN=_SMEM_N, SK=_SMEM_K, SKT=_SMEM_KTOTAL,
        num_warps=int(config["num_warps"]), num_stages=stages,
    )  # fmt: skip


def make_inputs(problem: Problem, device: torch.device, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(int(problem["n"]), generator=g)
    a = torch.randn(_SMEM_M, _SMEM_KTOTAL, generator=g).half()
    b = torch.randn(_SMEM_KTOTAL, _SMEM_N, generator=g).half()
    c = torch.empty(_SMEM_M, _SMEM_N)
    flag = torch.zeros(1, dtype=torch.int32)
    return tuple(t.to(device) for t in (x, a, b, c, flag))


def _one_config_per_fault(c: Config, p: Problem, d: object) -> bool:
    return c["mode"] == "ok" or (c["BLOCK"] == 1024 and c["num_warps"] == 4)


def _not_in_interpreter(c: Config, p: Problem, d: object) -> bool:
    return not getattr(d, "is_interpreter", False) or c["mode"] not in ("hang", "illegal")


SPACE = SearchSpace(
    params=(Choice("mode", MODES), PowerOfTwo("BLOCK", 256, 2048), PowerOfTwo("num_warps", 4, 8)),
    rules=(
        Rule("one_config_per_fault", _one_config_per_fault, "each fault is tried once"),
        Rule("safe_in_interpreter", _not_in_interpreter, "no infinite loop or wild store on the CPU"),
    ),
)

SPEC = KernelSpec(
    name="faulty",
    description="y = 2x with planted faults (issue 7's GPU run)",
    space=SPACE,
    problem_fields=("n",),
    launch=launch,
    alloc_outputs=lambda inputs: (torch.empty_like(inputs[0]),),
    reference=lambda inputs: (inputs[0] * 2,),
    make_inputs=make_inputs,
    problem_from_shape=lambda shape, dtype: {"n": int(shape[0])},
    default_problems=lambda device: [{"n": 4096 if device.is_interpreter else 1 << 24}],
    heuristic=lambda problem, device: {"mode": "ok", "BLOCK": 1024, "num_warps": 4},
    tolerances={"float32": Tolerance(1e-6, 1e-6)},
    bytes_moved=lambda p: 8 * int(p["n"]),
    flops=lambda p: int(p["n"]),
    version=1,
    shape_help="N",
)
