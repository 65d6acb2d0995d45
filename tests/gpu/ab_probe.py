"""tunekit against torch with the order effects taken out: each pair is timed in alternation (A, B, A, B, ...),
`--rounds` times each with do_bench (L2 flushed, median), and the ratio is the median of the per-round ratios,
with its min and max. For checks where the two may be the same computation (a GPU with no tuned data, where
tunekit serves torch's op) and a difference would be an artefact of the order of measurement.

    python tests/gpu/ab_probe.py [--rounds 7] [--out DIR] [--decode-only] [--no-shipped]

--no-shipped: the process sees no shipped database (every op then serves torch, untuned): with and without, the
decode step's cost of tunekit's per-call path where the packs cover the widths, against where nothing does.

Rows: a Llama-7B layer's ops at 4096 and 8 rows (forward), the norms' and linear's forward+backward, and a
2-layer Llama's eager decode step (8 x 1 tokens, host-bound) unpatched against tunekit-patched.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import tunekit.ops as ops

Pair = tuple[Callable[[], object], Callable[[], object]]


def _rand(*shape: int, grad: bool = False) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16).requires_grad_(grad)


def op_pairs() -> dict[str, Pair]:
    d, hidden, vocab = 4096, 11008, 32000
    pairs: dict[str, Pair] = {}
    for m in (4096, 8):
        x, h, w = _rand(m, d), _rand(m, hidden), _rand(d)
        pairs[f"rms_norm {m}x{d}"] = (
            lambda x=x, w=w: ops.rms_norm(x, (d,), w, 1e-6),
            lambda x=x, w=w: F.rms_norm(x, (d,), w, 1e-6),
        )
        pairs[f"softmax {m}x{d}"] = (lambda x=x: ops.softmax(x, -1), lambda x=x: torch.softmax(x, -1))
        for n, k in ((d, d), (hidden, d), (d, hidden), (vocab, d)):
            a, wt = (x if k == d else h), _rand(n, k) / k**0.5
            pairs[f"linear {m}x{n}x{k}"] = (lambda a=a, wt=wt: ops.linear(a, wt), lambda a=a, wt=wt: F.linear(a, wt))
    for m, n in ((16384, 1536), (8192, 5120), (4096, 5121)):
        x, w, b, dy = _rand(m, n, grad=True), _rand(n, grad=True), _rand(n, grad=True), _rand(m, n)
        pairs[f"layer_norm fwd+bwd {m}x{n}"] = (
            lambda x=x, w=w, b=b, dy=dy, n=n: torch.autograd.grad(ops.layer_norm(x, (n,), w, b), (x, w, b), dy),
            lambda x=x, w=w, b=b, dy=dy, n=n: torch.autograd.grad(F.layer_norm(x, (n,), w, b), (x, w, b), dy),
        )
    x, wt, dy = _rand(4096, 4096, grad=True), (_rand(4096, 4096) / 64).requires_grad_(), _rand(4096, 4096)
    pairs["linear fwd+bwd 4096^3"] = (
        lambda: torch.autograd.grad(ops.linear(x, wt), (x, wt), dy),
        lambda: torch.autograd.grad(F.linear(x, wt), (x, wt), dy),
    )
    return pairs


def serve_shipped(entries: dict) -> None:
    """The process's shipped databases are `entries` from now on."""
    from tunekit.runtime import dispatch
    from tunekit.store import database

    database.read_shipped = lambda *_: dict(entries)  # type: ignore[assignment]
    database._shipped_by_scope.cache_clear()
    dispatch.reset_all()  # clears the shipped entries too


def decode_pair(model: str = "llama") -> dict[str, Pair]:
    from tunekit.evaluation.model_bench import Workload, _variant, build

    w = Workload(model)
    base = build(w, torch.device("cuda"), torch.bfloat16).eval()
    ids = torch.randint(0, w.vocab, w.decode, device="cuda")
    eager, _ = _variant(base, "eager", model)
    patched, _ = _variant(base, "tunekit", model)

    def step(model: torch.nn.Module) -> Callable[[], object]:
        def run() -> object:
            with torch.no_grad():
                return model(ids, use_cache=False).logits

        return run

    return {f"{model} decode 8x1 (2 layers)": (step(patched.eval()), step(eager.eval()))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    parser.add_argument("--decode-only", action="store_true")
    parser.add_argument("--no-shipped", action="store_true")
    opts = parser.parse_args()
    if opts.no_shipped:
        serve_shipped({})
    rows = []
    pairs = decode_pair() if opts.decode_only else {**op_pairs(), **decode_pair()}
    for name, (tunekit_fn, torch_fn) in pairs.items():
        tunekit_fn(), torch_fn()
        ratios, tk_ms, torch_ms = [], [], []
        for _ in range(opts.rounds):
            a = do_bench(tunekit_fn, warmup=5, rep=20, return_mode="median")
            b = do_bench(torch_fn, warmup=5, rep=20, return_mode="median")
            ratios.append(b / a)
            tk_ms.append(a)
            torch_ms.append(b)
        rows.append({"case": name, "ratio": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                     "tunekit_ms": statistics.median(tk_ms), "torch_ms": statistics.median(torch_ms)})  # fmt: skip
    tag = ("_decode" if opts.decode_only else "") + ("_no_shipped" if opts.no_shipped else "")
    (opts.out / f"ab_probe{tag}.json").write_text(json.dumps(rows, indent=1))
    print(f"{'case':34} {'tunekit us':>10} {'torch us':>9} {'torch/tk':>8} {'min':>6} {'max':>6}")
    for r in rows:
        print(
            f"{r['case']:34} {r['tunekit_ms'] * 1e3:10.1f} {r['torch_ms'] * 1e3:9.1f} {r['ratio']:8.3f} "
            f"{r['min']:6.3f} {r['max']:6.3f}"
        )


if __name__ == "__main__":
    main()
