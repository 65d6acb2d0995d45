"""The staged GEMM variant and Hopper warp specialization on the H200: each implementation checked against fp32,
then timed (tunekit.tuning.bench's timer: CUDA events, L2 flushed, median; wall-clock in the interpreter).

Per bf16 shape (bias + GELU is the tanh form, which cuBLASLt fuses): tunekit.ops.matmul as dispatched; `staged`
(copies of the unaligned operands included) with a few tiles where the sizes leave rows unaligned; the `tma`
kernel with and without WARP_SPECIALIZE where they do not (Triton 3.6 only specializes with 4 warps: it runs one
TMA warp group and two MMA warp groups, 384 threads); cuBLASLt's fused epilogue and torch eager. Prints one table
last and writes $OUT/gemm_staged_probe.json when OUT is set.

    python tests/gpu/gemm_staged_probe.py            # the H200 shapes
    python tests/gpu/gemm_staged_probe.py --smoke    # small shapes, any machine (the interpreter without a GPU)
"""

from __future__ import annotations

# First: it sets TRITON_INTERPRET when there is no GPU, and triton reads that when it is imported.
from tunekit.core import backend

# isort: split

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

import torch
import triton

from tunekit.core.device import fingerprint
from tunekit.core.spec import Inputs
from tunekit.evaluation.suite import cublaslt_runner, gemm_program
from tunekit.kernels import gemm as G
from tunekit.ops import matmul
from tunekit.runtime.dispatch import dispatcher
from tunekit.tuning.bench import default_timer

# (M, N, K, activation, bias)
SHAPES = ((2053, 2053, 2053, "gelu_tanh", True), (3000, 3000, 3000, "gelu_tanh", True),
          (4096, 4096, 4096, "none", False), (8192, 8192, 8192, "gelu_tanh", True))  # fmt: skip
