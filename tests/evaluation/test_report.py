"""evaluation.report and evaluation.plot: the method (check before timing, rates and floors), the arithmetic, the JSON,
the table and the PNG. Runs in the interpreter on tiny shapes; the GPU-only paths are covered through their pure
parts (timing selection, roofline) and a hand-made GPU run."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from helpers import cli

from tunekit.core import backend
from tunekit.core.errors import TunekitError
from tunekit.core.registry import get_spec
from tunekit.evaluation import checked_timing, names, plot, reference_rates, report, report_tables, results, suite
from tunekit.evaluation.checked_timing import check_baseline, check_then_time
from tunekit.evaluation.names import COMPILED, COPY, EAGER, EVENTS, GRAPH, HEURISTIC, MAX_AUTOTUNE, TUNEKIT, WALL
from tunekit.evaluation.plot import plot_file, plot_run
from tunekit.evaluation.report import run_bench
from tunekit.evaluation.results import (
    AUTOGRAD_NOTE,
    SMALL_PROBLEM_BYTES,
    BenchOptions,
    BenchRun,
    Measurement,
    Row,
    roofline_ms,
    summarize,
    timing_method,
)
from tunekit.evaluation.runners import AutogradRunner, eager_runner
from tunekit.evaluation.suite import Baseline, families, work_list
from tunekit.tuning.bench import WallClockTimer
from tunekit.tuning.verify import check_outputs

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_cuda_graphs_only_for_small_problems_on_a_gpu():
    assert timing_method(1 << 20, interpreted=False) == GRAPH
    assert timing_method(SMALL_PROBLEM_BYTES - 1, interpreted=False) == GRAPH
    assert timing_method(SMALL_PROBLEM_BYTES, interpreted=False) == EVENTS
    assert timing_method(1 << 30, interpreted=False) == EVENTS
    assert timing_method(1 << 10, interpreted=True) == WALL
    assert timing_method(1 << 30, interpreted=True) == WALL


def test_layernorm_roofline_on_hand_counted_bytes():
    m, n = 4096, 4096
    problem = get_spec("layernorm").problem_from_shape((m, n), "float16")
    hand = 2 * m * n * 2 + 2 * n * 2  # x read and y written; weight and bias read (2-byte elements)
    assert get_spec("layernorm").bytes_moved(problem) == hand
    assert roofline_ms("memory", hand, 0, copy_gbps=4000.0, matmul_tflops=None) == pytest.approx(hand / 4000e9 * 1e3)


def test_layernorm_backward_counts_its_bytes_honestly():
    m, n = 1024, 4096
    problem = get_spec("layernorm_backward").problem_from_shape((m, n), "bfloat16")
    hand = (2 * m * n + m * n) * 2 + (n + n + n) * 2  # x, dy read, dx written; w read, dw, db written
    assert get_spec("layernorm_backward").bytes_moved(problem) == hand


def test_gemm_roofline_is_the_slower_of_flops_and_bytes():
    spec = get_spec("gemm")
    big = spec.problem_from_shape((8192, 8192, 8192), "bfloat16")
    skinny = spec.problem_from_shape((1, 4096, 4096), "bfloat16")
    rate, copy = 800.0, 4000.0
    assert roofline_ms("compute", spec.bytes_moved(big), spec.flops(big), copy, rate) == pytest.approx(
        2 * 8192**3 / 800e12 * 1e3
    )
    skinny_bytes = (4096 + 4096 * 4096 + 4096) * 2
    assert spec.bytes_moved(skinny) == skinny_bytes
    assert roofline_ms("compute", skinny_bytes, spec.flops(skinny), copy, rate) == pytest.approx(
        skinny_bytes / 4000e9 * 1e3
    )
    assert roofline_ms("compute", 1, 1, copy, None) is None
    assert roofline_ms("memory", 1, 1, None, None) is None


def gpu_like_run() -> BenchRun:
    """A hand-made GPU run: one bandwidth row, one launch-bound row, one GEMM row with a skipped cuBLASLt."""
    run = BenchRun("h200-sm90-132sm", "cuda-events-median-l2-flushed", False, "2.11.0", "3.6.0")
    run.copy_gbps, run.matmul_tflops, run.launch_floor_ms = 4000.0, 800.0, 0.002
    big = Row("layernorm", "layernorm", "4096x4096 fp16", {"rows": 4096}, "memory", 4 * 10**9, 0, EVENTS, 1.0)
    big.measurements = [
        Measurement(TUNEKIT, ms=2.0, timing=EVENTS, served_by="shipped", config={"BLOCK_N": 4096}),
        Measurement(EAGER, ms=4.0, timing=EVENTS),
        Measurement(COMPILED, "wrong", note="output 0: max abs error 1 over tolerance"),
        Measurement(COPY, ms=1.25, timing=EVENTS),
    ]
    small = Row("layernorm", "layernorm", "8x4096 fp16", {"rows": 8}, "memory", 131072, 0, GRAPH, 0.00003)
    small.measurements = [Measurement(TUNEKIT, ms=0.004, timing=GRAPH), Measurement(EAGER, ms=0.006, timing=GRAPH)]
    gemm = Row("gemm", "gemm", "4096x4096x4096 none bf16", {"m": 4096}, "compute", 10**8, 2 * 10**12, EVENTS, 2.5)
    gemm.measurements = [
        Measurement(TUNEKIT, ms=4.0, timing=EVENTS, served_by="cache"),
        Measurement(EAGER, ms=3.0, timing=EVENTS),
        Measurement("cuBLASLt", "skipped", note="no fused epilogue"),
    ]
    run.rows = [big, small, gemm]
    return run


def test_rates_and_ratios_of_a_row():
    big, small, gemm = gpu_like_run().rows
    assert big.throughput(TUNEKIT) == pytest.approx(2000.0)  # 4 GB in 2 ms
    assert big.speedup(TUNEKIT, EAGER) == pytest.approx(2.0)
    assert big.throughput(COMPILED) is None and big.speedup(TUNEKIT, COMPILED) is None
    assert small.launch_bound and small.throughput(TUNEKIT) is None  # launch-bound: never a bandwidth
    assert gemm.throughput(TUNEKIT) == pytest.approx(500.0)  # 2 TFLOP in 4 ms
    assert gemm.speedup(TUNEKIT, EAGER) == pytest.approx(0.75)


def test_gpu_table_shows_rates_roofline_floor_and_ratios():
    text = report_tables.render(gpu_like_run())
    assert "copy bandwidth 4000 GB/s" in text and "bf16 matmul 800 TFLOP/s" in text
    assert "tunekit/copy" in text and "3200" in text and "0.62" in text  # the copy of 4 GB in 1.25 ms; 1.25 / 2
    assert "vs copy" not in text  # a copy is what tunekit is held to, not a baseline it is compared with
    assert "launch floor 2.00 µs" in text
    assert "2000" in text and "4000" in text  # tunekit's GB/s, and the roofline (4 GB in 1 ms)
    assert "0.50" in text and "2.00x" in text  # tunekit / roofline, and vs torch
    assert "4.0 µs" in text and "floor 2.0 µs" in text  # the launch-bound row
    assert "WRONG" in text and "torch.compile wrong" in text and "n/a" in text
    assert "0.75x" in text and "500" in text  # GEMM: slower than torch here, and says so


def test_json_round_trip_and_png_from_a_json_fixture(tmp_path):
    run = gpu_like_run()
    path = tmp_path / "run.json"
    run.save(path)
    assert BenchRun.load(path) == run
    png = tmp_path / "run.png"
    paths = plot_file(path, png)  # one figure per family and timing kind, named after it, beside `png`
    families = list(dict.fromkeys((r.family, r.timing) for r in run.rows))
    assert len(paths) == len(families) > 1
    assert all(p.parent == tmp_path and p.name.startswith("run-") for p in paths)
    assert all(p.read_bytes()[:8] == PNG_SIGNATURE for p in paths)


def test_a_family_too_long_for_one_figure_is_drawn_in_parts(tmp_path):
    from dataclasses import replace

    from tunekit.evaluation.plot import MAX_ROWS

    row = gpu_like_run().rows[0]
    run = replace(gpu_like_run(), rows=[replace(row, label=f"{i}x{i}") for i in range(MAX_ROWS + 3)])
    paths = plot_run(run, tmp_path / "big.png")
    assert [p.name for p in paths] == [f"big-{row.family}-part1.png", f"big-{row.family}-part2.png"]


def test_a_json_of_something_else_is_refused(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"format": "tunekit-db", "schema": 1}')
    with pytest.raises(TunekitError, match="not a tunekit-bench schema 1 file"):
        plot_file(path, tmp_path / "x.png")


def test_missing_matplotlib_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(TunekitError, match=r"needs matplotlib: pip install 'tunekit-triton\[plot\]'"):
        plot_run(gpu_like_run(), tmp_path / "x.png")


@pytest.fixture(scope="module")
def quick_run() -> BenchRun:
    work = work_list("layernorm", None, [], None, quick=True, interpreted=True)
    work += work_list("gemm", None, [], None, quick=True, interpreted=True)
    return run_bench(work)


def test_quick_run_checks_every_implementation_in_the_interpreter(quick_run, tmp_path):
    assert {r.family for r in quick_run.rows} == {"layernorm", "gemm"}
    assert len(quick_run.rows) == len(families()["layernorm"].tiny) + len(families()["gemm"].tiny)
    for row in quick_run.rows:
        assert row.timing == WALL and row.roofline_ms is None
        impls = {m.impl: m for m in row.measurements}
        assert {TUNEKIT, HEURISTIC, EAGER} <= set(impls)
        assert COMPILED not in impls  # off by default in the interpreter, said once in the notes
        for m in row.measurements:
            if m.impl == "cuBLASLt" and m.status == "skipped":
                assert row.problem["has_residual"] or not row.problem["has_bias"]
                continue
            assert m.status == "ok" and m.ms is not None and m.ms > 0, (row.label, m)
        assert impls[TUNEKIT].served_by == "heuristic" and impls[TUNEKIT].config
    assert quick_run.copy_gbps is None and quick_run.matmul_tflops is None  # no rates claimed in the interpreter
    assert quick_run.launch_floor_ms is not None
    assert any("torch.compile skipped" in n for n in quick_run.notes)
    path = tmp_path / "quick.json"
    quick_run.save(path)
    assert BenchRun.load(path) == quick_run
    text = report_tables.render(quick_run)
    assert "interpreter wall-clock, not GPU performance" in text and "GB/s" not in text
    assert "32x32x64 bias_gelu bf16" in text and "16x256 fp16" in text
    paths = plot_run(quick_run, tmp_path / "quick.png")
    assert [p.name for p in paths] == ["quick-layernorm.png", "quick-gemm.png"]
    assert all(p.read_bytes()[:8] == PNG_SIGNATURE for p in paths)


def test_a_wrong_implementation_is_never_timed():
    layernorm = families()["layernorm"]

    def off_by_one(inputs):
        x, w, b, eps = inputs
        return lambda: torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps) + 1

    broken = type(layernorm)(**{**vars(layernorm), "baselines": (Baseline("broken", off_by_one),)})
    run = run_bench([(broken, layernorm.tiny[0])], BenchOptions(heuristic=False))
    m = run.rows[0].get("broken")
    assert m is not None and m.status == "wrong" and m.ms is None and "over tolerance" in m.note


def test_torch_compile_path_runs_when_asked():
    """--compile in the interpreter, through dynamo's eager backend (inductor's C++ build takes ~15 s a shape)."""
    work = [(families()["layernorm"], families()["layernorm"].tiny[0])]
    work.append((families()["layernorm_backward"], families()["layernorm_backward"].tiny[0]))
    run = run_bench(work, BenchOptions(compile=True, heuristic=False, compile_backend="eager"))
    for row in run.rows:
        m = row.get(COMPILED)
        assert m is not None and m.status == "ok" and m.ms is not None, (row.label, m)


def test_torch_compile_without_a_cxx_compiler_is_skipped_with_a_reason(monkeypatch):
    monkeypatch.setattr(report, "_cxx_compiler", lambda: None)
    run = run_bench([(families()["softmax"], families()["softmax"].tiny[0])], BenchOptions(compile=True))
    assert COMPILED not in {m.impl for m in run.rows[0].measurements}
    assert any("needs a C++ compiler" in n for n in run.notes)


def test_max_autotune_runs_in_a_child_process_and_is_killed_at_its_limit():
    gemm = families()["gemm"]
    problem = gemm.tiny[1]  # bias + relu
    run = run_bench([(gemm, problem)], BenchOptions(heuristic=False, max_autotune=True, compile_backend="eager"))
    m = run.rows[0].get(MAX_AUTOTUNE)
    assert m is not None and m.status == "ok" and m.ms is not None, m
    limited = BenchOptions(heuristic=False, max_autotune=True, compile_backend="eager", compile_timeout_s=0.05)
    m = run_bench([(gemm, problem)], limited).rows[0].get(MAX_AUTOTUNE)
    assert m is not None and m.status == "timeout" and "0.05 s" in m.note


def test_max_autotune_is_skipped_in_the_interpreter_with_inductor():
    gemm = families()["gemm"]
    run = run_bench([(gemm, gemm.tiny[0])], BenchOptions(heuristic=False, max_autotune=True))
    m = run.rows[0].get(MAX_AUTOTUNE)
    assert m is not None and m.status == "skipped" and "GPU" in m.note


# ---------------------------------------------------------------------------------------------- baseline tolerance

BF16_ULP_AT_4 = 2.0**-5  # one bf16 ulp of a value in [4, 8): what torch eager's rounded intermediates cost


def gelu_residual_inputs():
    """The tiny bias + GELU + residual GEMM in bf16, with the suite's alpha = beta = 1, and its reference."""
    gemm, spec = families()["gemm"], get_spec("gemm")
    problem = next(p for p in gemm.tiny if suite.epilogue_of(p) == "bias_gelu_residual")
    inputs = gemm.adapt_inputs(spec.make_inputs(problem, backend.torch_device(), suite.SEED))
    return gemm, problem, spec, inputs


