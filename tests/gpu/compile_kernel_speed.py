"""The same tuned kernel launched eagerly by tunekit and as a node of an Inductor-compiled graph, against
torch.compile of torch's op: does Inductor's build of a user kernel run as fast as Triton's own JIT build?
Qwen2-7B prefill problems (TUNEKIT_CACHE_DIR holding tuned entries). CUDA-event medians, L2 flushed.

    python tests/gpu/compile_kernel_speed.py
"""

from __future__ import annotations

import os

import torch
import torch._inductor.config
import triton.testing

import tunekit.ops as tk
from tunekit.runtime import compile_policy, dispatch

dev, dt = "cuda", torch.bfloat16
m, h, inter = 4096, 3584, 18944
x = torch.randn(m, h, device=dev, dtype=dt)
xi = torch.randn(m, inter, device=dev, dtype=dt)
w_qo = torch.randn(h, h, device=dev, dtype=dt) / 60
w_up = torch.randn(inter, h, device=dev, dtype=dt) / 60
w_down = torch.randn(h, inter, device=dev, dtype=dt) / 130
nw = torch.randn(h, device=dev, dtype=dt)
CASES = {
    "o_proj 4096x3584x3584": (lambda x: tk.linear(x, w_qo), lambda x: torch.nn.functional.linear(x, w_qo), x),
    "up 4096x18944x3584": (lambda x: tk.linear(x, w_up), lambda x: torch.nn.functional.linear(x, w_up), x),
    "gate silu": (
        lambda x: tk.linear(x, w_up, activation="silu"),
        lambda x: torch.nn.functional.silu(torch.nn.functional.linear(x, w_up)),
        x,
    ),
    "down 4096x3584x18944": (lambda x: tk.linear(x, w_down), lambda x: torch.nn.functional.linear(x, w_down), xi),
    "rms_norm 4096x3584": (
        lambda x: tk.rms_norm(x, (h,), nw, 1e-6),
        lambda x: torch.nn.functional.rms_norm(x, (h,), nw, 1e-6),
        x,
    ),
}


def ms(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median"))


# Inductor passes a kernel's Python-float arguments as fp64 (its `_use_fp64_for_unbacked_floats`), which turns
# fp32 epilogue math into fp64; TUNEKIT_FP32_SCALARS=1 measures with fp32 scalars, as Triton's own JIT passes them.
if os.environ.get("TUNEKIT_FP32_SCALARS") == "1":
    torch._inductor.config._use_fp64_for_unbacked_floats = False


def main() -> None:
    compile_policy.FORCED = frozenset({compile_policy.ALL})
    print(f"{'problem':24} {'tk eager':>9} {'tk compiled':>11} {'torch':>8} {'inductor':>9}")
    with torch.no_grad():
        for name, (mine, theirs, arg) in CASES.items():
            dispatch.reset_all()
            torch._dynamo.reset()
            eager, ref = ms(lambda f=mine, a=arg: f(a)), ms(lambda f=theirs, a=arg: f(a))
            mine_c, theirs_c = torch.compile(mine), torch.compile(theirs)
            compiled_ms = ms(lambda f=mine_c, a=arg: f(a))
            ind_ms = ms(lambda f=theirs_c, a=arg: f(a))
            print(f"{name:24} {eager:9.4f} {compiled_ms:11.4f} {ref:8.4f} {ind_ms:9.4f}", flush=True)


if __name__ == "__main__":
    main()
