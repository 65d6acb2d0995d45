"""Where a patched model loses to compile alone in a compiled decode step (0.94-0.97x in earlier runs with the same
FX graph): on the host or on the GPU. Per variant (compile alone, its control, tunekit.patch + compile), timed in
alternation:
  step: one call between CUDA events after a synchronize (the benchmarks' way: host-bound at decode);
  gpu:  20 calls queued behind a long sleep kernel, events around them: the GPU's own time per call;
  host: 20 calls queued behind the sleep, host clock per call: what the host spends enqueueing one;
then per variant: Python function calls per call (cProfile), CUDA kernels per call (profiler), and Dynamo's cache
entries on the forward's code object with their guard-check times.

    python tests/gpu/compiled_host_probe.py --model gemma [--rounds 7]   # a family's widths, or a pack's model:
    python tests/gpu/compiled_host_probe.py --model llama-3-8b --variants "compile,tunekit,max-autotune"

Prints the table last; JSON under $OUT.
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import json
import os
import pstats
import re
import statistics
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from model_transfer import SIZES, WIDTHS, held_out
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from tunekit.integrations import inductor_outer_products
from tunekit.integrations.patching import patch

OUT = Path(os.environ.get("OUT", "/tmp/out"))
OPTIONS: dict[str, Any] = {
    "compile": None,
    "compile (control)": {"max_autotune_gemm": False},
    "tunekit": {"epilogue_fusion": True},
    "tunekit (again)": {"epilogue_fusion": True, "pattern_matcher": True},
    "tunekit (products as GEMMs)": {"epilogue_fusion": True, "size_asserts": True},
    # what Inductor's GEMM search alone buys (no pointwise or reduction tuning), with cuBLAS among the candidates
    # and without it (a Triton template's launch costs the host less than an extern cuBLAS call)
    "gemm-autotune": {"max_autotune_gemm": True},
    "gemm-autotune-triton": {"max_autotune_gemm": True, "max_autotune_gemm_backends": "TRITON"},
    "gemm-autotune-triton (again)": {
        "max_autotune_gemm": True,
        "max_autotune_gemm_backends": "TRITON",
        "pattern_matcher": True,
    },
    "max-autotune": "max-autotune-no-cudagraphs",
    # max-autotune's other parts: the pointwise and reduction kernels' configs, searched by coordinate descent
    "coordinate-descent": {"coordinate_descent_tuning": True},
    "tunekit + coordinate-descent": {"coordinate_descent_tuning": True, "epilogue_fusion": True},
}
QUEUED = 20


def _file_name(variant: str) -> str:
    """A variant's name as a file name the device tool returns (letters, digits, `-`, `_`, `.`)."""
    return re.sub(r"[^\w.-]+", "_", variant).strip("_")


def step_ms(model: Any, ids: torch.Tensor) -> float:
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    model(ids, use_cache=False)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def queued(model: Any, ids: torch.Tensor) -> tuple[float, float]:
    """(GPU ms, host ms) per call, for QUEUED calls enqueued behind a sleep long enough to hide the host."""
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~100+ ms at H200 clocks: the host enqueues everything meanwhile
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    t0 = time.perf_counter()
    for _ in range(QUEUED):
        model(ids, use_cache=False)
    host = (time.perf_counter() - t0) * 1e3 / QUEUED
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / QUEUED, host


def python_calls(model: Any, ids: torch.Tensor, calls: int = 50) -> tuple[float, list[str], list[str]]:
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        model(ids, use_cache=False)
    profile.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profile)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:15]  # type: ignore[attr-defined]
    top = [
        f"{v[1] / calls:6.1f} calls {v[2] / calls * 1e6:7.1f} us  {k[0].split('/')[-1]}:{k[1]}({k[2]})" for k, v in rows
    ]
    wrappers = [k[0] for k in stats.stats if k[2] == "call" and "torchinductor" in k[0]]  # type: ignore[attr-defined]
    return stats.total_calls / calls, top, wrappers  # type: ignore[attr-defined]


def kernels_per_call(model: Any, ids: torch.Tensor, calls: int = 5) -> tuple[float, float, dict[str, list[float]]]:
    """(kernels, GPU ms, {kernel name: [launches, GPU us]}) per call."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            model(ids, use_cache=False)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, list[float]] = {}
    for e in events:
        row = by_name.setdefault(e.name[:120], [0.0, 0.0])
        row[0] += 1 / calls
        row[1] += e.device_time / calls
    return len(events) / calls, sum(e.device_time for e in events) / calls / 1e3, by_name


def host_ops(model: Any, ids: torch.Tensor, calls: int = 20) -> str:
    """The host side by op (the profiler's CPU events: Dynamo's cache lookup, each aten op, each CUDA launch),
    self time per call, as the profiler's table."""
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            model(ids, use_cache=False)
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=70)


