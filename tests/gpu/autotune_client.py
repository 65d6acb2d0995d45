"""tunekit.autotune against triton.autotune on a Liger-Kernel jit kernel (wrapped at run time, no code copied), each
in two fresh processes, plus a plain launch of the chosen config in a fresh process.

    python tests/gpu/autotune_client.py [--kernel rms_norm|swiglu|softmax] [--rows 4096] [--cols 4096] [--out DIR]

Per process it prints one JSON line: the configs benchmarked, the first call's wall time (tuning, or the store
lookup, plus compiling or loading the kernel), the eager host time per call after it (median of 7 x 200 launches,
no synchronisation inside) against a plain launch of the chosen config, the chosen config, and whether the output
matches Liger's own launcher. tunekit's store is a fresh directory (under --out), so its first process tunes and its
second serves. Without a GPU it runs in Triton's interpreter (softmax only: Liger's RMSNorm and SwiGLU kernels do
not run there), with a wall-clock do_bench for triton.autotune, as a smoke test of the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import tunekit  # first: selects the GPU or the interpreter before triton is imported

HERE = Path(__file__).resolve()


def _kernel_case(kernel: str, rows: int, cols: int) -> dict[str, Any]:
    """The Liger jit function, a launch's (grid, args, kwargs), the reference and Liger's own output."""
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = torch.randn(rows, cols, device=device, dtype=dtype)
    if kernel == "rms_norm":
        from liger_kernel.ops import rms_norm as mod

        w, y = torch.randn(cols, device=device, dtype=dtype), torch.empty_like(x)
        rstd = torch.empty(rows, device=device, dtype=torch.float32)
        args = (y, y.stride(0), x, x.stride(0), w, w.stride(0), rstd, rstd.stride(0), cols, 1e-6, 0.0, 0)
        ref = mod.rms_norm_forward(x, w, 1e-6, 0.0, "llama", True)[0]

        def reference(a: dict) -> dict:
            xf, wf = a["X_ptr"].float(), a["W_ptr"].float()
            r = torch.rsqrt(xf.pow(2).mean(-1) + a["eps"])
            return {"Y_ptr": (xf * r[:, None]).to(a["Y_ptr"].dtype) * wf.to(a["Y_ptr"].dtype), "RSTD_ptr": r}

        return dict(
            fn=mod._rms_norm_forward_kernel,
            grid=(rows,),
            args=args,
            kwargs={"elementwise_affine": True},
            out=y,
            ref=ref,
            reference=reference,
        )
    if kernel == "swiglu":
        from liger_kernel.ops import swiglu as mod

        b, c = torch.randn_like(x), torch.empty_like(x)
        ref = mod.swiglu_forward(x, b)[2]

        def reference(a: dict) -> dict:
            gate = a["a_ptr"].float() * a["gate_multiplier"]
            return {"c_ptr": (torch.nn.functional.silu(gate).to(a["b_ptr"].dtype) * a["b_ptr"])}

        return dict(
            fn=mod._swiglu_forward_kernel,
            grid=(rows,),
            args=(x, b, c, c.stride(-2), 1.0, cols),
            kwargs={},
            out=c,
            ref=ref,
            reference=reference,
        )
    from liger_kernel.ops import softmax as mod

    y = torch.empty_like(x)
    ref = mod._softmax_forward(x)[0]
    return dict(
        fn=mod._softmax_single_block_forward_kernel,
        grid=(rows,),
        args=(y, y.stride(0), x, x.stride(0), cols),
        kwargs={},
        out=y,
        ref=ref,
        reference=lambda a: {"Y_ptr": torch.softmax(a["X_ptr"].float(), -1)},
    )


def _configs(cols: int, gpu: bool) -> list[Any]:
    import triton

    block = triton.next_power_of_2(cols)
    warps = (4, 8, 16, 32) if gpu else (1,)
    return [triton.Config({"BLOCK_SIZE": b}, num_warps=w) for b in (block, 2 * block) for w in warps]


def _host_us(call: Any) -> float:
    import torch

    samples = []
    for _ in range(7):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(200 if torch.cuda.is_available() else 2):
            call()
        samples.append((time.perf_counter() - start) / (200 if torch.cuda.is_available() else 2) * 1e6)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    return statistics.median(samples)


def child(mode: str, kernel: str, rows: int, cols: int, plain_config: str | None) -> dict[str, Any]:
    import torch
    import triton
    from triton.runtime import driver

    gpu = torch.cuda.is_available()
    case = _kernel_case(kernel, rows, cols)
    fn, grid, args, kwargs = case["fn"], case["grid"], case["args"], case["kwargs"]
    count = {"n": 0}

    def wallclock(f: Any, quantiles: Any = None) -> list[float]:
        start = time.perf_counter()
        f()
        return [(time.perf_counter() - start) * 1e3] * 3

    base_bench = driver.active.get_benchmarker() if gpu else wallclock

    def counting(f: Any, quantiles: Any = None) -> Any:
        count["n"] += 1
        return base_bench(f, quantiles=quantiles)

    configs = _configs(cols, gpu)
    if mode == "triton":
        tuned: Any = triton.autotune(configs=configs, key=["n_cols"], do_bench=counting)(fn)
    elif mode == "tunekit":
        tuned = tunekit.autotune(
            configs=configs, key=["n_cols"], reference=case["reference"], do_bench=None if gpu else counting
        )(fn)
    else:
        chosen = json.loads(plain_config or "{}")
        tuned = None
    start = time.perf_counter()
    if tuned is not None:
        tuned[grid](*args, **kwargs)
    else:
        meta = {k: v for k, v in chosen.items() if k not in ("num_warps", "num_stages", "num_ctas")}
        opts = {k: chosen[k] for k in ("num_warps", "num_stages") if k in chosen}
        fn[grid](*args, **kwargs, **meta, **opts)
    if gpu:
        torch.cuda.synchronize()
    first_ms = (time.perf_counter() - start) * 1e3
    if tuned is not None:
        config = tuned.best_config
        chosen = {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}
    meta = {k: v for k, v in chosen.items() if k not in ("num_warps", "num_stages")}
    opts = {"num_warps": chosen["num_warps"], "num_stages": chosen["num_stages"]}
    plain_us = _host_us(lambda: fn[grid](*args, **kwargs, **meta, **opts))
    tuned_us = _host_us(lambda: tuned[grid](*args, **kwargs)) if tuned is not None else plain_us
    benchmarks = tuned.stats.benchmarks if mode == "tunekit" else count["n"]
    matches = bool(torch.allclose(case["out"].float(), case["ref"].float(), atol=2e-2, rtol=2e-2))
    return {
        "mode": mode,
        "kernel": kernel,
        "shape": [rows, cols],
        "device": torch.cuda.get_device_name() if gpu else "interpreter",
        "benchmarks": benchmarks,
        "first_call_ms": round(first_ms, 3),
        "host_us_per_call": round(tuned_us, 2),
        "plain_host_us_per_call": round(plain_us, 2),
        "config": chosen,
        "matches_liger": matches,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", default="rms_norm", choices=("rms_norm", "swiglu", "softmax"))
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp())
    parser.add_argument("--child", choices=("triton", "tunekit", "plain"))
    parser.add_argument("--plain-config")
    opts = parser.parse_args()
    if opts.child:
        print(json.dumps(child(opts.child, opts.kernel, opts.rows, opts.cols, opts.plain_config)))
        return
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TUNEKIT_CACHE_DIR": str(out / "tunekit-store")}
    results = []
    for mode in ("triton", "triton", "tunekit", "tunekit", "plain"):
        cmd = [
            sys.executable,
            str(HERE),
            "--child",
            mode,
            "--kernel",
            opts.kernel,
            "--rows",
            str(opts.rows),
            "--cols",
            str(opts.cols),
        ]
        if mode == "plain":
            cmd += ["--plain-config", json.dumps(results[-1]["config"])]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            sys.exit(f"{mode} process failed:\n{done.stderr[-3000:]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    (out / f"autotune_client_{opts.kernel}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
