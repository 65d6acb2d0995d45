"""Which shipped entries make the patched eager decode step slower? A 2-layer decode step (8x1) of the model
benchmark's `--model` (default: Llama at 7B widths), patched against unpatched in alternation
(tests/gpu/ab_probe.py's pair), served by: every shipped entry, none, and
every shipped entry but one kernel's (one row per kernel with entries on this GPU). With each row, the dispatch
layers that served the patched step's problems.

    python tests/gpu/decode_entries_probe.py [--model gpt2] [--rounds 7] [--kernels gemm,layernorm] [--out DIR]

Prints the table last; JSON under --out (default $OUT).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from ab_probe import decode_pair, serve_shipped
from triton.testing import do_bench

from tunekit.core.device import fingerprint
from tunekit.runtime import dispatch, hotpath
from tunekit.store import database


def _layers() -> dict[str, dict[str, int]]:
    return {k: dict(Counter(d.served_by.values())) for k, d in dispatch._DISPATCHERS.items() if d.served_by}


def _hot_paths() -> dict[str, dict]:
    """Per op called in the step: replays, torch-direct calls, plans and refusals (why a signature has no plan)."""
    return {h.name: asdict(h.stats) for h in hotpath.ops() if h.stats.replays + h.stats.torch_direct + h.stats.watched}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--model", default="llama", help="the model benchmark's model (tunekit model-bench)")
    parser.add_argument("--kernels", default="", help="the kernels to leave out one at a time (default: every one)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    opts = parser.parse_args()
    every = database.shipped_entries()
    here = fingerprint().key
    kernels = sorted({k.kernel for k in every if k.device_key == here})
    variants = {"every entry": every, "no entry": {}}
    for kernel in opts.kernels.split(",") if opts.kernels else kernels:
        variants[f"all but {kernel}"] = {k: e for k, e in every.items() if k.kernel != kernel}
    ((patched_fn, eager_fn),) = decode_pair(opts.model).values()
    rows = []
    for name, entries in variants.items():
        serve_shipped(entries)
        for hot in hotpath.ops():
            hot.stats = hotpath.Stats()
        for _ in range(3):
            patched_fn(), eager_fn()
        ratios = []
        for _ in range(opts.rounds):
            a = do_bench(patched_fn, warmup=5, rep=20, return_mode="median")
            b = do_bench(eager_fn, warmup=5, rep=20, return_mode="median")
            ratios.append(b / a)
        rows.append({"variant": name, "ratio": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                     "layers": _layers(), "hot_paths": _hot_paths()})  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
    (opts.out / f"decode_entries_probe_{opts.model}.json").write_text(json.dumps(rows, indent=1))
    print(f"{'entries served':28} {'eager/patched':>13} {'min':>6} {'max':>6}")
    for r in rows:
        print(f"{r['variant']:28} {r['ratio']:13.3f} {r['min']:6.3f} {r['max']:6.3f}")


if __name__ == "__main__":
    main()