def one_ulp_off(spec, inputs):
    """The reference, with one bf16 ulp of a magnitude-4 intermediate added where the output is nearest zero."""
    (y,) = spec.reference(inputs)
    y = y.clone()
    flat = y.view(-1)
    flat[flat.abs().argmin()] += BF16_ULP_AT_4
    return (y,)


def no_bias(spec, inputs):
    a, b, _, residual, activation, alpha, beta = inputs
    return spec.reference((a, b, None, residual, activation, alpha, beta))


def test_baselines_are_checked_relative_to_the_output_scale():
    _, _, spec, inputs = gelu_residual_inputs()
    expected = spec.reference(inputs)
    assert float(expected[0].abs().max()) > 2.0  # the ulp is a rounding error next to this output's scale
    rounded = one_ulp_off(spec, inputs)
    assert check_outputs(spec, rounded, expected) is not None  # the kernel's own tolerance rejects it ...
    assert check_baseline(spec, rounded, expected) is None  # ... a baseline's absorbs it
    (y,) = expected
    for wrong in (no_bias(spec, inputs), (torch.zeros_like(y),), (torch.randn_like(y.float()).to(y.dtype),)):
        assert "output 0: max abs error" in (check_baseline(spec, wrong, expected) or "")
    assert check_baseline(spec, (y[:1],), expected) is not None  # and a wrong shape


