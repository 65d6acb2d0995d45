"""The measuring commands: benchmarks, timing tables, the quantization model, and the devices they run on."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from tunekit.cli.app import DtypeOpt, JsonOpt, KernelOpt, ShapeOpt, console, say
from tunekit.cli.problems import kernel_problems, parse_shape
from tunekit.cli.views import printable
from tunekit.core.errors import TunekitError

if TYPE_CHECKING:
    from tunekit.core.space import Problem
    from tunekit.core.spec import KernelSpec
    from tunekit.evaluation.results import BenchOptions, BenchRun
    from tunekit.evaluation.suite import Family


def bench(
    kernel: Annotated[
        str | None, typer.Option("--kernel", "-k", help="One kernel's family (see `tunekit show --kernels`).")
    ] = None,
    suite: Annotated[
        str | None, typer.Option("--suite", help="A named suite: memory (norms, GELU, softmax, reductions), gemm, all.")
    ] = None,
    shape: ShapeOpt = None,
    dtype: DtypeOpt = None,
    quick: Annotated[bool, typer.Option("--quick", help="A few shapes per family (a smoke run).")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the run as JSON (after every row).")] = None,
    png: Annotated[
        Path | None, typer.Option("--png", help="Also draw the run, one PNG per family (needs matplotlib).")
    ] = None,
    compile_: Annotated[
        bool | None,
        typer.Option(
            "--compile/--no-compile", help="torch.compile baseline (default: on for a GPU, off in the interpreter)."
        ),
    ] = None,
    max_autotune: Annotated[
        bool, typer.Option("--max-autotune", help="Also torch.compile mode=max-autotune, one child process per shape.")
    ] = False,
    compile_timeout: Annotated[
        float, typer.Option(help="Seconds max-autotune may take per shape before its process is killed.")
    ] = 300.0,
    summary: Annotated[
        Path | None,
        typer.Option("--summary", help="Print the summary (geomeans, targets) of a saved --json run; measure nothing."),
    ] = None,
) -> None:
    """Tuned tunekit vs torch eager, torch.compile (and cuBLASLt for GEMM) vs the roofline measured in the same run.

    Memory-bound families in GB/s against the copy bandwidth, GEMM in TFLOP/s against the bf16 matmul rate;
    problems under 16 MiB are launch-bound: timed with CUDA graphs, in µs against an empty kernel's launch floor.
    Every implementation is checked against the reference before it is timed. In the interpreter: tiny shapes,
    wall-clock only.
    """
    from tunekit.core import backend
    from tunekit.evaluation.report_tables import print_report, print_saved_summary
    from tunekit.evaluation.results import BenchOptions, read_run
    from tunekit.evaluation.suite import work_list

    if compile_timeout <= 0:
        raise TunekitError(f"--compile-timeout must be > 0 seconds, but got {compile_timeout}")
    if summary is not None:
        if kernel or suite or shape:
            raise TunekitError("--summary reads a saved run: it takes no --kernel, --suite or --shape")
        print_saved_summary(read_run(summary), console if console.is_terminal else Console(soft_wrap=True))
        return
    if png is not None:
        from tunekit.evaluation.plot import require_matplotlib

        require_matplotlib()  # before the run, not after an hour of it
    shapes = [parse_shape(s) for s in shape or []]
    work = work_list(kernel, suite, shapes, dtype, quick, backend.INTERPRETED)
    if not work:
        raise TunekitError("no problems to measure (does --dtype match the suite's dtypes?)")
    options = BenchOptions(compile=compile_, max_autotune=max_autotune, compile_timeout_s=compile_timeout)
    run = _measure(work, options, json_out)
    print_report(run, console if console.is_terminal else Console(soft_wrap=True))  # a pipe: each line whole
    if json_out is not None:
        console.print(f"json: {json_out}")
    if png is not None:
        from tunekit.evaluation.plot import plot_run

        for path in plot_run(run, png):
            console.print(f"png: {path}")


def _measure(work: list[tuple[Family, Problem]], options: BenchOptions, json_out: Path | None) -> BenchRun:
    """Run the benchmark under a status line that names the last row measured."""
    from tunekit.evaluation.report import run_bench

    with console.status(f"measuring {len(work)} problems") as status:

        def after_row(run: BenchRun) -> None:
            if json_out is not None:
                run.save(json_out)  # after every row: a killed run keeps what it has
            last = run.rows[-1]
            status.update(f"measured {len(run.rows)}/{len(work)}: {last.family} {last.label}")

        return run_bench(work, options, on_row=after_row)


def plot(
    results: Annotated[Path, typer.Argument(help="A `tunekit bench --json` file.")],
    out: Annotated[
        Path,
        typer.Option("--out", help="The PNG to write; with several families, one <stem>-<family>.png each beside it."),
    ] = Path("bench.png"),
) -> None:
    """Draw a benchmark run, one PNG per family (achieved GB/s or TFLOP/s per shape, launch-bound rows in µs, the
    better direction on each axis); no GPU needed."""
    from tunekit.evaluation.plot import plot_file

    for path in plot_file(results, out):
        console.print(f"png: {path}")


def record_cmd(
    kernel: KernelOpt,
    shape: ShapeOpt = None,
    dtype: DtypeOpt = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Tables file (default: timings/<device>/<kernel>.json.gz in the cache directory)."),
    ] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Processes compiling configs in parallel.")] = 8,
    cold_cache: Annotated[
        Path | None, typer.Option("--cold-cache", help="An empty directory for Triton's cache: cold compile times.")
    ] = None,
) -> None:
    """Exhaustive sweep: compile, verify and time every valid config on this GPU; save the timing tables."""
    import statistics

    from tunekit.core.device import fingerprint
    from tunekit.core.registry import get_spec
    from tunekit.evaluation.record import cold_triton_cache, merge_tables, record_table
    from tunekit.evaluation.timing_table import load_tables, save_tables
    from tunekit.store.shipped_data import recorded_table_path
    from tunekit.tuning.bench import CudaEventTimer

    if cold_cache is not None:
        cold_triton_cache(str(cold_cache))
    spec = get_spec(kernel)
    path = out or recorded_table_path(fingerprint().label, kernel)
    tables = []
    summary = Table(title=f"{kernel}: timing tables -> {path}")
    for col in ("problem", "configs", "ok", "wrong", "failed", "best ms", "median ms", "compile s (median)"):
        summary.add_column(col)
    for problem in kernel_problems(kernel, shape, dtype):
        table = record_table(spec, problem, CudaEventTimer(), workers=workers)
        tables.append(table)
        ok = table.ok_rows()
        compiles = [r.compile_s for r in table.rows if r.compile_s is not None]
        status = [r.status for r in table.rows]
        summary.add_row(
            spec.describe_problem(problem),
            str(len(table.rows)),
            str(status.count("ok")),
            str(status.count("wrong")),
            str(status.count("failed")),
            f"{ok[0].time_ms:.4f}" if ok else "-",
            f"{ok[len(ok) // 2].time_ms:.4f}" if ok else "-",
            f"{statistics.median(compiles):.2f}" if compiles else "-",
        )
        old = load_tables(path) if path.exists() else []
        save_tables(path, merge_tables(old, [table]))  # after every problem: a killed run keeps what it has
    console.print(summary)


def explain(
    kernel: KernelOpt,
    shape: Annotated[str, typer.Option("--shape", "-s", help="Problem shape, e.g. 4097x4096x4096.")],
    dtype: DtypeOpt = None,
    table: Annotated[
        str | None,
        typer.Option(
            "--table",
            help="Model the device a timing table was recorded on (default: this GPU): a table file, or a shipped "
            "table's name such as h200-sm90-132sm/gemm.",
        ),
    ] = None,
    json_out: JsonOpt = False,
) -> None:
    """The quantization model per candidate family: tiles, padded waste, occupancy, waves; what it prunes and why."""
    import json

    from tunekit.cli.width import columns
    from tunekit.core.device import fingerprint
    from tunekit.core.device_limits import device_limits
    from tunekit.core.registry import get_spec
    from tunekit.evaluation.timing_table import load_tables
    from tunekit.store.shipped_data import resolve_table, shipped_table_files, table_name
    from tunekit.tuning.explain import explain as explain_text

    spec = get_spec(kernel)
    (problem,) = kernel_problems(kernel, [shape], dtype)
    if table is not None:
        path = resolve_table(table)
        recorded = load_tables(path)
        if not recorded:
            raise TunekitError(f"{path} holds no timing tables")
        device, limits = recorded[0].fingerprint, recorded[0].device_limits
    else:
        device, found = fingerprint(), device_limits()
        if found is None:  # any table's device will do; the kernel's own, where one is shipped, reads best
            names = sorted(table_name(p) for p in shipped_table_files())
            suggested = next((n for n in names if n.endswith(f"/{kernel}")), names[0] if names else "FILE")
            raise TunekitError(f"no GPU here to model: run on a GPU, or model a recorded one with --table {suggested}")
        limits = found
    text = explain_text(spec, problem, device, limits, width=columns()) + _measured(spec, problem)
    if json_out:
        print(json.dumps({"kernel": kernel, "problem": dict(problem), "device": device.label, "text": text}, indent=1))
        return
    print(text)


def _measured(spec: KernelSpec, problem: Problem) -> str:
    """What was measured for the problem on this device, where an entry serves it: the tuner's time, torch's, and
    the in-step times (tune_model); "" where nothing was."""
    from tunekit.cli.views import in_step_text
    from tunekit.core.device import fingerprint
    from tunekit.runtime import version_policy
    from tunekit.runtime.dispatch import resolve
    from tunekit.store.entry import torch_time
    from tunekit.store.store import Store

    with Store() as store, version_policy.no_checks():  # explain reports; it never runs a kernel
        entry = resolve(spec, problem, fingerprint(), store).entry
    if entry is None or dict(entry.key.problem) != dict(problem):  # none, or the nearest problem's
        return ""
    torch_ms = torch_time(entry.provenance)
    lines = [f"Measured here: tuner {entry.time_ms:.4f} ms" + (f", torch {torch_ms:.4f} ms" if torch_ms else "")]
    in_step = in_step_text(entry)
    return "\n".join([*lines, *([in_step] if in_step else [])]) + "\n"


def efficiency(
    tables: Annotated[
        list[Path] | None,
        typer.Option(
            "--tables",
            help="Timing-table files (default: every shipped table and every one `tunekit record` wrote to the "
            "cache directory).",
        ),
    ] = None,
    strategies: Annotated[
        str, typer.Option("--strategies", help="Comma-separated: random, tpe, gp, exhaustive, model.")
    ] = "random,tpe,gp,exhaustive,model",
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="Seeds per strategy and shape.")] = 5,
    gp_cap: Annotated[int, typer.Option("--gp-cap", min=1, help="Trial cap for gp (Optuna's GP is slow to ask).")] = 30,
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="Processes (default: one per CPU).")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write every run and the aggregates as JSON.")] = None,
    in_sample: Annotated[
        bool,
        typer.Option(
            "--in-sample",
            help="Score the model strategy with one ranker fitted on every table, the scored one included (default: "
            "leave-one-shape-out, each table scored with a ranker fitted on the others).",
        ),
    ] = False,
) -> None:
    """Tuning efficiency on a simulated device: trials and simulated seconds until within 2% of the recorded best,
    and how close the first measured config is."""
    from tunekit.evaluation.efficiency import format_table, run_benchmark
    from tunekit.evaluation.timing_table import load_all
    from tunekit.store.shipped_data import default_table_files

    loaded = load_all(default_table_files() if tables is None else tables)
    if not loaded:
        raise TunekitError("no timing tables found (record some with `tunekit record` on a GPU)")
    names = [s.strip() for s in strategies.split(",") if s.strip()]
    if not names:
        raise TunekitError(f"--strategies takes a comma list of strategy names, but got {strategies!r}")
    result = run_benchmark(loaded, names, seeds, out, gp_trial_cap=gp_cap, workers=workers, in_sample=in_sample)
    print(format_table(result))


def devices(json_out: JsonOpt = False) -> None:
    """The devices tunekit sees, with their fingerprints and cache keys."""
    import json

    from tunekit.cli.views import device_json
    from tunekit.core.device import all_fingerprints

    found = all_fingerprints()
    if json_out:
        print(json.dumps({"devices": [device_json(fp) for fp in found]}, indent=1))
        return
    for fp in found:
        say(f"{fp.label}  key={fp.key}")
        for name, value in fp.to_json().items():
            say(f"  {name}: {printable(value)}")


def bench_host(
    rows: Annotated[int, typer.Option("--rows", min=1, help="Rows of each op's problem (a decode step's batch).")] = 8,
    width: Annotated[int, typer.Option("--width", min=1, help="Hidden size of each op's problem.")] = 1024,
    calls: Annotated[int, typer.Option("--calls", min=1, help="Calls per timed loop.")] = 3000,
    json_out: JsonOpt = False,
    out: Annotated[Path | None, typer.Option("--out", help="Also write the JSON to this file.")] = None,
) -> None:
    """Host time per eager call of every op, next to torch's equivalent, its bare launch and its GPU time."""
    import json

    from tunekit.evaluation.host_bench import measure, table

    result = measure(rows=rows, width=width, calls=calls)
    if out is not None:
        out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1) if json_out else table(result))
