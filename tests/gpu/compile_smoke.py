"""Smoke test of tunekit's ops under torch.compile (Inductor) on a GPU, each op alone, forced to serve kernels:
compiles, agrees with eager, and the output code launches the kernel (no tunekit custom op left).

    TUNEKIT_UNTUNED=triton python tests/gpu/compile_smoke.py
"""

from __future__ import annotations

import traceback

import torch
from torch._inductor.utils import run_and_get_code

import tunekit.ops as tk
from tunekit.runtime import compile_policy, dispatch

compile_policy.FORCED = frozenset({compile_policy.ALL})
dev, dt = "cuda", torch.bfloat16
x = torch.randn(64, 256, device=dev, dtype=dt)
w = torch.randn(384, 256, device=dev, dtype=dt) / 16
b = torch.randn(384, device=dev, dtype=dt)
nw = torch.randn(256, device=dev, dtype=dt)
logits = torch.randn(64, 1000, device=dev, dtype=dt)
target = torch.randint(0, 1000, (64,), device=dev)
cos, sin = torch.randn(1, 64, 1, 64, device=dev, dtype=dt), torch.randn(1, 64, 1, 64, device=dev, dtype=dt)
q = torch.randn(1, 64, 4, 64, device=dev, dtype=dt)
big = torch.randn(2048, 3584, device=dev, dtype=dt)
big_w = torch.randn(3584, device=dev, dtype=dt)
CASES = {
    "rms_norm_2048x3584": (lambda x: tk.rms_norm(x, (3584,), big_w, 1e-6), (big,)),
    "rms_norm": (lambda x: tk.rms_norm(x, (256,), nw, 1e-6), (x,)),
    "layer_norm": (lambda x: tk.layer_norm(x, (256,), nw, None), (x,)),
    "linear": (lambda x: tk.linear(x, w, b), (x,)),
    "linear_silu": (lambda x: tk.linear(x, w, None, activation="silu"), (x,)),
    "softmax": (lambda x: tk.softmax(x, dim=-1), (x,)),
    "sum": (lambda x: tk.sum(x.float(), dim=-1), (x,)),
    "gelu": (lambda x: tk.gelu(x), (x,)),
    "cross_entropy": (lambda z: tk.cross_entropy(z, target), (logits,)),
}


def main() -> None:
    rows = []
    for name, (fn, args) in CASES.items():
        for train in (False, True):
            torch._dynamo.reset()
            dispatch.reset_all()
            ins = [a.detach().clone().requires_grad_(train) for a in args]
            try:
                with torch.set_grad_enabled(train):
                    want = fn(*ins)
                    out, code = run_and_get_code(torch.compile(fn, fullgraph=True), *ins)
                diff = (out.float() - want.float()).abs().max().item()
                if train:
                    out.float().sum().backward()
                kernels = sum(c.count("triton_kernel_wrapper") + c.count("_kernel") for c in code)
                leftover = sum(c.count("torch.ops.tunekit") for c in code)
                rows.append((name, train, "ok", diff, kernels, leftover))
            except Exception as exc:
                tb = [ln for ln in traceback.format_exception(exc) if "/tunekit/" in ln or "/kernels/" in ln]
                print(name, train, str(exc)[-2500:], "".join(tb[-6:]), flush=True)
                rows.append((name, train, "FAIL", float("nan"), 0, 0))
    print(f"{'op':14} {'train':5} {'status':6} {'max diff':>9} {'kernel refs':>11} {'tunekit ops':>11}")
    for r in rows:
        print(f"{r[0]:14} {r[1]!s:5} {r[2]:6} {r[3]:9.4f} {r[4]:11d} {r[5]:11d}")


if __name__ == "__main__":
    main()
