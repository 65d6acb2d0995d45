"""Rotary position embedding on a GPU: torch's formula vs tunekit's rope kernels (heuristic config) vs Liger-Kernel.

    python tests/gpu/rope_bench.py [--out DIR] [--quick]

Per workload (Llama-like: B=4 S=1024 Hq=Hk=32 D=128 bf16 prefill, B=8 S=1 decode, GQA Hq=32 Hk=8, fp16), with q
and k built as attention builds them (proj(x).view(B, S, H, D).transpose(1, 2)) and cos, sin of Llama's rotary
embedding ([B, S, D], the input dtype):
1. correctness first: each method's q_embed, k_embed and the gradients of q and k against the formula in float64
   (a method that fails is reported and not timed);
2. forward, and forward+backward (gradients of the projections' outputs), timed with triton.testing.do_bench
   (L2 flushed between reps), median;
3. the fraction of copy bandwidth: the bytes a fused pass must move (q, k read and written, cos and sin read) over
   the time, against a torch.clone moving as many bytes (1.0 = as fast as a copy of the same bytes).
Methods: `torch` (transformers' apply_rotary_pos_emb, what a model runs without tunekit), `tunekit`
(tunekit.ops.rotary_embedding with TUNEKIT_UNTUNED=triton: the kernels at their heuristic config), `liger`
(liger_kernel.transformers.rope.liger_rotary_pos_emb, when installed; it rotates in place into q's and k's storage
where their layout allows, so its inputs are fresh clones for the check).

Writes DIR/rope_bench.json (DIR: --out, else $OUT, else .) and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import triton
from triton.testing import do_bench

import tunekit.ops as ops
from tunekit.core.device import fingerprint
from tunekit.kernels.rope.rope import apply_rotary  # transformers' formula, op for op
from tunekit.runtime import dispatch

# (name, B, S, Hq, Hk, D, dtype)
WORKLOADS = [
    ("prefill", 4, 1024, 32, 32, 128, "bfloat16"),
    ("decode", 8, 1, 32, 32, 128, "bfloat16"),
    ("prefill-gqa", 4, 1024, 32, 8, 128, "bfloat16"),
    ("decode-gqa", 8, 1, 32, 8, 128, "bfloat16"),
    ("prefill-fp16", 4, 1024, 32, 32, 128, "float16"),
    ("train-8k", 8, 2048, 32, 8, 128, "bfloat16"),
]
QUICK = ["prefill", "decode", "prefill-gqa"]
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
TOL = {"bfloat16": 1.6e-2, "float16": 2e-3, "float32": 1e-5}  # relative to each tensor's max |value|

Rotary = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _liger() -> Rotary | None:
    try:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
    except ImportError:
        return None
    return lambda q, k, cos, sin: liger_rotary_pos_emb(q, k, cos, sin)


def _methods() -> dict[str, Rotary | None]:
    return {
        "torch": lambda q, k, cos, sin: apply_rotary(q, k, cos, sin, 1),
        "tunekit": lambda q, k, cos, sin: ops.rotary_embedding(q, k, cos, sin, 1),
        "liger": _liger(),
    }


def _ms(fn: Callable[[], object]) -> float:
    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def _inputs(b: int, s: int, hq: int, hk: int, d: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Projection outputs [B, S, H * D] (q and k are their transposed views), Llama's cos and sin, upstream grads."""
    gen = torch.Generator(device="cuda").manual_seed(b * 1000 + s + hk)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, device="cuda", dtype=torch.float32) / d))
    positions = torch.arange(s, device="cuda", dtype=torch.float32)[None, :].expand(b, s)
    emb = torch.cat((positions[..., None] * inv_freq,) * 2, dim=-1)
    return {
        "q_proj": torch.randn(b, s, hq * d, device="cuda", generator=gen).to(dtype),
        "k_proj": torch.randn(b, s, hk * d, device="cuda", generator=gen).to(dtype),
        "cos": emb.cos().to(dtype),
        "sin": emb.sin().to(dtype),
        "gq": torch.randn(b, hq, s, d, device="cuda", generator=gen).to(dtype),
        "gk": torch.randn(b, hk, s, d, device="cuda", generator=gen).to(dtype),
    }


