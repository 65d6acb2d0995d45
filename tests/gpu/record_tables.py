"""Record exhaustive timing tables for a set of problems (the ranker's training and scoring data), within a time budget.

    python tests/gpu/record_tables.py --set h200-gemm --out $OUT --budget 540

Every valid config of each problem is compiled (a pool of processes), verified against the reference and timed
(CUDA events, L2 flushed, median; shorter repetitions than `tunekit record`'s default so a set fits a device call).
Tables are saved after each problem, so a run cut short keeps what it finished. The problems are chosen to spread
over what the model mis-ranks (skinny M, K >> N, N >> K, unaligned sizes, column-major operands, every epilogue);
the three held-out GEMM shapes (2048x6144x4096, 64x8192x8192, 1500^3) are deliberately not among them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.evaluation.record import merge_tables, record_table
from tunekit.evaluation.timing_table import load_tables, save_tables
from tunekit.kernels.gemm.problem import make_problem
from tunekit.kernels.reduction import reduction
from tunekit.kernels.row_softmax import softmax
from tunekit.tuning.bench import CudaEventTimer


def gemm(m: int, n: int, k: int, dtype: str = "bfloat16", **kw: Any) -> tuple[str, dict[str, Any]]:
    return "gemm", dict(make_problem(m, n, k, dtype, **kw))


def soft(m: int, n: int, dtype: str, log: bool = False) -> tuple[str, dict[str, Any]]:
    return "softmax", dict(softmax.problem((m, n), dtype, log))


def red(op: str, axis: str, shape: tuple[int, ...], dtype: str) -> tuple[str, dict[str, Any]]:
    return "reduction", dict(reduction.problem(op, axis, shape, dtype))


COL = {"b_layout": "col"}  # a Linear's weight [N, K] is a column-major B
SETS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "h200-gemm": [
        gemm(1, 4096, 4096, **COL),  # decode GEMV
        gemm(8, 11008, 4096, activation="silu", **COL),  # decode gate projection
        gemm(32, 4096, 11008, has_residual=True, **COL),  # skinny M, K >> N
        gemm(128, 14336, 4096, **COL),
        gemm(96, 3072, 768, activation="gelu", has_bias=True, **COL),
        gemm(4096, 1024, 16384),  # K >> N
        gemm(2048, 512, 8192, has_bias=True),
        gemm(1024, 16384, 1024, activation="relu", has_bias=True),  # N >> K
        gemm(8192, 8192, 256),  # short K
        gemm(777, 1531, 2001, activation="silu", has_bias=True),  # unaligned
        gemm(2049, 5121, 3073, has_residual=True),  # unaligned
        gemm(4096, 4096, 2048, a_layout="col"),
        gemm(8192, 2048, 4096, activation="silu", **COL),
        gemm(2048, 2048, 8192, a_layout="col", b_layout="col"),
        gemm(3072, 768, 3072, "float16", activation="gelu_tanh", has_bias=True, has_residual=True, **COL),
        gemm(512, 32000, 4096, **COL),  # LM head
        gemm(6144, 4096, 4096, **COL),
        gemm(1024, 1024, 1024, "float32"),
    ],
    "h200-rows": [
        soft(4096, 1024, "float16"),
        soft(1024, 32000, "bfloat16"),
        soft(16384, 128, "float32"),
        soft(8, 50257, "float16", log=True),
        soft(2048, 4097, "bfloat16"),
        soft(32768, 2048, "bfloat16", log=True),
        red("sum", "inner", (8192, 1024), "bfloat16"),
        red("max", "inner", (1024, 32768), "float16"),
        red("mean", "inner", (4096, 3001), "float32"),
        red("sum", "inner", (64, 65536), "float32"),
        # outer reductions have spaces of 1,000-6,000 configs; this one keeps the recording within a device call
        red("sum", "outer", (1, 100000, 3), "float32"),
        red("sum", "inner", (32768, 256), "float16"),
    ],
    "h100": [
        gemm(8, 4096, 4096, **COL),
        gemm(64, 11008, 4096, activation="silu", **COL),
        gemm(4096, 4096, 4096, activation="gelu", has_bias=True),
        gemm(1000, 3000, 2000, has_bias=True),
        gemm(4096, 1024, 8192, **COL),
        gemm(2049, 2049, 2049, has_residual=True),
        soft(4096, 1024, "float16"),
        soft(1024, 32000, "bfloat16"),
        soft(2048, 4097, "bfloat16"),
        red("sum", "inner", (8192, 1024), "bfloat16"),
        red("mean", "inner", (4096, 3001), "float32"),
        red("sum", "outer", (1, 100000, 3), "float32"),
    ],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", required=True, choices=sorted(SETS))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--budget", type=float, default=540.0, help="Start no new table after this many seconds.")
    parser.add_argument("--skip", type=int, default=0, help="Skip the set's first N problems (a resumed run).")
    parser.add_argument("--workers", type=int, default=14)
    args = parser.parse_args()
    started = time.perf_counter()
    label = fingerprint().label
    timer = CudaEventTimer(warmup_ms=10.0, rep_ms=40.0)
    summary = []
    for index, (kernel, problem) in enumerate(SETS[args.set]):
        if index < args.skip:
            continue
        if time.perf_counter() - started > args.budget:
            summary.append(f"{index:2d} {kernel} not recorded: past the budget")
            continue
        spec = get_spec(kernel)
        t0 = time.perf_counter()
        table = record_table(spec, problem, timer, workers=args.workers)
        path = args.out / "timings" / label / f"{kernel}.json.gz"
        old = load_tables(path) if path.exists() else []
        save_tables(path, merge_tables(old, [table]))
        ok = sorted(r.time_ms for r in table.ok_rows() if r.time_ms is not None) or [float("nan")]
        status = [r.status for r in table.rows]
        summary.append(
            f"{index:2d} {spec.describe_problem(problem)}: {len(status)} configs, ok {status.count('ok')}, "
            f"wrong {status.count('wrong')}, failed {status.count('failed')}, "
            f"best {ok[0]:.4f} ms, median {statistics.median(ok):.4f} ms, "
            f"{time.perf_counter() - t0:.0f} s"
        )
        print(summary[-1], flush=True)
    print(f"\n{label}: {args.set}, {time.perf_counter() - started:.0f} s")
    print("\n".join(summary))


if __name__ == "__main__":
    main()