def test_a_baseline_off_by_rounding_is_timed_and_a_wrong_one_is_not():
    gemm, problem, spec, _ = gelu_residual_inputs()
    fakes = {
        "rounded": lambda inputs: lambda: one_ulp_off(spec, inputs),
        "no bias": lambda inputs: lambda: no_bias(spec, inputs),
        "zeros": lambda inputs: lambda: (torch.zeros_like(spec.reference(inputs)[0]),),
    }
    family = type(gemm)(**{**vars(gemm), "baselines": tuple(Baseline(n, b) for n, b in fakes.items())})
    row = run_bench([(family, problem)], BenchOptions(heuristic=False)).rows[0]
    assert row.get("rounded").status == "ok" and row.ms("rounded") is not None
    for name in ("no bias", "zeros"):
        m = row.get(name)
        assert m is not None and m.status == "wrong" and m.ms is None and "over tolerance" in m.note, m


def test_tunekit_kernels_keep_the_kernels_tolerance():
    _, _, spec, inputs = gelu_residual_inputs()
    expected = spec.reference(inputs)
    build = lambda: lambda: one_ulp_off(spec, inputs)  # noqa: E731
    timer = WallClockTimer()
    assert check_then_time(TUNEKIT, build, spec, expected, WALL, timer, baseline=False).status == "wrong"
    assert check_then_time(EAGER, build, spec, expected, WALL, timer, baseline=True).status == "ok"


