"""GPU checks and host-cost table of the eager hot path (tunekit/runtime/hotpath.py). One device run:

    python tests/gpu/hotpath_probe.py --out $OUT [--models]

1. correctness of replayed calls (every op, new data each call) against torch;
2. CUDA-graph capture (torch.cuda.graph) of replayed calls, replayed with new inputs;
3. a side stream: the replayed kernel runs on the caller's current stream (checked in a profiler trace);
4. torch.compile(fullgraph=True) and mode="reduce-overhead" after plans exist;
5. a second GPU where one is present;
6. the host-cost table (tunekit.evaluation.host_bench), as served by default and with TUNEKIT_UNTUNED=triton;
7. what the tuner scores (`tuner_floor`): GPU time, the per-call floor through the JIT path and through the
   replay the tuner now times, the timer's score, and torch's, on launch-bound and GPU-bound problems;
8. with --models: the Llama decode/prefill rows of the model benchmark (eager, tunekit, liger).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

import tunekit.ops as ops
from tunekit.evaluation import host_bench
from tunekit.runtime import dispatch

record: dict[str, object] = {}


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.allclose(a.float(), b.float(), atol=3e-2, rtol=3e-2))


def correctness() -> None:
    bad = []
    for name, (op, args, kwargs, ref) in host_bench._cases(8, 1024, torch.float16).items():
        for _ in range(4):  # full, watched, replay, replay: fresh data in place each time
            for a in args:
                if isinstance(a, torch.Tensor) and a.dim() == 2 and a.shape[0] == 8:
                    a.copy_(torch.randn_like(a))
            got, want = op(*args, **kwargs), ref()
            got, want = (got[0], want[0]) if isinstance(got, tuple) else (got, want)
            if not _close(got, want):
                bad.append(name)
    stats = {h.__name__: vars(h.stats) for h in ops_hot() if h.stats.watched}
    print(f"correctness: {len(bad)} mismatches {bad}; stats {stats}")
    record["correctness"] = {"bad": bad, "stats": stats}


def ops_hot() -> list:
    from tunekit.runtime import hotpath

    return hotpath.ops()


def _in_each_untuned_mode(check) -> None:
    """`check(mode)` with untuned problems served by torch's kernels, then by tunekit's own, behind the same ops."""
    for mode in ("torch", "triton"):
        os.environ["TUNEKIT_UNTUNED"] = mode
        dispatch.reset_all()
        check(mode)
    os.environ["TUNEKIT_UNTUNED"] = "torch"
    dispatch.reset_all()


def graph_capture() -> None:
    _in_each_untuned_mode(_graph_capture)


def _graph_capture(mode: str) -> None:
    x = torch.randn(8, 1024, device="cuda", dtype=torch.float16)
    w = torch.randn(1024, device="cuda", dtype=torch.float16)
    lw = torch.randn(1024, 1024, device="cuda", dtype=torch.float16) / 32
    for _ in range(3):
        ops.linear(ops.rms_norm(x, (1024,), w, 1e-6), lw)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            ops.linear(ops.rms_norm(x, (1024,), w, 1e-6), lw)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = ops.linear(ops.rms_norm(x, (1024,), w, 1e-6), lw)
    ok = []
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        g.replay()
        torch.cuda.synchronize()
        ok.append(_close(y, F.linear(F.rms_norm(x, (1024,), w, 1e-6), lw)))
    print(f"cuda graph capture (untuned served by {mode}): replays correct {ok}")
    record[f"graph_{mode}"] = ok


def side_stream() -> None:
    _in_each_untuned_mode(_side_stream)


def _side_stream(mode: str) -> None:
    x = torch.randn(8, 1024, device="cuda", dtype=torch.float16)
    for _ in range(3):
        ops.softmax(x, -1)
    s = torch.cuda.Stream()
    trace = Path(os.environ.get("OUT", "/tmp")) / "side_stream_trace.json"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        with torch.cuda.stream(s):
            y = ops.softmax(x, -1)
            torch.cumsum(x, 0)  # a marker: torch's kernel on the side stream
        torch.cumsum(x, 1)  # and on the default stream
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace))
    events = json.loads(trace.read_text())["traceEvents"]
    kernels = [(e.get("name", ""), e["args"].get("stream")) for e in events if e.get("cat") == "kernel"]
    ours = {st for name, st in kernels if "softmax" in name}
    marks = [st for name, st in kernels if "scan" in name.lower() or "cumsum" in name.lower()]
    ok = _close(y, torch.softmax(x, -1))
    on_side = bool(marks) and ours == {marks[0]} and (len(marks) < 2 or marks[0] != marks[1])
    print(
        f"side stream (untuned served by {mode}): result correct {ok}; tunekit's softmax on stream {ours}, "
        f"torch's marker kernels on side then "
        f"default stream {marks}: {'on the side stream' if on_side else 'NOT on the side stream'}; {kernels}"
    )
    record[f"side_stream_{mode}"] = {"ok": ok, "ours": sorted(map(str, ours)), "marks": marks, "kernels": kernels}


def compiled() -> None:
    x = torch.randn(8, 1024, device="cuda", dtype=torch.float16)
    w = torch.randn(1024, device="cuda", dtype=torch.float16)
    for _ in range(3):
        ops.rms_norm(x, (1024,), w, 1e-6)
    out = {}
    for mode in ("default", "reduce-overhead"):
        torch._dynamo.reset()
        f = torch.compile(lambda t: ops.rms_norm(t, (1024,), w, 1e-6), fullgraph=True, mode=mode)
        oks = []
        for _ in range(4):
            x.copy_(torch.randn_like(x))
            oks.append(_close(f(x).clone(), F.rms_norm(x, (1024,), w, 1e-6)))
        out[mode] = all(oks)
    print(f"torch.compile fullgraph after plans: {out}")
    record["compile"] = out


def second_gpu() -> None:
    """Triton-served calls on cuda:1 while device 0 is current: results, and the device each kernel ran on (the
    profiler's), through the full path, the watched call and the replayed plans; then on a side stream of cuda:1."""
    if torch.cuda.device_count() < 2:
        print("second GPU: none on this machine (not checked)")
        record["second_gpu"] = "absent"
        return
    os.environ["TUNEKIT_UNTUNED"] = "triton"  # untuned problems would otherwise run torch's kernels
    dispatch.reset_all()
    x = torch.randn(8, 1024, device="cuda:1", dtype=torch.float16)
    w = torch.randn(1024, device="cuda:1", dtype=torch.float16)
    wl = torch.randn(512, 1024, device="cuda:1", dtype=torch.float16)
    cases = {
        "softmax": (lambda: ops.softmax(x, -1), lambda: torch.softmax(x, -1)),
        "rms_norm": (lambda: ops.rms_norm(x, (1024,), w, 1e-6), lambda: F.rms_norm(x, (1024,), w, 1e-6)),
        "linear": (lambda: ops.linear(x, wl), lambda: F.linear(x, wl)),
    }
    out: dict[str, object] = {}
    torch.cuda.set_device(0)
    for name, (ours, ref) in cases.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            oks = [_close(ours(), ref()) for _ in range(4)]
            side = torch.cuda.Stream(device="cuda:1")
            with torch.cuda.stream(side):
                oks.append(_close(ours(), ref()))
            torch.cuda.synchronize("cuda:1")
        devices = sorted({e.device_index for e in prof.events() if e.device_type.name == "CUDA"})
        out[name] = {"correct": oks, "kernel_devices": devices}
    record["second_gpu"] = out
    print(f"second GPU (current device 0, tensors on cuda:1, TUNEKIT_UNTUNED=triton): {out}")
    os.environ["TUNEKIT_UNTUNED"] = "torch"
    dispatch.reset_all()


def host_table() -> None:
    for mode in ("torch", "triton"):
        os.environ["TUNEKIT_UNTUNED"] = mode
        dispatch.reset_all()
        result = host_bench.measure()
        record[f"host_{mode}"] = result
        print(f"\nhost cost per call, TUNEKIT_UNTUNED={mode} (H100/H200 host, 8x1024 fp16, 3000 calls):")
        print(host_bench.table(result))
    os.environ["TUNEKIT_UNTUNED"] = "torch"
    dispatch.reset_all()


def tuner_floor() -> None:
    from tunekit.core.device import fingerprint
    from tunekit.core.registry import get_spec
    from tunekit.tuning.bench import CudaEventTimer, back_to_back_ms
    from tunekit.tuning.verify import as_called_eagerly

    cases = [
        ("layernorm", {"rows": 8, "cols": 1024, "dtype": "float16", "weight": True, "bias": True}),
        ("softmax", None),
        ("gemm", None),
        ("layernorm", {"rows": 8192, "cols": 4096, "dtype": "bfloat16", "weight": True, "bias": True}),
    ]
    timer, rows, device = CudaEventTimer(), [], fingerprint()
    for name, problem in cases:
        spec = get_spec(name)
        if problem is None:  # the kernel's problem of a small eager call, as dispatch keys it
            case = host_bench._cases(8, 1024, torch.float16)["softmax" if name == "softmax" else "linear"]
            problem = _problem_of(spec, case)
        inputs = spec.make_inputs(problem, torch.device("cuda"), 0)
        outputs = spec.alloc_outputs(inputs)
        config = spec.heuristic(problem, device)
        import triton.testing

        def jit(spec=spec, config=config, inputs=inputs, outputs=outputs) -> None:
            spec.launch(config, inputs, outputs)

        def theirs(spec=spec, inputs=inputs) -> object:
            return spec.torch_baseline(inputs)

        gpu = triton.testing.do_bench(jit, warmup=25, rep=100, return_mode="median")
        replay = as_called_eagerly(spec, config, inputs, outputs)
        row = {
            "kernel": name, "problem": problem, "gpu_ms": gpu, "jit_floor_ms": back_to_back_ms(jit),
            "replay_floor_ms": back_to_back_ms(replay), "score_ms": timer(replay, config),
            "torch_score_ms": timer(theirs, {}),
        }  # fmt: skip
        rows.append(row)
    record["tuner_floor"] = rows
    print("\nwhat the tuner scores (us): gpu | per-call floor, JIT path | floor, replay | score | torch's score")
    for r in rows:
        print(
            f"{r['kernel']:10} {str(r['problem'])[:60]:60} {r['gpu_ms'] * 1e3:7.1f} {r['jit_floor_ms'] * 1e3:7.1f} "
            f"{r['replay_floor_ms'] * 1e3:7.1f} {r['score_ms'] * 1e3:7.1f} {r['torch_score_ms'] * 1e3:7.1f}"
        )


def _problem_of(spec, case) -> dict:
    """The problem a host_bench case's first call dispatches for this kernel (recorded, not re-derived)."""
    from tunekit import record_problems

    op, args, kwargs, _ = case
    with record_problems() as plan:
        op(*args, **kwargs)
    return next(p for k, p in plan.problems if k == spec.name)


def models() -> None:
    from tunekit.evaluation.model_bench import Workload, measure, table

    results = measure(Workload("llama"), variants=("eager", "tunekit", "liger"), reps=10)
    record["models"] = [r.__dict__ for r in results]
    print(table(results))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    parser.add_argument("--models", action="store_true")
    parser.add_argument(
        "--steps", default="correctness,graph_capture,side_stream,compiled,second_gpu,host_table,tuner_floor"
    )
    opts = parser.parse_args()
    steps = [globals()[name] for name in opts.steps.split(",")]
    if opts.models:
        steps.append(models)
    for step in steps:
        t0 = time.time()
        try:
            step()
        except Exception as exc:  # keep the other measurements of this run
            print(f"{step.__name__} failed: {type(exc).__name__}: {exc}")
            traceback.print_exc()
        print(f"[{step.__name__} {time.time() - t0:.0f} s]", file=sys.stderr)
        (opts.out / "hotpath_probe.json").write_text(json.dumps(record, indent=1, default=str))
