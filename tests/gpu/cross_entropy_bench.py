"""Fused cross entropy on a GPU: forward+backward of a causal LM's loss, N=4096 tokens x V=32000 (Llama vocab).

    TUNEKIT_UNTUNED=triton python tests/gpu/cross_entropy_bench.py --out DIR [--rows 4096] [--vocab 32000]

Methods, each a full forward+backward into the logits' gradient (bf16 logits, and fp32 logits):
- `transformers`: transformers' ForCausalLMLoss as written: logits.float(), then F.cross_entropy(ignore_index=-100,
  reduction mean), backward through the cast to the logits' dtype;
- `tunekit`: tunekit.ops.cross_entropy at the heuristic config (TUNEKIT_UNTUNED=triton, dispatch reset first);
- `liger`: Liger-Kernel's LigerCrossEntropyLoss, where importable.
Correctness first (loss and gradient against float64 torch, relative to the largest value); then
triton.testing.do_bench medians (ms) and peak memory allocated during one step beyond the logits. 12.5% of the
targets are ignore_index. Writes DIR/cross_entropy.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TUNEKIT_UNTUNED", "triton")

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import tunekit.ops as ops
from tunekit.runtime import dispatch

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def transformers_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), target, ignore_index=-100, reduction="mean")


def tunekit_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ops.cross_entropy(logits, target, ignore_index=-100, reduction="mean")


def methods() -> dict[str, Loss]:
    found: dict[str, Loss] = {"transformers": transformers_loss, "tunekit": tunekit_loss}
    try:
        from liger_kernel.transformers import LigerCrossEntropyLoss

        liger = LigerCrossEntropyLoss(ignore_index=-100, reduction="mean")
        found["liger"] = lambda logits, target: liger(logits, target)
    except Exception as exc:
        print(f"liger: not importable ({type(exc).__name__}: {exc})")
    return found


def inputs(rows: int, vocab: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(rows, vocab, generator=gen, device="cuda") * 3.0 + 2.0).to(dtype)
    target = torch.randint(0, vocab, (rows,), generator=gen, device="cuda")
    ignored = torch.rand(rows, generator=gen, device="cuda") < 0.125
    return logits, torch.where(ignored, torch.full_like(target, -100), target)


def step(loss_fn: Loss, logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    leaf = logits.detach().requires_grad_()
    loss = loss_fn(leaf, target)
    loss.backward()
    assert leaf.grad is not None
    return loss.detach(), leaf.grad


def errors(loss_fn: Loss, logits: torch.Tensor, target: torch.Tensor) -> dict[str, float]:
    x64 = logits.double().requires_grad_()
    want = F.cross_entropy(x64, target, ignore_index=-100)
    want.backward()
    assert x64.grad is not None
    loss, grad = step(loss_fn, logits, target)
    grad_error = (grad.double() - x64.grad).abs().max() / x64.grad.abs().max()
    return {"loss_rel": float((loss.double() - want).abs() / want.abs()), "grad_rel": float(grad_error)}


def measure(loss_fn: Loss, logits: torch.Tensor, target: torch.Tensor) -> dict[str, Any]:
    record: dict[str, Any] = errors(loss_fn, logits, target)
    ms = do_bench(lambda: step(loss_fn, logits, target), warmup=25, rep=200, return_mode="median")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step(loss_fn, logits, target)
    torch.cuda.synchronize()
    record.update(ms=ms, peak_extra_mib=(torch.cuda.max_memory_allocated() - base) / 2**20)
    return record


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    dispatch.reset_all()
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(), "rows": args.rows, "vocab": args.vocab}
    for dtype in (torch.bfloat16, torch.float32):
        logits, target = inputs(args.rows, args.vocab, dtype)
        for name, loss_fn in methods().items():
            key = f"{name}/{str(dtype).removeprefix('torch.')}"
            try:
                results[key] = measure(loss_fn, logits, target)
            except Exception:
                results[key] = {"error": traceback.format_exc()[-2000:]}
    results["served_by"] = {str(k): v for k, v in dispatch.dispatcher("cross_entropy").served_by.items()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cross_entropy.json").write_text(json.dumps(results, indent=2))
    print(f"{'method':<24} {'ms':>8} {'peak MiB':>9} {'loss rel':>9} {'grad rel':>9}")
    for key, r in results.items():
        if isinstance(r, dict) and "ms" in r:
            print(f"{key:<24} {r['ms']:8.3f} {r['peak_extra_mib']:9.1f} {r['loss_rel']:9.2e} {r['grad_rel']:9.2e}")
        elif isinstance(r, dict) and "error" in r:
            print(f"{key:<24} error: {r['error'].strip().splitlines()[-1]}")


if __name__ == "__main__":
    main()
