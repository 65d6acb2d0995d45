"""LayerNorm / RMSNorm backward on a GPU: correctness, a small config sweep, bandwidth, and forward+backward
against torch eager, torch.compile and Liger-Kernel.

    python tests/gpu/norm_backward_bench.py --out DIR [--quick] [--shapes 16384x1536,8192x5120]

Per shape and norm: (1) dx, dweight, dbias of the heuristic config against torch's float64 autograd; (2) the
backward alone (both launches: main kernel and partial sums) for the heuristic and at most 40 configs around it
(ROWS × PROGRAMS_PER_SM × num_warps × variant, kept to what the space's rules allow); (3) forward+backward end to
end, timed twice: eager as a user calls it (host cost included where the GPU waits for it) and as a CUDA graph
(GPU time alone). Methods: `tunekit` (the forward kernel + this backward, heuristic configs, in a
torch.autograd.Function), `ops` (tunekit.ops as dispatch serves it: run with TUNEKIT_UNTUNED=triton to get the
heuristic for untuned problems), torch eager, torch.compile of the eager function, Liger-Kernel's functions; (4)
the backward's bandwidth over minimal bytes (x, dy, w read; dx written) and against a device copy (clone) moving
as many bytes. Timing: triton.testing.do_bench (L2 flushed between reps), median. Data: random normal.

Writes DIR/norm_backward.json (every number, errors per shape) and prints a table last. No interaction; a shape
that fails records its error and the run goes on.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench

from tunekit.core.device import fingerprint
from tunekit.kernels.norms import layernorm as ln_fwd
from tunekit.kernels.norms import layernorm_backward as ln_bwd
from tunekit.kernels.norms import rmsnorm as rms_fwd
from tunekit.kernels.norms import rmsnorm_backward as rms_bwd
from tunekit.search_spaces.norms.layernorm_backward import SPACE

# (M, N, dtype): N over 1535-8192 with 2^k ± 1, M×N of 16-64 M elements; one fp16 shape.
SHAPES: list[tuple[int, int, str]] = [
    (16384, 1535, "bfloat16"),
    (16384, 1536, "bfloat16"),
    (16384, 2048, "bfloat16"),
    (8192, 2049, "bfloat16"),
    (8192, 4096, "bfloat16"),
    (8192, 4097, "bfloat16"),
    (8192, 5120, "bfloat16"),
    (4096, 5121, "bfloat16"),
    (4096, 8191, "bfloat16"),
    (4096, 8192, "bfloat16"),
    (16384, 1536, "float16"),
]
QUICK_SHAPES = [(16384, 1536, "bfloat16"), (4096, 5121, "bfloat16")]
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
MAX_SWEEP = 40
TOL = {"bfloat16": 3e-2, "float16": 1e-2, "float32": 1e-4}  # relative to each gradient's max |value|


def _ms(fn: Callable[[], object]) -> float:
    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


# --- correctness -------------------------------------------------------------------------------------------


def _inputs(m: int, n: int, dtype: torch.dtype, rms: bool) -> dict[str, Any]:
    gen = torch.Generator(device="cuda").manual_seed(m * 100003 + n)
    x = (torch.randn(m, n, device="cuda", generator=gen) * 2 + 0.5).to(dtype)
    dy = torch.randn(m, n, device="cuda", generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(n, device="cuda", generator=gen)).to(dtype)
    b = None if rms else (0.1 * torch.randn(n, device="cuda", generator=gen)).to(dtype)
    eps = 1e-6 if rms else 1e-5
    return {"x": x, "dy": dy, "w": w, "b": b, "eps": eps, "rms": rms}


def _bwd_inputs(d: dict[str, Any]) -> tuple[Any, ...]:
    if d["rms"]:
        return (d["x"], d["dy"], d["w"], True, d["eps"])
    return (d["x"], d["dy"], d["w"], True, True, d["eps"])


def _spec(rms: bool) -> Any:
    return rms_bwd if rms else ln_bwd


def _problem(d: dict[str, Any]) -> dict[str, Any]:
    m, n = d["x"].shape
    return _spec(d["rms"]).problem_from_shape((m, n), str(d["x"].dtype).removeprefix("torch."))


def _check(config: dict[str, Any], d: dict[str, Any]) -> dict[str, float]:
    """Max error of each gradient relative to its max |value|, against torch's float64 autograd."""
    spec, inputs = _spec(d["rms"]), _bwd_inputs(d)
    outputs = spec.alloc_outputs(inputs)
    spec.launch(config, inputs, outputs)
    expected = spec.reference(inputs)
    names = ("dx", "dw", "db")
    errors = {}
    for name, got, want in zip(names, outputs, expected):
        scale = float(want.double().abs().max()) or 1.0
        errors[name] = float((got.double() - want.double()).abs().max()) / scale
    again = spec.alloc_outputs(inputs)
    spec.launch(config, inputs, again)
    errors["bitwise_repeatable"] = float(all(torch.equal(a, b) for a, b in zip(outputs, again)))
    return errors


