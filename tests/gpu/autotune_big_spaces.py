"""Big spaces, real kernels: three kernels written outside tunekit, each over 140-224 configs and 8 shapes,
timed exhaustively on the GPU; then trials to within 3% of the exhaustive best for tunekit.autotune's own search
(replayed over the recorded table: tests/gpu/autotune_replay.py) and for random order; then host time per call of
the tunekit.autotune-decorated kernel against a plain launch of the same config, in a second process that the store
serves.

    python tests/gpu/autotune_big_spaces.py --out $OUT/big_spaces          # one H200: about 4-6 minutes
    python tests/gpu/autotune_big_spaces.py --analyse TABLE.json            # the analysis alone, on the CPU
    python tests/gpu/autotune_big_spaces.py --smoke --out /tmp/smoke        # the whole pipeline in the interpreter

Kernels (tests/gpu/big_space_kernels.py): the Triton tutorials' matmul (fp16) and looped LayerNorm forward (fp16),
written there in our own words, and Liger-Kernel's JSD kernel (bf16), imported as it is.

Steps, each timed and printed:
1. compile: every config's binary for every shape's specialisation, `fn.warmup(...)` in a pool of processes
   (`--compile-workers`, default one per core), into Triton's on-disk cache, which the timing process then loads;
2. exhaustive: per shape (round-robin over the kernels, so a time cut shortens every kernel alike), every config run
   once on random inputs with its outputs poisoned (NaN) and checked against a torch reference (wrong or failing
   configs are recorded as such), then timed with triton.testing.do_bench (L2 flushed, median; `--warmup-ms`,
   `--rep-ms`); the `--refine-top` fastest of a shape timed again over longer windows;
3. table.json under --out: kernel, shape, config -> ms, or failed / wrong with the reason;
4. host time: per kernel, a fresh process tunes its small `host_shape` into a fresh store (every config, a short
   do_bench), then a second fresh process, served by that store, times `--host-calls` calls of the decorated kernel
   and of a plain launch of the config it serves, alternating rounds of 200: host.json;
5. analysis (a fresh process in Triton's interpreter, as on a CPU machine): analysis.json;
6. summary.txt / summary.json: the short table, printed last.
`--deadline-min` (default 7.5) bounds the whole run: shapes not started by then, less the time the last steps need,
are left out of the table, and an analysis still running at the deadline is left for `--analyse` (each said).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import torch
import triton
import triton.testing

import tunekit
from tunekit.core import backend
from tunekit.tuning.verify import KNOWN_KERNEL_FAILURES
from tunekit.user_kernels.configs import as_triton

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))
import autotune_replay as replay  # noqa: E402  (this folder)
from big_space_kernels import KERNELS, BigSpaceKernel, Case, check, launch, poison, split  # noqa: E402

TAIL_S = 150.0  # what the host-time processes and the analysis need after the exhaustive pass
ROUND_CALLS = 200


def say(text: str) -> None:
    print(text, flush=True)


def device_and_dtype(kernel: BigSpaceKernel) -> tuple[torch.device, torch.dtype]:
    if backend.INTERPRETED:
        return torch.device("cpu"), torch.float32
    return torch.device("cuda", torch.cuda.current_device()), kernel.dtype


def sync() -> None:
    if not backend.INTERPRETED:
        torch.cuda.synchronize()


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:240]}"


# --- 1. compile ahead ---------------------------------------------------------------------------------------------


def compile_task(task: tuple[str, int, bool]) -> tuple[str, int, str | None, float]:
    """One config of one kernel compiled for every shape's specialisation (a pool process; nothing launched)."""
    name, index, smoke = task
    kernel = KERNELS[name]
    device, dtype = device_and_dtype(kernel)
    config = kernel.configs(smoke)[index]
    meta, options = split(config)
    started = time.perf_counter()
    try:
        for shape in kernel.shapes(smoke):
            case = kernel.case(shape, device, dtype, True)
            kernel.fn.warmup(*case.args, grid=case.grid(config), **case.kwargs, **meta, **options)
    except Exception as exc:  # compiling ahead only saves time: the timing process meets and records it again
        return name, index, _error(exc), time.perf_counter() - started
    return name, index, None, time.perf_counter() - started