def _heads(proj: torch.Tensor, d: int) -> torch.Tensor:
    b, s, width = proj.shape
    return proj.view(b, s, width // d, d).transpose(1, 2)


def _run(fn: Rotary, t: dict[str, torch.Tensor], d: int, grads: bool) -> tuple[torch.Tensor, ...]:
    """q_embed, k_embed and, with `grads`, the gradients of the projections (leaves) for gq, gk."""
    q_proj, k_proj = (t[n].detach().clone().requires_grad_(grads) for n in ("q_proj", "k_proj"))
    outs = fn(_heads(q_proj, d), _heads(k_proj, d), t["cos"], t["sin"])
    if not grads:
        return tuple(outs)
    return (*outs, *torch.autograd.grad(outs, (q_proj, k_proj), (t["gq"], t["gk"])))


def _check(fn: Rotary, t: dict[str, torch.Tensor], d: int, dtype: str) -> float:
    """The largest relative error of q_embed, k_embed, dq, dk against float64; raises past the tolerance."""
    t64 = {n: v.double() for n, v in t.items()}
    want = _run(lambda q, k, c, s: apply_rotary(q, k, c, s, 1), t64, d, grads=True)
    got = _run(fn, t, d, grads=True)
    errors = [float((g.double() - w).abs().max() / w.abs().max().clamp_min(1e-6)) for g, w in zip(got, want)]
    if max(errors) > TOL[dtype]:
        raise AssertionError(f"relative errors {[f'{e:.2e}' for e in errors]} over {TOL[dtype]}")
    return max(errors)


def _timings(fn: Rotary, t: dict[str, torch.Tensor], d: int) -> dict[str, float]:
    q, k = _heads(t["q_proj"], d), _heads(t["k_proj"], d)
    q_proj, k_proj = (t[n].detach().clone().requires_grad_() for n in ("q_proj", "k_proj"))

    def train() -> None:
        outs = fn(_heads(q_proj, d), _heads(k_proj, d), t["cos"], t["sin"])
        torch.autograd.grad(outs, (q_proj, k_proj), (t["gq"], t["gk"]))

    with torch.no_grad():
        forward = _ms(lambda: fn(q, k, t["cos"], t["sin"]))
    return {"forward_ms": forward, "forward_backward_ms": _ms(train)}


def _copy_ms(nbytes: int) -> float:
    """A clone moving `nbytes` (half read, half written)."""
    src = torch.empty(max(1, nbytes // 2), dtype=torch.uint8, device="cuda")
    return _ms(lambda: src.clone())


def _workload(name: str, b: int, s: int, hq: int, hk: int, d: int, dtype: str) -> dict[str, Any]:
    t = _inputs(b, s, hq, hk, d, DTYPES[dtype])
    size = t["cos"].element_size()
    # one fused pass: q and k read and written, cos and sin read once
    pass_bytes = (2 * (hq + hk) * b * s * d + 2 * b * s * d) * size
    copy_ms = _copy_ms(pass_bytes)
    row: dict[str, Any] = {"workload": name, "B": b, "S": s, "Hq": hq, "Hk": hk, "D": d, "dtype": dtype}
    row.update(pass_bytes=pass_bytes, copy_ms=copy_ms, methods={})
    for method, fn in _methods().items():
        if fn is None:
            row["methods"][method] = {"skipped": "not installed"}
            continue
        try:
            error = _check(fn, t, d, dtype)
            timing = _timings(fn, t, d)
        except Exception as exc:  # a method that fails is reported, the run goes on
            row["methods"][method] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
            continue
        timing["copy_fraction_forward"] = copy_ms / timing["forward_ms"]
        timing["copy_fraction_forward_backward"] = 2 * copy_ms / timing["forward_backward_ms"]
        row["methods"][method] = {"max_relative_error": error, **timing}
    row["tunekit_served"] = {  # which dispatch layer served each problem key (heuristic, expected here)
        k: {",".join(map(str, key)): layer for key, layer in dispatch.dispatcher(k).served_by.items()}
        for k in ("rope", "rope_backward")
    }
    return row


def _table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'workload':<14}{'method':<9}{'fwd ms':>9}{'fwd x torch':>12}{'fwd/copy':>9}"
        f"{'f+b ms':>9}{'f+b x torch':>12}{'f+b/copy':>9}"
    ]
    for row in rows:
        base = row["methods"].get("torch", {})
        for method, m in row["methods"].items():
            if "forward_ms" not in m:
                lines.append(f"{row['workload']:<14}{method:<9}  {m.get('skipped') or m.get('error', '')[:80]}")
                continue
            fwd_x = base.get("forward_ms", float("nan")) / m["forward_ms"]
            fb_x = base.get("forward_backward_ms", float("nan")) / m["forward_backward_ms"]
            lines.append(
                f"{row['workload']:<14}{method:<9}{m['forward_ms']:>9.4f}{fwd_x:>12.2f}"
                f"{m['copy_fraction_forward']:>9.2f}{m['forward_backward_ms']:>9.4f}{fb_x:>12.2f}"
                f"{m['copy_fraction_forward_backward']:>9.2f}"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--quick", action="store_true", help=f"only {QUICK}")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("rope_bench needs a CUDA GPU")
    os.environ["TUNEKIT_UNTUNED"] = "triton"  # untuned problems run the kernels (their heuristic), not torch
    dispatch.reset_all()
    rows = []
    for workload in WORKLOADS:
        if args.quick and workload[0] not in QUICK:
            continue
        try:
            rows.append(_workload(*workload))
        except Exception as exc:
            rows.append({"workload": workload[0], "error": repr(exc), "trace": traceback.format_exc()[-2000:]})
        print(f"done {workload[0]}", flush=True)
    doc = {
        "device": fingerprint().to_json(),
        "versions": {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version()},
        "liger": _liger() is not None,
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rope_bench.json").write_text(json.dumps(doc, indent=1))
    print(_table([r for r in rows if "methods" in r]))
    for r in rows:
        if "error" in r:
            print(f"{r['workload']}: {r['error']}")


if __name__ == "__main__":
    main()
