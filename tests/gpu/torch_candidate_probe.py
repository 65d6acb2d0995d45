"""After tuning, is any tunekit GEMM slower than torch? Tune Linear-shaped problems (10 trials each, torch timed as a
candidate), then time `tunekit.ops.linear` as a user calls it against F.linear + the activation.

    python tests/gpu/torch_candidate_probe.py --trials 10

Each op is checked against torch first; times are CUDA events, L2 flushed, median (triton.testing.do_bench), so
they include the call's host work where it exceeds the flush.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton.testing

SHAPES = [  # (M, N, K, activation, bias): input [M, K], weight [N, K]
    (32, 5120, 13824, "silu", False),
    (64, 8192, 8192, "none", False),
    (2048, 6144, 4096, "none", False),
    (1500, 1500, 1500, "relu", True),
    (8, 4096, 4096, "none", False),
    (4096, 11008, 4096, "silu", False),
]
ACT = {"none": lambda x: x, "relu": F.relu, "silu": F.silu}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args()
    os.environ["TUNEKIT_CACHE_DIR"] = tempfile.mkdtemp()
    import tunekit.ops
    from tunekit.core.device import fingerprint
    from tunekit.core.registry import get_spec
    from tunekit.kernels.gemm.problem import make_problem
    from tunekit.runtime import dispatch
    from tunekit.store.store import Store
    from tunekit.tuning.orchestrate import TuneOptions, tune_and_store

    spec, device = get_spec("gemm"), fingerprint()
    rows: list[dict[str, Any]] = []
    for m, n, k, act, has_bias in SHAPES:
        problem = make_problem(m, n, k, "bfloat16", b_layout="col", activation=act, has_bias=has_bias)
        store = Store()
        try:
            entry, _ = tune_and_store(spec, problem, device, TuneOptions(trials=args.trials), store)
        finally:
            store.close()
        dispatch.reset_all()
        gen = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
        w = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).bfloat16()
        bias = torch.randn(n, device="cuda", generator=gen).bfloat16() if has_bias else None
        activation = None if act == "none" else act

        def ours(x=x, w=w, bias=bias, activation=activation) -> torch.Tensor:
            return tunekit.ops.linear(x, w, bias, activation=activation)

        def theirs(x=x, w=w, bias=bias, act=ACT[act]) -> torch.Tensor:
            return act(F.linear(x, w, bias))

        error = float((ours().float() - theirs().float()).abs().max())
        t_ours = triton.testing.do_bench(ours, return_mode="median")
        t_torch = triton.testing.do_bench(theirs, return_mode="median")
        served = sorted(set(dispatch.dispatcher("gemm").served_by.values()))
        rows.append(
            {
                "shape": f"{m}x{n}x{k} {act}{' +bias' if has_bias else ''}",
                "served": served,
                "entry_ms": entry.time_ms,
                "entry_torch_ms": entry.provenance.get("torch_ms"),
                "op_ms": t_ours,
                "torch_ms": t_torch,
                "max_abs_error": error,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    (Path(os.environ.get("OUT", ".")) / "torch_candidate.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{'shape':28s} {'served':18s} {'tuned/torch (tuner)':>20s} {'torch/op (eager)':>17s}")
    for r in rows:
        tuned = r["entry_torch_ms"] / r["entry_ms"] if r["entry_torch_ms"] else float("nan")
        print(f"{r['shape']:28s} {','.join(r['served']):18s} {tuned:19.2f}x {r['torch_ms'] / r['op_ms']:16.2f}x")


if __name__ == "__main__":
    main()