# --- backward sweep ----------------------------------------------------------------------------------------


def _sweep_configs(heuristic: dict[str, Any], problem: dict[str, Any]) -> list[dict[str, Any]]:
    """The heuristic first, then ROWS × PROGRAMS_PER_SM × num_warps (× variant) near it that the rules allow."""
    device = fingerprint()
    out = [heuristic]
    variants = [(heuristic["variant"], heuristic["BLOCK_N"], rows) for rows in (1, 2, 4)]
    cols = int(problem["cols"])
    if heuristic["variant"] == "single" and cols > 2048:
        variants.append(("looped", 2048 if cols > 4096 else 1024, 1))
    for variant, block_n, rows in variants:
        for per_sm in (1, 2, 4, 8):
            for warps in (2, 4, 8, 16, 32):
                c = {**heuristic, "variant": variant, "BLOCK_N": block_n, "ROWS": rows}
                c.update(PROGRAMS_PER_SM=per_sm, num_warps=warps)
                if c not in out and SPACE.is_valid(c, problem, device):
                    out.append(c)
    return out[:MAX_SWEEP]


def _time_backward(config: dict[str, Any], d: dict[str, Any]) -> float:
    spec, inputs = _spec(d["rms"]), _bwd_inputs(d)
    outputs = spec.alloc_outputs(inputs)
    return _ms(lambda: spec.launch(config, inputs, outputs))


def _minimal_bytes(d: dict[str, Any]) -> int:
    m, n = d["x"].shape
    e = d["x"].element_size()
    return 3 * m * n * e + n * e  # x, dy read, dx written; the weight read (dw, db writes are O(N))