def compile_ahead(kernels: list[BigSpaceKernel], smoke: bool, workers: int) -> dict[str, Any]:
    if backend.INTERPRETED or workers <= 0:
        return {"skipped": "interpreter" if backend.INTERPRETED else "--compile-workers 0"}
    tasks = [(k.name, i, smoke) for k in kernels for i in range(len(k.configs(smoke)))]
    started = time.perf_counter()
    errors: dict[str, int] = {}
    busy = 0.0
    context = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            for name, _, error, seconds in pool.map(compile_task, tasks, chunksize=1):
                busy += seconds
                if error is not None:
                    errors[name] = errors.get(name, 0) + 1
    except BrokenProcessPool as exc:  # a compiler process died: what is left compiles at its first launch
        say(f"compile: the pool broke ({exc}); the rest compiles in the timing process")
        errors["pool"] = 1
    wall = time.perf_counter() - started
    say(f"compile: {len(tasks)} configs on {workers} processes in {wall:.1f} s ({busy:.0f} s of compiling); "
        f"failed to compile: {errors or 'none'}")  # fmt: skip
    return {"configs": len(tasks), "workers": workers, "wall_s": wall, "busy_s": busy, "errors": errors}


# --- 2. exhaustive timing -----------------------------------------------------------------------------------------


class DeviceLost(RuntimeError):
    """The CUDA context is unusable (an illegal access): nothing more can be measured in this process."""


def time_ms(fn: Any, warmup_ms: float, rep_ms: float) -> float:
    if backend.INTERPRETED:  # no GPU timer: wall clock, median of three after one warm-up
        fn()
        samples = []
        for _ in range(3):
            started = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - started) * 1e3)
        return statistics.median(samples)
    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def measure_config(kernel: BigSpaceKernel, case: Case, config: dict[str, Any], opts: argparse.Namespace) -> dict:
    """Checked first (outputs poisoned, compared with the reference), then timed; a failure is recorded."""
    try:
        poison(case)
        launch(kernel, case, config)
        sync()
        wrong = check(case)
        if wrong is not None:
            return {"status": "wrong", "error": wrong}
        return {"status": "ok", "ms": time_ms(lambda: launch(kernel, case, config), opts.warmup_ms, opts.rep_ms)}
    except KNOWN_KERNEL_FAILURES as exc:
        text = _error(exc)
        if "CUDA error" in text or "illegal" in text.lower():
            raise DeviceLost(text) from exc
        return {"status": "failed", "error": text}


def measure_shape(
    kernel: BigSpaceKernel, shape: tuple[int, ...], smoke: bool, opts: argparse.Namespace, stop_at: float
) -> dict:
    """Every config of one shape; past `stop_at` (a shape that compiles in this process, say) the rest are
    `not_measured` and the analysis leaves the shape out."""
    device, dtype = device_and_dtype(kernel)
    torch.manual_seed(0)
    case = kernel.case(shape, device, dtype, False)
    configs = kernel.configs(smoke)
    started = time.perf_counter()
    results = [
        measure_config(kernel, case, config, opts) if time.monotonic() < stop_at else {"status": "not_measured"}
        for config in configs
    ]
    timed = time.perf_counter() - started
    ok = sorted((r["ms"], i) for i, r in enumerate(results) if r["status"] == "ok")
    for _, i in ok[: opts.refine_top]:  # the contenders again, over longer windows: the best is a noisy minimum
        again = time_ms(lambda c=configs[i]: launch(kernel, case, c), 4 * opts.warmup_ms, 5 * opts.rep_ms)
        results[i] = {"status": "ok", "ms": again, "ms_first": results[i]["ms"]}
    best = min((r["ms"] for r in results if r["status"] == "ok"), default=None)
    counts = {s: sum(r["status"] == s for r in results) for s in ("ok", "wrong", "failed", "not_measured")}
    say(f"  {kernel.name:10} {kernel.label(shape):>16}: best {best if best is None else f'{best:.4f} ms'}  "
        f"{counts}  {time.perf_counter() - started:.1f} s")  # fmt: skip
    return {
        "label": kernel.label(shape),
        "shape": list(shape),
        "problem": kernel.problem(shape),
        "seconds": round(timed, 2),
        "results": results,
    }