# ---------------------------------------------------------------------------------------------- copy of the bytes


class FixedTimer:
    """Runs the function once and answers a fixed time (the GPU-only paths, exercised on the CPU)."""

    label = "fixed"

    def __init__(self, ms: float = 0.01) -> None:
        self.ms = ms
        self.calls = 0

    def __call__(self, fn, config) -> float:
        fn()
        self.calls += 1
        return self.ms


def gpu_context(timer, interpreted=False):
    return report._Context(BenchOptions(heuristic=False), timer, interpreted, 4000.0, 800.0, False)


def test_memory_rows_time_a_copy_of_their_own_bytes(monkeypatch):
    copied = []
    real = reference_rates.copy_runner
    monkeypatch.setattr(reference_rates, "copy_runner", lambda nbytes: copied.append(nbytes) or real(nbytes))
    monkeypatch.setattr(report, "timing_method", lambda nbytes, interpreted: EVENTS)  # a bandwidth-sized row
    layernorm, gemm = families()["layernorm"], families()["gemm"]
    row = report.measure_row(layernorm, layernorm.tiny[0], gpu_context(FixedTimer()))
    m = row.get(COPY)
    assert m is not None and m.status == "ok" and m.timing == EVENTS and m.ms == 0.01
    assert copied == [row.bytes_moved // 2]  # half read, half written: the row's bytes
    assert results.row_ratio(row, names.COPY_RATIO) == pytest.approx(1.0)
    assert report.measure_row(gemm, gemm.tiny[0], gpu_context(FixedTimer())).get(COPY) is None  # compute-bound


def test_launch_bound_rows_time_no_copy(monkeypatch):
    monkeypatch.setattr(checked_timing, "time_graphed", lambda timer, run: 0.002)
    layernorm = families()["layernorm"]
    row = report.measure_row(layernorm, layernorm.tiny[0], gpu_context(FixedTimer()))
    assert row.timing == GRAPH and row.get(COPY) is None  # held to the launch floor instead
    assert row.get(TUNEKIT).timing == GRAPH


OLD_ROW = {  # a row of the first H200 run's JSON: written before rows timed a copy of their bytes
    "family": "layernorm",
    "kernel": "layernorm",
    "label": "4096x4096 fp16",
    "problem": {"rows": 4096, "cols": 4096, "dtype": "float16", "weight": True, "bias": True},
    "bound": "memory",
    "bytes_moved": 67125248,
    "flops": 134217728,
    "timing": "cuda-events",
    "roofline_ms": 0.015807858597327144,
    "measurements": [
        {"impl": "tunekit", "status": "ok", "ms": 0.022784, "timing": "cuda-events", "note": "",
         "served_by": "shipped", "config": {"BLOCK_N": 4096}},
        {"impl": "torch", "status": "ok", "ms": 0.033792, "timing": "cuda-events", "note": "",
         "served_by": None, "config": None},
    ],
}  # fmt: skip


def test_a_json_without_copies_still_loads_renders_and_summarizes(tmp_path):
    path = tmp_path / "old.json"
    old = {"format": "tunekit-bench", "schema": 1, "device": "h200-sm90-132sm", "timer": "cuda-events"}
    old |= {"interpreted": False, "torch_version": "2.11.0", "triton_version": "3.6.0", "copy_gbps": 4246.3}
    path.write_text(json.dumps({**old, "rows": [OLD_ROW]}))
    run = BenchRun.load(path)
    assert run.rows[0].get(COPY) is None
    text = report_tables.render(run)
    (columns,) = [line for line in text.splitlines() if "problem" in line]
    assert "tunekit/bound" in columns and "tunekit/copy" not in columns and "copy" not in columns
    assert "layernorm [width multiple of 8] tunekit/copy >= 0.90: not measured (1 GiB roofline: 0.69" in text
    assert "copy not measured" in text
    plot_run(run, tmp_path / "old.png")


# ---------------------------------------------------------------------------------------------- autograd, capture


def layernorm_backward_row_inputs():
    family, spec = families()["layernorm_backward"], get_spec("layernorm_backward")
    inputs = spec.make_inputs(family.tiny[0], backend.torch_device(), suite.SEED)
    return family, spec, inputs


def test_autograd_baselines_are_timed_with_events_and_never_captured(monkeypatch):
    captured = []
    monkeypatch.setattr(checked_timing, "time_graphed", lambda timer, run: captured.append(run) or 0.002)
    family, _, inputs = layernorm_backward_row_inputs()
    row = report.measure_row(family, family.tiny[0], gpu_context(FixedTimer(0.0195)))
    assert row.timing == GRAPH
    tunekit, torch_m = row.get(TUNEKIT), row.get(EAGER)
    assert tunekit.timing == GRAPH and tunekit.ms == 0.002  # tunekit's kernel: a graph, as before
    assert torch_m.status == "ok" and torch_m.timing == EVENTS and torch_m.note == AUTOGRAD_NOTE
    assert not any(isinstance(run, AutogradRunner) for run in captured)
    assert isinstance(eager_runner(family.torch_program(inputs)), AutogradRunner)
    # Graph µs and events µs are not compared: no ratio; the cell says how it was timed; the plot leaves it out.
    assert row.speedup(TUNEKIT, EAGER) is None
    assert report_tables._cell(row, EAGER) == "19.5 µs (events)"
    assert plot._value(row, EAGER) is None and plot._value(row, TUNEKIT) == pytest.approx(2.0)


def test_a_failed_capture_is_settled_before_falling_back_to_events(monkeypatch):
    def failed_capture(timer, run):
        raise RuntimeError("CUDA error: operation failed due to a previous error during capture")

    settled = []
    monkeypatch.setattr(checked_timing, "time_graphed", failed_capture)
    monkeypatch.setattr(checked_timing, "_after_failed_capture", lambda: settled.append(True))
    ms, timing, note = checked_timing.time_run(lambda: None, GRAPH, FixedTimer(0.5))
    assert (ms, timing) == (0.5, EVENTS) and note.startswith("graph capture failed") and settled == [True]

    def context_in_error():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(checked_timing, "_after_failed_capture", context_in_error)  # reported here, not on the next row
    _, spec, inputs = layernorm_backward_row_inputs()
    build = lambda: lambda: spec.reference(inputs)  # noqa: E731
    m = check_then_time(EAGER, build, spec, spec.reference(inputs), GRAPH, FixedTimer(), baseline=True)
    assert m.status == "failed" and "illegal memory access" in m.note and m.ms is None


# ---------------------------------------------------------------------------------------------- summary


def _row(family: str, problem: dict, timing: str, bound: str = "memory", **ms: float | str) -> Row:
    """A row of hand-made times: impl=ms (or impl="skipped")."""
    row = Row(family, family, family, dict(problem), bound, 10**9, 10**12, timing, 0.5)
    names = {"tunekit": TUNEKIT, "torch": EAGER, "copy": COPY, "cublaslt": "cuBLASLt"}
    for key, value in ms.items():
        impl = names[key]
        if value == "skipped":
            row.measurements.append(Measurement(impl, "skipped", note="cuBLASLt has no fused epilogue for this"))
        else:
            row.measurements.append(Measurement(impl, ms=float(value), timing=timing))
    return row


def summary_run() -> BenchRun:
    """layernorm at a width multiple of 8, at 2^k+1, and launch-bound; GEMMs large (one without cuBLASLt) and
    skinny."""
    run = gpu_like_run()
    ln = get_spec("layernorm")
    gemm = lambda m, epilogue: suite.gemm_problem(m, 4096, 4096, "bfloat16", epilogue)  # noqa: E731
    run.rows = [
        _row("layernorm", ln.problem_from_shape((4096, 4096), "float16"), EVENTS, tunekit=2.0, copy=1.9, torch=5.0),
        _row("layernorm", ln.problem_from_shape((4096, 4097), "float16"), EVENTS, tunekit=2.0, copy=1.5, torch=4.0),
        _row("layernorm", ln.problem_from_shape((8, 4096), "float16"), GRAPH, tunekit=0.004, torch=0.4),
        _row("gemm", gemm(4096, "bias_relu"), EVENTS, "compute", tunekit=0.9, torch=1.2, cublaslt=1.0),
        _row("gemm", gemm(4096, "none"), EVENTS, "compute", tunekit=1.0, torch=1.0, cublaslt="skipped"),
        _row("gemm", gemm(16, "bias_relu"), EVENTS, "compute", tunekit=1.0, torch=1.0, cublaslt=0.8),
    ]
    return run


def _target(summary: dict, family: str, group: str, ratio: str) -> dict:
    (found,) = [t for t in summary["targets"] if (t["family"], t["group"], t["ratio"]) == (family, group, ratio)]
    return found


def test_summary_geomeans_over_non_launch_bound_rows_and_judges_the_targets():
    summary = summarize(summary_run())
    assert summary is not None
    width8 = _target(summary, "layernorm", suite.WIDTH_8, names.COPY_RATIO)
    assert width8["value"] == pytest.approx(0.95) and width8["holds"] and width8["rows"] == 1
    assert width8[names.BOUND_RATIO] == pytest.approx(0.25)  # the 1 GiB roofline's ratio beside it
    odd = _target(summary, "layernorm", suite.WIDTH_ODD, names.COPY_RATIO)
    assert odd["value"] == pytest.approx(0.75) and not odd["holds"]
    eager = _target(summary, "layernorm", suite.ALL, "vs torch")
    assert eager["value"] == pytest.approx(5**0.5) and eager["rows"] == 2  # the launch-bound row's 100x left out
    compiled = _target(summary, "layernorm", suite.ALL, "vs torch.compile")
    assert compiled["value"] is None and compiled["left_out"] == {"torch.compile not measured": 2}
    large = _target(summary, "gemm", suite.GEMM_LARGE, "vs cuBLASLt")
    assert large["value"] == pytest.approx(1 / 0.9) and (large["rows"], large["of"]) == (1, 2)
    assert list(large["left_out"]) == ["cuBLASLt n/a: cuBLASLt has no fused epilogue for this"]
    skinny = _target(summary, "gemm", suite.GEMM_SKINNY, "vs cuBLASLt")
    assert skinny["value"] == pytest.approx(0.8) and not skinny["holds"]
    assert _target(summary, "gemm", suite.ALL, "vs torch")["value"] == pytest.approx((1.2 / 0.9) ** (1 / 3))
    assert not [t for t in summary["targets"] if t["family"] not in ("layernorm", "gemm")]  # families not run
    groups = {(g["family"], g["group"]): g["rows"] for g in summary["geomeans"]}
    assert groups[("layernorm", suite.ALL)] == 2 and groups[("layernorm", suite.WIDTH_ODD)] == 1


def test_summary_is_printed_and_stored_and_recomputed_from_a_saved_json(tmp_path):
    run = summary_run()
    text = report_tables.render(run, width=250)
    assert text.index("summary: geomeans") > text.index("gemm: TFLOP/s")  # after the tables
    assert "layernorm [width multiple of 8] tunekit/copy >= 0.90: 0.95 holds (1 GiB roofline: 0.25; 1 row)" in text
    assert "layernorm [width 2^k±1] tunekit/copy >= 0.80: 0.75 missed by 0.05" in text
    assert "gemm [skinny M (1-128)] vs cuBLASLt >= 0.90x: 0.80x missed by 0.10x" in text
    assert "1 of 2 rows; left out: 1 cuBLASLt n/a" in text
    path = tmp_path / "run.json"
    run.save(path)
    stored = json.loads(path.read_text())["summary"]
    assert stored == json.loads(json.dumps(summarize(run)))
    assert BenchRun.load(path) == run  # the summary is derived, never read back
    result = cli("bench", "--summary", str(path), env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "0.75 missed by 0.05" in result.output and "copy bandwidth 4000 GB/s" in result.output
    assert "layernorm: GB/s" not in result.output  # the summary, not the tables again


def test_no_summary_for_an_interpreter_run(quick_run, tmp_path):
    assert summarize(quick_run) is None
    assert "summary: none in the interpreter" in report_tables.render(quick_run)
    path = tmp_path / "quick.json"
    quick_run.save(path)
    assert json.loads(path.read_text())["summary"] is None