SMOKE_SHAPES = ((37, 45, 53, "gelu_tanh", True), (48, 40, 64, "gelu_tanh", True), (64, 64, 64, "none", False))
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
STAGED_TILES = ((128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (64, 128, 64, 4, 4))
# ... + WARP_SPECIALIZE. 128x256x64 w8 s3 is the recorded best tma tile on 4096^3; 8 warps never specialize.
TMA_TILES = ((128, 256, 64, 8, 3, False), (128, 128, 64, 4, 3, False), (128, 128, 64, 4, 3, True),
             (128, 256, 64, 4, 3, True), (128, 128, 64, 4, 4, True))  # fmt: skip
SMOKE_STAGED_TILES = ((32, 32, 32, 4, 3),)
SMOKE_TMA_TILES = ((32, 32, 32, 4, 3, False), (32, 32, 32, 4, 3, True))
# What a kernel failure looks like: recorded as that row's outcome, the other rows still run.
KERNEL_ERRORS = (RuntimeError, triton.runtime.errors.OutOfResources, triton.compiler.errors.CompilationError)


def config(variant: str, bm: int, bn: int, bk: int, warps: int, stages: int, ws: bool = False) -> dict[str, Any]:
    cfg = {"variant": variant, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "SPLIT_K": 1,
           "num_warps": warps, "num_stages": stages}  # fmt: skip
    return dict(cfg, WARP_SPECIALIZE=True) if ws else cfg


def launcher(cfg: dict[str, Any], inputs: Inputs) -> Callable[[], torch.Tensor]:
    (out,) = G.alloc_outputs(inputs)

    def run() -> torch.Tensor:
        G.launch(cfg, inputs, (out,))
        return out

    return run


def implementations(
    inputs: Inputs, aligned: bool, staged_tiles: tuple, tma_tiles: tuple
) -> dict[str, Callable[[], Any] | str]:
    """name -> runner, or why it does not apply."""
    a, b, bias, residual, activation = inputs[:5]
    runs: dict[str, Callable[[], Any] | str] = {
        "tunekit dispatch": lambda: matmul(a, b, bias=bias, activation=activation, residual=residual),
    }
    if not aligned:  # the space offers staged only here; on aligned sizes it is tma with nothing to copy
        for bm, bn, bk, warps, stages in staged_tiles:
            runs[f"staged {bm}x{bn}x{bk} w{warps} s{stages}"] = launcher(
                config("staged", bm, bn, bk, warps, stages), inputs
            )
    else:
        for bm, bn, bk, warps, stages, ws in tma_tiles:
            name = f"tma {bm}x{bn}x{bk} w{warps} s{stages}" + (" WS" if ws else "")
            runs[name] = launcher(config("tma", bm, bn, bk, warps, stages, ws), inputs)
    runs["cuBLASLt"] = cublaslt_runner(inputs)
    program = gemm_program(inputs)
    runs["torch eager"] = lambda: program.fn(*program.args)
    return runs


def measure(
    shape: tuple, device: torch.device, staged_tiles: tuple, tma_tiles: tuple, only: str = ""
) -> list[dict[str, Any]]:
    m, n, k, activation, has_bias = shape
    problem = G.make_problem(m, n, k, "bfloat16", activation=activation, has_bias=has_bias)
    a, b, bias, residual, act = G.make_inputs(problem, device, seed=0)[:5]
    inputs: Inputs = (a, b, bias, residual, act, 1.0, 1.0)  # alpha = beta = 1: what cuBLASLt and eager compute
    want = G.epilogue_reference(a.float() @ b.float(), bias, residual, act, 1.0, 1.0)
    tol = G.SPEC.tolerances["bfloat16"]
    label = f"{m}x{n}x{k} {'bias+gelu' if has_bias else activation}"
    timer = default_timer()
    rows = []
    for name, run in implementations(inputs, bool(problem["aligned16"]), staged_tiles, tma_tiles).items():
        if only not in name:
            continue
        row: dict[str, Any] = {"problem": label, "implementation": name, "check": "-", "ms": None, "tflops": None}
        rows.append(row)
        if isinstance(run, str):
            row["check"] = f"n/a: {run}"
            continue
        try:
            # Said before and after the first launch (compiled by then) and its end: a run cut short by a time
            # limit shows whether compiling or running hung.
            print(f"{label} {name}: compiling and launching", flush=True)
            out = run()
            print(f"{label} {name}: launched", flush=True)
            got = out.float()
            if device.type == "cuda":
                torch.cuda.synchronize()
        except KERNEL_ERRORS as exc:
            row["check"] = f"error: {str(exc).splitlines()[0][:120]}"
            continue
        err = (got - want).abs().max().item()
        if not torch.allclose(got, want, atol=tol.atol, rtol=tol.rtol):
            row["check"] = f"WRONG (max error {err:.3g})"
            continue
        row["check"] = "ok"
        row["ms"] = timer(run, {})
        row["tflops"] = round(2 * m * n * k / row["ms"] / 1e9, 1)
        print(json.dumps(row), flush=True)
    # Which config the dispatch chain served (shipped database, nearest tuned problem or heuristic).
    served = dispatcher("gemm").memo.items()
    cfg = next((c for key, c in served if G.SPEC.problem_dict(key) == problem), None)
    if cfg is not None:
        rows[0]["config"] = cfg
        tile = "{variant} {BLOCK_M}x{BLOCK_N}x{BLOCK_K} w{num_warps} s{num_stages}".format(**cfg)
        rows[0]["implementation"] += f" ({tile})"
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="small shapes and tiles (the interpreter's)")
    parser.add_argument("--only", default="", help="only implementations whose name contains this (e.g. WS)")
    parser.add_argument("--shape", type=int, action="append", help="only these SHAPES (0-based index, repeatable)")
    args = parser.parse_args()
    smoke = args.smoke
    if not smoke and backend.INTERPRETED:
        parser.error("no GPU: run with --smoke")
    device = backend.torch_device()
    shapes, staged_tiles, tma_tiles = (
        (SMOKE_SHAPES, SMOKE_STAGED_TILES, SMOKE_TMA_TILES) if smoke else (SHAPES, STAGED_TILES, TMA_TILES)
    )
    shapes = tuple(shapes[i] for i in args.shape) if args.shape else shapes
    rows = [row for shape in shapes for row in measure(shape, device, staged_tiles, tma_tiles, args.only)]
    print("| problem | implementation | check | ms | TFLOP/s |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        ms = f"{r['ms']:.4f}" if r["ms"] is not None else "-"
        rate = r["tflops"] if r["tflops"] is not None else "-"
        print(f"| {r['problem']} | {r['implementation']} | {r['check']} | {ms} | {rate} |")
    out = os.environ.get("OUT")
    if out:
        result = {"device": fingerprint().to_json(), "timer": default_timer().label, "rows": rows}
        with open(os.path.join(out, "gemm_staged_probe.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