def _kernel_header(kernel: BigSpaceKernel, smoke: bool) -> dict[str, Any]:
    dtype = str(device_and_dtype(kernel)[1]).removeprefix("torch.")
    return {"source": kernel.source, "key": list(kernel.key), "dtype": dtype, "configs": kernel.configs(smoke),
            "shapes": []}  # fmt: skip


def exhaustive(
    kernels: list[BigSpaceKernel], smoke: bool, opts: argparse.Namespace, deadline: float, stop_at: float
) -> dict:
    """Every shape started before `deadline`, round-robin over the kernels; no config after `stop_at`."""
    table: dict[str, Any] = {
        "format": replay.FORMAT,
        "smoke": smoke,
        "device": "interpreter" if backend.INTERPRETED else torch.cuda.get_device_name(),
        "triton": triton.__version__,
        "torch": torch.__version__,
        "timer": "interpreter wall clock" if backend.INTERPRETED else (
            f"triton.testing.do_bench(warmup={opts.warmup_ms}, rep={opts.rep_ms}, median; L2 flushed), the "
            f"{opts.refine_top} fastest of a shape again at warmup={4 * opts.warmup_ms}, rep={5 * opts.rep_ms}"
        ),
        "kernels": {k.name: _kernel_header(k, smoke) for k in kernels},
        "left_out": [],
    }  # fmt: skip
    rounds = max(len(k.shapes(smoke)) for k in kernels)
    try:
        for r in range(rounds):
            for kernel in kernels:
                shapes = kernel.shapes(smoke)
                if r >= len(shapes):
                    continue
                if time.monotonic() > deadline:
                    table["left_out"].append(f"{kernel.name} {kernel.label(shapes[r])}: past the deadline")
                    continue
                row = measure_shape(kernel, shapes[r], smoke, opts, stop_at)
                table["kernels"][kernel.name]["shapes"].append(row)
                if not backend.INTERPRETED:
                    torch.cuda.empty_cache()  # the shape's tensors are gone: give their memory back before the next
    except DeviceLost as exc:
        table["left_out"].append(f"the device was lost ({exc}); the remaining shapes were not measured")
        say(f"device lost: {exc}")
    return table


# --- 5. host time -------------------------------------------------------------------------------------------------


def _quick_bench(fn: Any, quantiles: Any = None) -> Any:
    """The setup process's timer: short windows (the host shape is small; it only has to store a winner)."""
    if backend.INTERPRETED:
        started = time.perf_counter()
        fn()
        ms = (time.perf_counter() - started) * 1e3
        return [ms, ms, ms]
    return triton.testing.do_bench(fn, warmup=1, rep=5, quantiles=quantiles)


def decorated(kernel: BigSpaceKernel, smoke: bool) -> Any:
    """The kernel as a user converts it: `tunekit.autotune(configs=<the whole list>, key=...)` on its jit function."""
    configs = [as_triton(c) for c in kernel.configs(smoke)]
    return tunekit.autotune(configs=configs, key=list(kernel.key), do_bench=_quick_bench)(kernel.fn)


def _per_call_us(fn: Any, calls: int) -> float:
    sync()
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - started  # launches only: no synchronisation inside, as an eager loop runs
    sync()
    return elapsed / calls * 1e6