def guard_checks(bases: dict[str, torch.nn.Module], ids: torch.Tensor) -> dict[str, Any]:
    forward = next(iter(bases.values())).forward.__func__
    code = forward.__code__
    entries = _debug_get_cache_entry_list(code)
    out: dict[str, Any] = {"entries": len(entries), "code": f"{code.co_filename.split('/')[-1]}:{code.co_name}"}
    torch.set_grad_enabled(False)
    try:
        for name, base in bases.items():
            frame = {"self": base, "args": (ids,), "kwargs": {"use_cache": False}}
            if hasattr(forward, "__wrapped__"):
                frame["func"] = forward.__wrapped__
            row = []
            for entry in entries:
                try:
                    ok = bool(entry.guard_manager.check(frame))
                    t0 = time.perf_counter()
                    for _ in range(500):
                        entry.guard_manager.check(frame)
                    row.append(
                        (
                            ok,
                            round((time.perf_counter() - t0) / 500 * 1e6, 2),
                            len(str(entry.guard_manager).splitlines()),
                        )
                    )
                except Exception as failure:  # a frame layout this probe did not guess
                    row.append((False, -1.0, repr(failure)[:80]))
            out[name] = row
    finally:
        torch.set_grad_enabled(True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gemma")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--layers", type=int, default=2, help="decoder layers of a pack's model")
    parser.add_argument("--variants", default="compile,compile (control),tunekit")
    parser.add_argument("--host-ops", action="store_true", help="save each variant's host time by op under $OUT")
    parser.add_argument("--wrappers", action="store_true", help="save each variant's generated call under $OUT")
    parser.add_argument("--tune-budget", type=float, default=0.0,
                        help="seconds: tune_model(compiled=True) on a patched copy first, so that the tunekit "
                        "variants serve what it stored (0: the store and packs as they are)")  # fmt: skip
    opts = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    torch._dynamo.config.automatic_dynamic_shapes = False
    if opts.model in WIDTHS:
        base, all_ids = held_out(opts.model)
        ids = all_ids["decode"]
    else:  # a pack's model: the packs' verdicts serve it
        from tunekit.evaluation.model_packs import PACK_MODELS, build_pack_model

        base = build_pack_model(opts.model, "cuda", layers=opts.layers)
        vocab = PACK_MODELS[opts.model].widths["vocab_size"]
        ids = torch.randint(0, vocab, SIZES["decode"], generator=torch.Generator().manual_seed(1)).to("cuda")
    base.eval()
    if opts.tune_budget > 0:
        from tunekit.evaluation.tune_model import tune_model

        def decode(m: torch.nn.Module) -> Any:
            with torch.no_grad():
                return m(ids, use_cache=False)

        tuned = copy.deepcopy(base)
        patch(tuned)
        report = tune_model(tuned, {"decode": decode}, budget_s=opts.tune_budget, compare_eager=False, compiled=True)
        print(report.table(), flush=True)
        if report.compiled is not None:
            print(report.compiled.table(), flush=True)
        del tuned
    bases, models = {}, {}
    torch.set_grad_enabled(False)
    first_s = {}
    for name in opts.variants.split(","):
        options = OPTIONS[name]
        bases[name] = copy.deepcopy(base)
        if name.startswith("tunekit"):
            print(patch(bases[name]))
        if isinstance(options, str):
            models[name] = torch.compile(bases[name], mode=options)
        else:
            models[name] = torch.compile(bases[name], options=options)
        # compile alone and Inductor's modes compile their own graph (no tunekit pass), as does the tunekit variant
        # that measures what the pass buys
        keep_products = not name.startswith("tunekit") or "products as GEMMs" in name
        with inductor_outer_products.disabled() if keep_products else nullcontext():
            t0 = time.perf_counter()
            models[name](ids, use_cache=False)
            torch.cuda.synchronize()
            first_s[name] = time.perf_counter() - t0
            for _ in range(2):
                models[name](ids, use_cache=False)
    torch.cuda.synchronize()
    times: dict[str, dict[str, list[float]]] = {n: {"step": [], "gpu": [], "host": []} for n in models}
    names = list(models)
    for r in range(opts.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            m = models[name]
            for _ in range(3):
                m(ids, use_cache=False)
            times[name]["step"].append(statistics.median(step_ms(m, ids) for _ in range(7)))
            gpu, host = queued(m, ids)
            times[name]["gpu"].append(gpu)
            times[name]["host"].append(host)
    result: dict[str, Any] = {"model": opts.model, "device": torch.cuda.get_device_name(), "variants": {}}
    for name, m in models.items():
        calls, top, wrappers = python_calls(m, ids)
        for i, wrapper in enumerate(wrappers[:1] if opts.wrappers else []):  # Inductor's generated call, to diff
            (OUT / f"wrapper_{_file_name(name)}_{i}.py").write_text(Path(wrapper).read_text())
        kernels, kernel_ms, by_name = kernels_per_call(m, ids)
        row = {k: statistics.median(v) for k, v in times[name].items()}
        row["rounds"] = times[name]
        row["vs_compile"] = {
            k: statistics.median(a / b for a, b in zip(times["compile"][k], v)) for k, v in times[name].items()
        }
        row.update(python_calls_per_call=calls, top=top, kernels=kernels, kernel_ms=kernel_ms, first_s=first_s[name])
        row["kernel_names"] = by_name
        if opts.host_ops:
            (OUT / f"host_ops_{_file_name(name)}.txt").write_text(host_ops(m, ids))
        result["variants"][name] = row
    result["guards"] = guard_checks(bases, ids)
    (OUT / f"compiled_host_{opts.model}_{opts.layers}l.json").write_text(json.dumps(result, indent=1))
    for name, row in list(result["variants"].items())[:3]:
        print(f"== {name}: python calls/call {row['python_calls_per_call']:.0f}")
        print("\n".join(row["top"]))
    print(json.dumps(result["guards"])[:3000])
    print(f"{opts.model} ({opts.layers} layers) decode {tuple(ids.shape)}")
    print(
        "| variant | step ms | gpu ms | host ms | step vs compile | gpu vs | host vs | kernels | kernel ms | first s |"
    )
    for name, row in result["variants"].items():
        v = row["vs_compile"]
        print(f"| {name} | {row['step']:.3f} | {row['gpu']:.3f} | {row['host']:.3f} | {v['step']:.3f} | "
              f"{v['gpu']:.3f} | {v['host']:.3f} | {row['kernels']:.0f} | {row['kernel_ms']:.3f} | "
              f"{row['first_s']:.1f} |")  # fmt: skip


if __name__ == "__main__":
    main()
