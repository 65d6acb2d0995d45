# ruff: noqa: B023  (each closure is timed within its own loop iteration)
"""One device run: identities, GEMM autograd on the GPU, norm forward+backward vs torch and Liger, host cost per
eager call, and the model benchmark (eager, tunekit-patched, Liger). Prints short tables; JSON under $OUT.

    python tests/gpu/session_probe.py [--skip-models]
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.testing import do_bench

import tunekit.ops as ops
from tunekit.core.registry import get_spec, kernel_names

OUT = Path(os.environ.get("OUT", "/tmp/out"))
OUT.mkdir(parents=True, exist_ok=True)
record: dict[str, object] = {}


def identities() -> None:
    ids = {k: get_spec(k).source_hash for k in kernel_names()}
    record["identities"] = ids
    print("identities", json.dumps(ids))


def gemm_autograd() -> None:
    rows = []
    for m, n, k, act in ((4096, 4096, 4096, None), (4096, 11008, 4096, "silu"), (1000, 3000, 2000, "gelu")):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = (torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5).requires_grad_()
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        f = {None: lambda t: t, "silu": F.silu, "gelu": F.gelu}[act]
        ref = torch.autograd.grad(f(F.linear(x.double(), w.double(), b.double())), (x, w, b), dy.double())
        got = torch.autograd.grad(ops.linear(x, w, b, act), (x, w, b), dy)
        errs = [float((g.double() - r).norm() / r.norm()) for g, r in zip(got, ref)]

        def tk_step() -> None:
            torch.autograd.grad(ops.linear(x, w, b, act), (x, w, b), dy)

        def torch_step() -> None:
            torch.autograd.grad(f(F.linear(x, w, b)), (x, w, b), dy)

        t_tk, t_torch = do_bench(tk_step, return_mode="median"), do_bench(torch_step, return_mode="median")
        rows.append({"shape": f"{m}x{n}x{k}", "act": act, "grad_rel_err": errs, "tk_ms": t_tk, "torch_ms": t_torch})
        print(
            f"linear fwd+bwd {m}x{n}x{k} {act}: err {max(errs):.1e}  tunekit {t_tk:.3f} ms  torch {t_torch:.3f} ms "
            f"ratio {t_torch / t_tk:.2f}x"
        )
    record["gemm_autograd"] = rows


def norms() -> None:
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        LigerLayerNormFunction = LigerRMSNormFunction = None
    rows = []
    for kind in ("layernorm", "rmsnorm"):
        for m, n in ((8192, 5120), (4096, 5121), (16384, 1536), (8192, 2049)):
            x = (torch.randn(m, n, device="cuda") * 2 + 0.5).to(torch.bfloat16).requires_grad_()
            w = (1 + 0.1 * torch.randn(n, device="cuda")).to(torch.bfloat16).requires_grad_()
            b = (0.1 * torch.randn(n, device="cuda")).to(torch.bfloat16).requires_grad_()
            dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            leaves = (x, w, b) if kind == "layernorm" else (x, w)
            if kind == "layernorm":
                impls = {
                    "torch": lambda: F.layer_norm(x, (n,), w, b, 1e-5),
                    "tunekit": lambda: ops.layer_norm(x, (n,), w, b, 1e-5),
                }
                if LigerLayerNormFunction is not None:
                    impls["liger"] = lambda: LigerLayerNormFunction.apply(x, w, b, 1e-5)
            else:
                impls = {
                    "torch": lambda: F.rms_norm(x, (n,), w, 1e-6),
                    "tunekit": lambda: ops.rms_norm(x, (n,), w, 1e-6),
                }
                if LigerRMSNormFunction is not None:
                    impls["liger"] = lambda: LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", False)
            row: dict[str, object] = {"kind": kind, "shape": f"{m}x{n}"}
            for name, fn in impls.items():
                row[f"{name}_fwd"] = do_bench(lambda fn=fn: fn(), return_mode="median")
                row[f"{name}_fwdbwd"] = do_bench(
                    lambda fn=fn: torch.autograd.grad(fn(), leaves, dy), return_mode="median"
                )
            rows.append(row)
            liger = f" liger {row.get('liger_fwdbwd', float('nan')):.1f}"
            t, k = row["torch_fwdbwd"], row["tunekit_fwdbwd"]
            print(
                f"{kind} {m}x{n} fwd+bwd us: torch {t * 1e3:.1f} tunekit {k * 1e3:.1f}{liger} | vs torch {t / k:.2f}x"
                f" fwd vs torch {row['torch_fwd'] / row['tunekit_fwd']:.2f}x"
            )
    record["norms"] = rows


@triton.jit
def _empty(x_ptr, BLOCK: tl.constexpr):
    pass


def host_cost(calls: int = 3000) -> None:
    x16 = torch.randn(8, 1024, device="cuda", dtype=torch.float16)
    w16, b16 = (
        torch.randn(1024, device="cuda", dtype=torch.float16),
        torch.randn(1024, device="cuda", dtype=torch.float16),
    )
    lw = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
    cases = {
        "tunekit.ops.layer_norm": lambda: ops.layer_norm(x16, (1024,), w16, b16),
        "F.layer_norm": lambda: F.layer_norm(x16, (1024,), w16, b16),
        "tunekit.ops.rms_norm": lambda: ops.rms_norm(x16, (1024,), w16),
        "F.rms_norm": lambda: F.rms_norm(x16, (1024,), w16),
        "tunekit.ops.linear": lambda: ops.linear(x16, lw),
        "F.linear": lambda: F.linear(x16, lw),
        "tunekit.ops.softmax": lambda: ops.softmax(x16, -1),
        "torch.softmax": lambda: torch.softmax(x16, -1),
        "empty triton kernel": lambda: _empty[(1,)](x16, BLOCK=16),
    }
    from tunekit.evaluation.host_bench import per_call_us

    rows = {}
    for name, fn in cases.items():
        rows[name] = per_call_us(fn, calls)
        print(f"host {name:28s} {rows[name]:7.1f} us/call")
    record["host_us_per_call"] = rows


def op_ratios() -> None:
    """A Llama-7B-shaped layer's ops, eager, out of the box (whatever dispatch serves), against torch's op."""
    rows = []
    d, hidden, vocab = 4096, 11008, 32000
    for m in (4096, 8):
        x = torch.randn(m, d, device="cuda", dtype=torch.bfloat16)
        h = torch.randn(m, hidden, device="cuda", dtype=torch.bfloat16)
        w = (1 + 0.1 * torch.randn(d, device="cuda")).to(torch.bfloat16)
        cases = {
            f"rms_norm {m}x{d}": (lambda: ops.rms_norm(x, (d,), w, 1e-6), lambda: F.rms_norm(x, (d,), w, 1e-6)),
            f"softmax {m}x{d}": (lambda: ops.softmax(x, -1), lambda: torch.softmax(x, -1)),
        }
        for n, k, act in ((d, d, None), (hidden, d, "silu"), (d, hidden, None), (vocab, d, None)):
            wt = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
            a = x if k == d else h
            tf = {None: lambda t: t, "silu": F.silu}[act]
            cases[f"linear {m}x{n}x{k} {act or ''}"] = (
                lambda a=a, wt=wt, act=act: ops.linear(a, wt, None, act),
                lambda a=a, wt=wt, tf=tf: tf(F.linear(a, wt)),
            )
        for name, (tk, ref) in cases.items():
            t_tk, t_ref = do_bench(tk, return_mode="median"), do_bench(ref, return_mode="median")
            rows.append({"op": name, "tunekit_ms": t_tk, "torch_ms": t_ref, "ratio": t_ref / t_tk})
            print(f"op {name:32s} tunekit {t_tk * 1e3:8.1f} us  torch {t_ref * 1e3:8.1f} us  {t_ref / t_tk:5.2f}x")
    from tunekit.runtime.dispatch import _DISPATCHERS

    served = {k: dict(d.counters) for k, d in _DISPATCHERS.items() if d.counters}
    print("served by", served)
    record["op_ratios"] = {"rows": rows, "served": served}


def models() -> None:
    from tunekit.evaluation.model_bench import Workload, measure, table

    results = []
    compiled = ("compile", "tunekit+compile") if "--compile" in sys.argv else ()
    for model in ("llama", "gpt2"):
        variants = ("eager", "tunekit", *compiled) + (("liger",) if model == "llama" else ())
        results += measure(Workload(model), variants=variants, reps=10)
    record["models"] = [r.__dict__ for r in results]
    print(table(results))


if __name__ == "__main__":
    steps = [identities, gemm_autograd, norms, host_cost, op_ratios]
    if "--skip-models" not in sys.argv:
        steps.append(models)
    for step in steps:
        t0 = time.time()
        try:
            step()
        except Exception as exc:  # keep the other measurements of this device run
            print(f"{step.__name__} failed: {type(exc).__name__}: {exc}")
        print(f"[{step.__name__} {time.time() - t0:.0f} s]")
        (OUT / "session_probe.json").write_text(json.dumps(record, indent=1, default=str))