def host_child(mode: str, name: str, smoke: bool, calls: int) -> dict[str, Any]:
    kernel = KERNELS[name]
    device, dtype = device_and_dtype(kernel)
    shape = kernel.smoke_host_shape if smoke else kernel.host_shape
    case = kernel.case(shape, device, dtype, False)
    tuned = decorated(kernel, smoke)
    started = time.perf_counter()
    tuned[case.grid](*case.args, **case.kwargs)
    sync()
    first_ms = (time.perf_counter() - started) * 1e3
    config = tuned.best_config
    chosen = {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}
    out: dict[str, Any] = {
        "mode": mode,
        "kernel": name,
        "shape": list(shape),
        "config": chosen,
        "first_call_ms": round(first_ms, 3),
        "benchmarks": tuned.stats.benchmarks,
        "served_from_store": tuned.stats.stored == 1 and tuned.stats.benchmarks == 0,
    }
    if mode == "setup":
        return out
    poison(case)
    meta, options = split(chosen)

    def plain() -> None:
        kernel.fn[case.grid](*case.args, **case.kwargs, **meta, **options)

    def through_tunekit() -> None:
        tuned[case.grid](*case.args, **case.kwargs)

    rounds, per_round = (3, 3) if smoke else (max(1, calls // ROUND_CALLS), ROUND_CALLS)
    for fn in (plain, through_tunekit):
        _per_call_us(fn, per_round // 4 + 1)  # warm: both paths' first launches are done
    samples: dict[str, list[float]] = {"plain": [], "tunekit": []}
    for r in range(rounds):  # alternating, each first every other round: drift hits both alike
        order = (("plain", plain), ("tunekit", through_tunekit))
        for label, fn in order if r % 2 == 0 else order[::-1]:
            samples[label].append(_per_call_us(fn, per_round))
    sync()
    wrong = check(case)  # the last launch's outputs: the served config still computes the right thing
    diffs = [t - p for t, p in zip(samples["tunekit"], samples["plain"])]
    return {
        **out,
        "calls_each": rounds * per_round,
        "tunekit_us": statistics.median(samples["tunekit"]),
        "plain_us": statistics.median(samples["plain"]),
        "diff_us_paired_median": statistics.median(diffs),
        "rounds_us": samples,
        "output_check": wrong or "ok",
    }


def host_times(kernels: list[BigSpaceKernel], smoke: bool, out: Path, calls: int) -> dict[str, Any]:
    store = Path(tempfile.mkdtemp(prefix="host_store_", dir=out))  # fresh: the setup process tunes into it
    env = {**os.environ, "TUNEKIT_CACHE_DIR": str(store)}
    results: dict[str, Any] = {}
    for kernel in kernels:
        for mode in ("setup", "serve"):
            cmd = [sys.executable, str(HERE), "--child", mode, "--kernel", kernel.name, "--host-calls", str(calls)]
            cmd += ["--smoke"] if smoke else []
            started = time.perf_counter()
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                results[kernel.name] = {"error": f"{mode} process failed: {done.stderr.strip()[-1500:]}"}
                say(f"host {kernel.name}: {mode} process failed:\n{done.stderr[-1500:]}")
                break
            line = json.loads(done.stdout.strip().splitlines()[-1])
            line["process_s"] = round(time.perf_counter() - started, 1)
            say(f"host {kernel.name} {mode}: {json.dumps({k: v for k, v in line.items() if k != 'rounds_us'})}")
            results[kernel.name] = line
    return results


# --- driver -------------------------------------------------------------------------------------------------------


def run_analysis(table_path: Path, out: Path, opts: argparse.Namespace, timeout_s: float) -> dict[str, Any] | None:
    """The analysis in a fresh process in Triton's interpreter (the replay's stubs run there, as on a CPU)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, str(HERE.parent / "autotune_replay.py"), "--analyse", str(table_path), "--out", str(out)]
    cmd += ["--replay-trials", str(opts.replay_trials), "--within", str(opts.within)]
    started = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=max(45.0, timeout_s))
    except subprocess.TimeoutExpired:
        say(f"analysis: past the deadline; run it on a CPU: python {' '.join(cmd[1:])}")
        return None
    if done.returncode != 0:
        say(f"analysis failed:\n{done.stderr[-3000:]}")
        return None
    say(f"analysis: {time.perf_counter() - started:.1f} s")
    return json.loads((out / "analysis.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out", help="folder for every output (default: $OUT, else ./big_spaces_out; with --analyse: beside the table)"
    )
    parser.add_argument("--analyse", metavar="TABLE", help="only analyse a recorded table (CPU), then stop")
    parser.add_argument("--smoke", action="store_true", help="two configs and tiny shapes per kernel (interpreter)")
    parser.add_argument("--kernels", default=",".join(KERNELS), help=f"comma-separated, of {list(KERNELS)}")
    parser.add_argument(
        "--compile-workers",
        type=int,
        default=min(16, len(os.sched_getaffinity(0))),
        help="processes compiling ahead (default: this process's cores, at most 16)",
    )
    parser.add_argument("--warmup-ms", type=float, default=3.0)
    parser.add_argument("--rep-ms", type=float, default=10.0)
    parser.add_argument("--refine-top", type=int, default=8, help="fastest configs of a shape timed again, longer")
    parser.add_argument("--replay-trials", type=int, default=replay.REPLAY_TRIALS)
    parser.add_argument("--within", type=float, default=replay.WITHIN)
    parser.add_argument("--host-calls", type=int, default=2000, help="calls per path in the host-time process")
    parser.add_argument("--deadline-min", type=float, default=7.5, help="the whole run's time limit, minutes")
    parser.add_argument("--child", choices=("setup", "serve"), help=argparse.SUPPRESS)
    parser.add_argument("--kernel", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)

    if opts.analyse:
        args = ["--analyse", opts.analyse, "--replay-trials", str(opts.replay_trials), "--within", str(opts.within)]
        return replay.main(args + (["--out", opts.out] if opts.out else []))
    if opts.child:
        print(json.dumps(host_child(opts.child, opts.kernel, opts.smoke, opts.host_calls)), flush=True)
        return 0

    started = time.monotonic()
    deadline = started + opts.deadline_min * 60
    unknown = [n for n in opts.kernels.split(",") if n not in KERNELS]
    if unknown:
        print(f"error: --kernels names {unknown}, which are not among {list(KERNELS)}", file=sys.stderr)
        return 1
    if opts.smoke != backend.INTERPRETED:
        what = "--smoke runs in the interpreter (no GPU)" if opts.smoke else "a full run needs a GPU (or --smoke)"
        print(f"error: {what}", file=sys.stderr)
        return 1
    kernels = [KERNELS[n] for n in opts.kernels.split(",")]
    out = Path(opts.out or os.environ.get("OUT") or "big_spaces_out")
    out.mkdir(parents=True, exist_ok=True)
    say(f"kernels: {', '.join(f'{k.name} ({len(k.configs(opts.smoke))} configs)' for k in kernels)}; out: {out}")

    phases: dict[str, Any] = {"compile": compile_ahead(kernels, opts.smoke, opts.compile_workers)}
    table = exhaustive(kernels, opts.smoke, opts, deadline - TAIL_S, deadline - 0.8 * TAIL_S)
    phases["exhaustive_s"] = round(time.monotonic() - started, 1)
    table["phases"] = phases
    for note in table["left_out"]:
        say(f"left out: {note}")
    table_path = out / "table.json"
    table_path.write_text(json.dumps(table))
    say(f"table: {table_path} ({phases['exhaustive_s']} s so far)")

    host = host_times(kernels, opts.smoke, out, opts.host_calls)  # the GPU's part first: the analysis can run later
    (out / "host.json").write_text(json.dumps(host, indent=1))
    analysis = run_analysis(table_path, out, opts, deadline - time.monotonic())
    total = round(time.monotonic() - started, 1)
    summary = replay.format_table(analysis, host) if analysis else "(no analysis: see above)"
    (out / "summary.json").write_text(json.dumps({"analysis_summary": {
        k: v["summary"] for k, v in (analysis or {}).get("kernels", {}).items()}, "host": host, "total_s": total,
        "left_out": table["left_out"], "phases": phases}, indent=1))  # fmt: skip
    (out / "summary.txt").write_text(summary + "\n")
    say(f"\ntotal {total} s; {table['device']}; outputs in {out}\n{summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
