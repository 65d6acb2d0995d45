"""tunekit.report and tunekit.plot: the method (check before timing, rates and floors), the arithmetic, the JSON,
the table and the PNG. Runs in the interpreter on tiny shapes; the GPU-only paths are covered through their pure
parts (timing selection, roofline) and a hand-made GPU run."""

from __future__ import annotations

import sys

import pytest
import torch

from tunekit import report
from tunekit.errors import TunekitError
from tunekit.plot import plot_file, plot_run
from tunekit.registry import get_spec
from tunekit.report import (
    COMPILED,
    EAGER,
    EVENTS,
    GRAPH,
    HEURISTIC,
    MAX_AUTOTUNE,
    SMALL_PROBLEM_BYTES,
    TUNEKIT,
    WALL,
    BenchOptions,
    BenchRun,
    Measurement,
    Row,
    roofline_ms,
    run_bench,
    timing_method,
)
from tunekit.suite import Baseline, families, work_list

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
    text = report.render(gpu_like_run())
    assert "copy bandwidth 4000 GB/s" in text and "bf16 matmul 800 TFLOP/s" in text
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
    plot_file(path, png)
    assert png.read_bytes()[:8] == PNG_SIGNATURE


def test_a_json_of_something_else_is_refused(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"format": "tunekit-db", "schema": 1}')
    with pytest.raises(TunekitError, match="not a tunekit-bench schema 1 file"):
        plot_file(path, tmp_path / "x.png")


def test_missing_matplotlib_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(TunekitError, match=r"needs matplotlib: pip install 'tunekit\[plot\]'"):
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
    text = report.render(quick_run)
    assert "interpreter wall-clock, not GPU performance" in text and "GB/s" not in text
    assert "32x32x64 bias_gelu bf16" in text and "16x256 fp16" in text
    png = tmp_path / "quick.png"
    plot_run(quick_run, png)
    assert png.read_bytes()[:8] == PNG_SIGNATURE


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