def _copy_ms(nbytes: int) -> float:
    src = torch.empty(nbytes // 4, dtype=torch.bfloat16, device="cuda").normal_()
    return _ms(lambda: src.clone())  # nbytes/2 bytes read and nbytes/2 written: nbytes moved


# --- forward + backward ------------------------------------------------------------------------------------


class _Tunekit(torch.autograd.Function):
    """tunekit's forward kernel (its heuristic config) and this backward (its heuristic config)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float, rms: bool):
        y = torch.empty_like(x)
        fwd = rms_fwd if rms else ln_fwd
        inputs = (x, w, eps) if rms else (x, w, b, eps)
        fwd.launch(ctx_config(fwd, fwd.key_of(inputs), x), inputs, (y,))
        ctx.save_for_backward(x, w)
        ctx.eps, ctx.rms, ctx.has_b = eps, rms, b is not None
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor):
        x, w = ctx.saved_tensors
        d = {"x": x, "dy": dy.contiguous(), "w": w, "eps": ctx.eps, "rms": ctx.rms}
        spec, inputs = _spec(ctx.rms), _bwd_inputs(d)
        outputs = spec.alloc_outputs(inputs)
        spec.launch(ctx_config(spec, spec.key_of(inputs), x), inputs, outputs)
        db = outputs[2] if ctx.has_b else None
        return outputs[0], outputs[1], db, None, None


_CONFIGS: dict[tuple[Any, ...], dict[str, Any]] = {}


def ctx_config(module: Any, key: tuple[Any, ...], x: torch.Tensor) -> dict[str, Any]:
    """The module's heuristic for the key, computed once (a user without a tuned entry gets it)."""
    full = (module.__name__, *key)
    if full not in _CONFIGS:
        m, n = x.shape
        problem = module.problem_from_shape((m, n), str(x.dtype).removeprefix("torch."))
        _CONFIGS[full] = module.heuristic(problem, fingerprint())
    return _CONFIGS[full]


def _eager(rms: bool) -> Callable[..., torch.Tensor]:
    if rms:
        return lambda x, w, b, eps: F.rms_norm(x, (x.shape[-1],), w, eps)
    return lambda x, w, b, eps: F.layer_norm(x, (x.shape[-1],), w, b, eps)


def _liger(rms: bool) -> Callable[..., torch.Tensor] | None:
    try:
        if rms:
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction

            # offset 0, llama casting, not in place: dy is reused across reps
            return lambda x, w, b, eps: LigerRMSNormFunction.apply(x, w, eps, 0.0, "llama", False)
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction

        return lambda x, w, b, eps: LigerLayerNormFunction.apply(x, w, b, eps)
    except Exception:  # absent or an incompatible version: its column stays empty
        return None


def _fwd_bwd_step(fn: Callable[..., torch.Tensor], d: dict[str, Any]) -> Callable[[], None]:
    x = d["x"].detach().requires_grad_()
    w = d["w"].detach().requires_grad_()
    b = None if d["b"] is None else d["b"].detach().requires_grad_()
    leaves = [t for t in (x, w, b) if t is not None]

    def step() -> None:
        y = fn(x, w, b, d["eps"])
        torch.autograd.grad(y, leaves, d["dy"])

    return step


def _fwd_bwd_ms(fn: Callable[..., torch.Tensor], d: dict[str, Any]) -> float:
    """Eager, as a user calls it: host time counts where the GPU waits for it."""
    return _ms(_fwd_bwd_step(fn, d))


def _fwd_bwd_graph_ms(fn: Callable[..., torch.Tensor], d: dict[str, Any]) -> float:
    """The same step captured once in a CUDA graph and replayed: GPU time alone, no host cost."""
    step = _fwd_bwd_step(fn, d)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return _ms(graph.replay)


def _methods(rms: bool) -> dict[str, Callable[..., torch.Tensor] | None]:
    eager = _eager(rms)
    import tunekit.ops as ops

    def user_path(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, eps: float) -> torch.Tensor:
        if rms:
            return ops.rms_norm(x, (x.shape[-1],), w, eps)
        return ops.layer_norm(x, (x.shape[-1],), w, b, eps)

    return {
        "tunekit": lambda x, w, b, eps: _Tunekit.apply(x, w, b, eps, rms),
        "ops": user_path,
        "torch": eager,
        "compile": torch.compile(eager, dynamic=False),
        "liger": _liger(rms),
    }


# --- one shape ---------------------------------------------------------------------------------------------


def _bench_shape(m: int, n: int, dtype: str, rms: bool, methods: dict[str, Any]) -> dict[str, Any]:
    d = _inputs(m, n, DTYPES[dtype], rms)
    problem = _problem(d)
    heuristic = _spec(rms).heuristic(problem, fingerprint())
    row: dict[str, Any] = {"norm": "rmsnorm" if rms else "layernorm", "shape": f"{m}x{n}", "dtype": dtype}
    row["heuristic"] = heuristic
    row["errors"] = errors = _check(heuristic, d)
    row["correct"] = max(errors.get(k, 0.0) for k in ("dx", "dw", "db")) <= TOL[dtype]
    row["sweep"] = sweep = []
    for config in _sweep_configs(heuristic, problem):
        try:
            sweep.append({"config": config, "ms": _time_backward(config, d)})
        except Exception as exc:  # a config that fails to compile or launch: recorded, the sweep goes on
            sweep.append({"config": config, "error": repr(exc)[:300]})
    timed = [s for s in sweep if "ms" in s]
    best = min(timed, key=lambda s: s["ms"])
    row["bwd_heuristic_ms"], row["bwd_best_ms"], row["bwd_best_config"] = timed[0]["ms"], best["ms"], best["config"]
    row["best_errors"] = _check(best["config"], d)
    nbytes = _minimal_bytes(d)
    row["copy_ms"] = _copy_ms(nbytes)
    row["bwd_gbps"] = nbytes / (best["ms"] * 1e-3) / 1e9
    row["bwd_heuristic_gbps"] = nbytes / (timed[0]["ms"] * 1e-3) / 1e9
    row["copy_gbps"] = nbytes / (row["copy_ms"] * 1e-3) / 1e9
    row["fwd_bwd_ms"], row["fwd_bwd_graph_ms"] = {}, {}
    for name, fn in methods.items():
        if fn is None:
            continue
        for key, timer in (("fwd_bwd_ms", _fwd_bwd_ms), ("fwd_bwd_graph_ms", _fwd_bwd_graph_ms)):
            try:
                row[key][name] = timer(fn, d)
            except Exception as exc:
                row.setdefault("method_errors", {})[f"{key}/{name}"] = repr(exc)[:300]
    return row


def _ratio(row: dict[str, Any], timing: str, other: str, ours: str) -> str:
    t = row.get(timing, {})
    return f"{t[other] / t[ours]:.2f}" if other in t and ours in t else "-"


def _table(rows: list[dict[str, Any]]) -> str:
    head = f"{'norm':9} {'shape':11} {'dtype':8} {'ok':3} {'bwd GB/s':>8} {'of copy':>7} {'heur/best':>9}"
    head += "  eager: torch compile liger  graphs: torch compile liger"
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['norm']:9} {r['shape']:11} {r['dtype']:8} ERROR {r['error'][:80]}")
            continue
        eager = " ".join(f"{_ratio(r, 'fwd_bwd_ms', o, 'ops'):>5}" for o in ("torch", "compile", "liger"))
        graphs = " ".join(f"{_ratio(r, 'fwd_bwd_graph_ms', o, 'tunekit'):>5}" for o in ("torch", "compile", "liger"))
        lines.append(
            f"{r['norm']:9} {r['shape']:11} {r['dtype']:8} {'yes' if r['correct'] else 'NO':3} "
            f"{r['bwd_gbps']:8.0f} {r['bwd_gbps'] / r['copy_gbps']:7.2f} "
            f"{r['bwd_heuristic_ms'] / r['bwd_best_ms']:9.2f}        {eager}          {graphs}"
        )
    lines.append(
        "eager: the method's eager forward+backward time over tunekit.ops' (as dispatch serves it; > 1: "
        "tunekit faster). graphs: the same steps as CUDA graphs, over this kernel's heuristic config."
    )
    lines.append("heur/best: the heuristic config's backward time over the sweep's best (1.00: heuristic is best).")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for norm_backward.json")
    parser.add_argument("--quick", action="store_true", help="two shapes only")
    parser.add_argument("--shapes", default="", help="MxN[:dtype],... instead of the default list")
    args = parser.parse_args()
    shapes = QUICK_SHAPES if args.quick else SHAPES
    if args.shapes:
        shapes = []
        for item in args.shapes.split(","):
            size, _, dtype = item.partition(":")
            m, n = (int(v) for v in size.split("x"))
            shapes.append((m, n, dtype or "bfloat16"))
    rows: list[dict[str, Any]] = []
    for rms in (False, True):
        methods = _methods(rms)
        for m, n, dtype in shapes:
            try:
                rows.append(_bench_shape(m, n, dtype, rms, methods))
            except Exception as exc:  # recorded; the next shape runs
                name = "rmsnorm" if rms else "layernorm"
                rows.append({"norm": name, "shape": f"{m}x{n}", "dtype": dtype, "error": repr(exc)[:500]})
                rows[-1]["traceback"] = traceback.format_exc()[-3000:]
            torch.cuda.empty_cache()
            print(json.dumps({k: rows[-1].get(k) for k in ("norm", "shape", "dtype", "error")}), flush=True)
    meta = {
        "device": torch.cuda.get_device_name(),
        "sm_count": fingerprint().sm_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "liger": _liger(False) is not None,
        "nan_free": all(not math.isnan(r.get("bwd_gbps", 0.0)) for r in rows),
    }
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "norm_backward.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(json.dumps(meta))
    print(_table(rows))


if __name__ == "__main__":
    main()
