"""What a served decode GEMM costs against torch's, and what the tuner scored for it. For each problem of a
held-out Llama-7B decode step (8 rows, bf16, weights [n, k] as nn.Linear holds them), with the shipped databases
served as installed:

- host loop: `tunekit.ops.linear(x, w)` and `F.linear(x, w)`, each as calls made back to back then one
  synchronize (what a host-bound eager step pays per call), in alternation for `--rounds` rounds;
- GPU: each op over a ring of weights larger than L2 (cold weights, as in a model), captured in a CUDA graph and
  replayed (no host cost in it);
- the tuner's scores for the problem: the served config as replayed (`as_called_eagerly`), torch's baseline on the
  bench inputs (alpha = 0.75, beta = 0.5: an extra scaling pass) and on the inputs linear passes (alpha = beta = 1).

    python tests/gpu/served_cost_probe.py [--rounds 5] [--out DIR]

Prints the table last; JSON under --out (default $OUT).
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

import tunekit.ops as ops
from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.evaluation.host_bench import per_call_us
from tunekit.kernels.gemm.problem import make_problem
from tunekit.runtime import dispatch
from tunekit.tuning.bench import CudaEventTimer
from tunekit.tuning.verify import as_called_eagerly

PROBLEMS = ((4096, 4096), (1024, 4096), (11008, 4096), (4096, 11008), (14336, 4096), (32000, 4096))


def graph_us(call: Callable[[torch.Tensor], object], weights: list[torch.Tensor], replays: int = 20) -> float:
    """Per call of `call` over the ring of weights, as CUDA-graph replays (GPU time, cold weights)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for w in weights:
            call(w)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            call(w)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / len(weights))
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    opts = parser.parse_args()
    spec, timer, rows, device = get_spec("gemm"), CudaEventTimer(), [], fingerprint()
    for n, k in PROBLEMS:
        x = torch.randn(8, k, device="cuda", dtype=torch.bfloat16)
        ring = max(2, (200 << 20) // (n * k * 2))  # over 200 MB of weights: none left in L2 between calls
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(ring)]
        w = weights[0]
        ops.linear(x, w), ops.linear(x, w), ops.linear(x, w)  # the full path, the watched call, a replay
        gemm = dispatch._DISPATCHERS.get("gemm")
        served = sorted(set(gemm.served_by.values())) if gemm is not None else []
        tk, th, ratios = [], [], []
        for _ in range(opts.rounds):
            a = per_call_us(lambda x=x, w=w: ops.linear(x, w), 200)
            b = per_call_us(lambda x=x, w=w: F.linear(x, w), 200)
            tk.append(a), th.append(b), ratios.append(b / a)
        gpu_tk = graph_us(lambda w, x=x: ops.linear(x, w), weights)
        gpu_torch = graph_us(lambda w, x=x: F.linear(x, w), weights)
        problem = make_problem(8, n, k, "bfloat16", b_layout="col")
        inputs = spec.make_inputs(problem, torch.device("cuda"), 0)
        ones = (*inputs[:5], 1.0, 1.0)
        resolution = dispatch.resolve(spec, problem, device, None)
        config = resolution.config if "implementation" not in resolution.config else spec.heuristic(problem, device)
        outputs = spec.alloc_outputs(inputs)
        rows.append({
            "n": n, "k": k, "served": served, "resolution": resolution.layer, "config": config, "ring": ring,
            "host_tunekit_us": statistics.median(tk), "host_torch_us": statistics.median(th),
            "host_ratio": statistics.median(ratios),
            "gpu_tunekit_us": gpu_tk, "gpu_torch_us": gpu_torch,
            "tuner_candidate_us": timer(as_called_eagerly(spec, config, inputs, outputs), config) * 1e3,
            "tuner_torch_scaled_us": timer(lambda i=inputs: spec.torch_baseline(i), {}) * 1e3,
            "tuner_torch_linear_us": timer(lambda i=ones: spec.torch_baseline(i), {}) * 1e3,
        })  # fmt: skip
        dispatch.reset_all()
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "served_cost_probe.json").write_text(json.dumps(rows, indent=1))
    print(
        "\n8 x n x k bf16 | served | host us: tunekit torch torch/tk | GPU us (graph, cold): tunekit torch | "
        "tuner us: candidate, torch scaled, torch as linear"
    )
    for r in rows:
        print(
            f"8x{r['n']}x{r['k']:<6} {','.join(r['served']):22} {r['host_tunekit_us']:6.1f} {r['host_torch_us']:6.1f} "
            f"{r['host_ratio']:5.2f} | {r['gpu_tunekit_us']:6.1f} {r['gpu_torch_us']:6.1f} | "
            f"{r['tuner_candidate_us']:6.1f} {r['tuner_torch_scaled_us']:6.1f} {r['tuner_torch_linear_us']:6.1f}"
        )


if __name__ == "__main__":
    main()
