"""`tunekit model-bench` on a CPU: its table, JSON and PNG, the workflow's bookkeeping, the command's arguments and
its refusal without a GPU. The GPU measurement itself (tunekit.evaluation.model_bench.measure) is replaced by fakes;
the workflow's record -> tune -> serve path runs for real on a tiny Llama in the interpreter."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import cli

from tunekit.core.errors import TunekitError
from tunekit.evaluation import model_bench, model_results, model_run, model_workflow
from tunekit.evaluation.model_plot import plot_speeds, speed_bars
from tunekit.evaluation.model_results import Result, Workload, skipped, speed_vs_eager, table, write_json
from tunekit.evaluation.model_run import ModelBenchRun, WorkflowOptions, run_bench, write_outputs
from tunekit.evaluation.model_workflow import WorkflowReport, run_workflow, serving_from
from tunekit.evaluation.plan_tuning import TuneCounts, tune_plan
from tunekit.runtime import dispatch


def row(model: str, variant: str, run: str, ms: float, **extra: Any) -> Result:
    return Result(model, variant, run, ms, tokens_per_s=1000.0 / ms, peak_gib=1.5, **extra)


def sample() -> list[Result]:
    return [
        row("llama", "eager", "prefill", 10.0),
        row("llama", "eager", "decode", 2.0),
        row("llama", "tunekit", "prefill", 5.0, logits_rel_err=0.001, argmax_agree=0.999),
        row("llama", "tunekit", "decode", 4.0),
        skipped("llama", "liger", "liger-kernel is not installed"),
        row("gpt2", "eager", "prefill", 8.0),
        row("gpt2", "tunekit+compile (tuned plan)", "prefill", 2.0),
    ]


def test_speed_vs_eager_is_eager_time_over_the_variants():
    speeds = speed_vs_eager(sample())
    assert speeds[("llama", "prefill", "tunekit")] == 2.0
    assert speeds[("llama", "decode", "tunekit")] == 0.5
    assert speeds[("gpt2", "prefill", "tunekit+compile (tuned plan)")] == 4.0
    assert speeds[("llama", "prefill", "eager")] == 1.0
    assert not any(variant == "liger" for _, _, variant in speeds)  # skipped: nothing to compare
    assert ("gpt2", "decode", "tunekit") not in speeds  # no such row


def test_table_rows_ratios_and_skips():
    lines = table(sample()).splitlines()
    assert len(lines) == 1 + len(sample())
    by_start = {tuple(line.split()[:3]): line for line in lines[1:]}
    assert "2.00x" in by_start[("llama", "prefill", "tunekit")]
    assert "0.50x" in by_start[("llama", "decode", "tunekit")]
    assert "0.0010" in by_start[("llama", "prefill", "tunekit")]  # the logits error
    assert "skipped: liger-kernel is not installed" in by_start[("llama", "-", "liger")]
    # A long variant name widens the column instead of shifting its row's numbers.
    tuned = next(line for line in lines if "(tuned plan)" in line)
    assert tuned.index("4.00x") == by_start[("llama", "prefill", "tunekit")].index("2.00x")


def test_the_first_call_s_seconds_show_where_measured():
    rows = [row("llama", "eager", "prefill", 10.0), row("llama", "compile-ro", "prefill", 5.0, first_call_s=12.345)]
    header, eager, compiled = table(rows).splitlines()
    assert header.endswith("1st call s") and compiled.endswith("12.35") and not eager.rstrip().endswith("12.35")


def test_every_compile_mode_runs_its_variant(monkeypatch):
    """compile and tunekit+compile in torch.compile's default mode, the -ro pair in reduce-overhead; the tunekit
    variants patched."""
    import torch

    seen = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: seen.append(kw) or model)
    monkeypatch.setattr(model_bench, "patch", lambda model: seen.append("patched"))
    base = torch.nn.Linear(2, 2)
    for name in model_results.VARIANTS[:-1]:  # liger: its own patch
        seen.clear()
        model, run = model_bench._variant(base, name, "llama")
        assert model is not base and run is model
        expected = (["patched"] if name.startswith("tunekit") else []) + (
            [{"mode": "reduce-overhead"}] if name.endswith("-ro") else [{}] if name.endswith("compile") else []
        )
        assert seen == expected, name


def test_the_choices_variants_compile_the_unpatched_model_with_tunekits_gemm_choices(monkeypatch):
    """tiles+compile: the model's own code, compiled with tunekit's choices class as Inductor's (GEMM templates
    offered, untuned GEMMs searched by Inductor); -ro adds CUDA graphs, as reduce-overhead does."""
    pytest.importorskip("torch._inductor.kernel_template_choice")
    import torch

    seen = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: seen.append(kw) or model)
    monkeypatch.setattr(model_bench, "patch", lambda model: seen.append("patched"))
    for name in model_results.CHOICES_VARIANTS:
        seen.clear()
        model_bench._variant(torch.nn.Linear(2, 2), name, "llama")
        [kw] = seen
        options = kw["options"]
        assert options["max_autotune_gemm"] is True and options["inductor_choices_class"].untuned == "inductor"
        assert options.get("triton.cudagraphs", False) is name.endswith("-ro"), name


def test_the_choices_variants_are_opt_in_and_rerun_by_the_workflow():
    from tunekit.cli.models import parse_variants

    assert not set(model_results.CHOICES_VARIANTS) & set(model_results.VARIANTS)  # not in a default run
    assert parse_variants("liger,tiles+compile-ro,compile,tiles+compile") == (
        "compile", "tiles+compile", "tiles+compile-ro", "liger",
    )  # fmt: skip
    assert model_results.rerun_variants(("compile", "tiles+compile")) == ("tiles+compile",)


def test_json_holds_the_context_and_no_nan(tmp_path, monkeypatch):
    monkeypatch.setattr(model_results, "DISTRIBUTIONS", ("torch", "triton", "no-such-distribution-xyz"))
    path = tmp_path / "bench.json"
    write_json(sample(), path, {"device": "Fake GPU", "versions": model_results.versions()})
    doc = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert doc["device"] == "Fake GPU"
    assert (
        doc["versions"]["torch"] and doc["versions"]["triton"] and doc["versions"]["no-such-distribution-xyz"] is None
    )
    assert [(r["model"], r["variant"], r["run"]) for r in doc["results"]] == [
        (r.model, r.variant, r.run) for r in sample()
    ]
    liger = doc["results"][4]
    assert liger["ms"] is None and liger["notes"] == ["liger-kernel is not installed"]
    assert doc["results"][2]["logits_rel_err"] == 0.001


def test_speed_bars_group_by_model_and_run():
    groups, bars = speed_bars(sample())
    assert groups == ["llama prefill", "llama decode", "gpt2 prefill"]
    assert bars == {"tunekit": [2.0, 0.5, None], "tunekit+compile (tuned plan)": [None, None, 4.0]}


def test_png_is_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    out = plot_speeds(sample(), tmp_path / "sub" / "speeds.png", "Fake GPU")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(TunekitError, match="nothing to draw"):
        plot_speeds([row("llama", "eager", "prefill", 1.0)], tmp_path / "eager.png", "Fake GPU")


def _run_of(results: list[Result], workflows: list[WorkflowReport] | None = None) -> ModelBenchRun:
    run = ModelBenchRun([Workload("llama", hidden=64)], ("eager", "tunekit"), 3, "Fake GPU", results)
    run.workflows = workflows or []
    return run


def test_outputs_without_matplotlib_skip_only_the_png(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    lines = write_outputs(_run_of(sample()), tmp_path)
    assert lines[-1].startswith("png skipped:") and "matplotlib" in lines[-1]
    assert not (tmp_path / model_run.PNG_NAME).exists()
    assert json.loads((tmp_path / model_run.JSON_NAME).read_text())["workloads"][0]["hidden"] == 64
    assert (tmp_path / model_run.TABLE_NAME).read_text().startswith("model ")


def _report(tmp_path: Path, trials: int) -> WorkflowReport:
    return WorkflowReport("llama", trials, str(tmp_path / "work-cache"), False, str(tmp_path / "plan.jsonl"))


def test_workflow_bookkeeping(tmp_path, isolated_cache):
    ticks = iter([100.0, 101.5, 111.5, 114.0])  # start, recorded, tuned, rerun done
    seen: dict[str, object] = {}
    report = _report(tmp_path, trials=3)
    dispatch.dispatcher("layernorm").memo["key"] = {"BLOCK": 1}  # resolved before: must not serve the rerun

    def record(plan: Path) -> int:
        seen["plan"] = plan
        return 7

    def tune(plan: Path, cache: Path, trials: int) -> TuneCounts:
        seen["tune"] = (plan, cache, trials)
        return TuneCounts(tuned=5, skipped=1, failed=["gemm m=1: boom"])

    def rerun() -> list[Result]:
        seen["cache"] = os.environ["TUNEKIT_CACHE_DIR"]
        seen["memo"] = dict(dispatch.dispatcher("layernorm").memo)
        return [row("llama", "eager", "prefill", 10.0), row("llama", "tunekit", "prefill", 4.0)]

    rows = run_workflow(report, record, tune, rerun, clock=lambda: next(ticks))
    assert seen["plan"] == Path(report.plan) and seen["tune"] == (Path(report.plan), Path(report.cache_dir), 3)
    assert seen["cache"] == report.cache_dir and seen["memo"] == {}
    assert os.environ["TUNEKIT_CACHE_DIR"] == str(isolated_cache)  # restored after the rerun
    assert [(r.variant, r.ms) for r in rows] == [("tunekit (tuned plan)", 4.0)]  # its eager reference dropped
    assert (report.problems, report.tuned, report.skipped, report.failed) == (7, 5, 1, ["gemm m=1: boom"])
    assert (report.record_s, report.tune_s, report.rerun_s, report.total_s) == (1.5, 10.0, 2.5, 14.0)
    assert "7 problems recorded, 5 tuned at 3 trials (1 already tuned, 1 failed)" in report.summary()


def test_serving_from_restores_an_unset_variable(tmp_path, monkeypatch):
    monkeypatch.delenv("TUNEKIT_CACHE_DIR")
    with serving_from(tmp_path):
        assert os.environ["TUNEKIT_CACHE_DIR"] == str(tmp_path)
    assert "TUNEKIT_CACHE_DIR" not in os.environ


def test_the_workflow_records_tunes_and_serves_from_the_tuned_cache(tmp_path):
    """A tiny patched Llama in the interpreter: its recorded problems are tuned (1 trial each) into a working cache,
    and the rerun is served from that cache for every one of them."""
    transformers = pytest.importorskip("transformers")
    import torch

    from tunekit.integrations.patching import patch

    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    patch(model)
    ids = model_bench.inputs(
        Workload("llama", vocab=64, prefill=(2, 8), decode=(2, 1), train=(2, 8)), torch.device("cpu")
    )
    report = _report(tmp_path, trials=1)
    served: dict[str, str] = {}

    def rerun() -> list[Result]:
        model_bench.run_once(model, model, ids)
        for name, d in dispatch._DISPATCHERS.items():
            served.update({f"{name} {key}": layer for key, layer in d.served_by.items()})
        return []

    record = lambda plan: model_workflow.record_plan(model, ids, plan)  # noqa: E731
    run_workflow(report, record, tune_plan, rerun)
    plan_lines = Path(report.plan).read_text().splitlines()
    assert report.problems == len(plan_lines) > 10 and report.tuned == report.problems and not report.failed
    assert len(served) == report.problems and set(served.values()) == {"cache"}, served
    again = tune_plan(Path(report.plan), Path(report.cache_dir), 1)
    assert (again.tuned, again.skipped) == (0, report.problems)  # tuned to the budget: nothing measured twice
    # Each problem's seconds by phase (tunekit.tuning.phases): a tuned problem starts, compiles and times nothing.
    assert len(again.phases) == report.problems
    assert {again.phase_totals()[p] for p in ("startup", "compile", "verify", "bench")} == {0.0}


def _fake_measure(w: Workload, variants: tuple[str, ...], reps: int) -> list[Result]:
    """measure's rows without a GPU: eager first, always, then each other variant once."""
    ms = {"eager": 10.0, "tunekit": 5.0, "compile": 8.0, "tunekit+compile": 4.0, "liger": 6.0}
    ms |= {"compile-ro": 7.0, "tunekit+compile-ro": 3.5}
    order = ("eager", *(v for v in variants if v != "eager"))
    return [row(w.model, v, "prefill", ms[v] * w.layers / reps) for v in order]


def test_run_bench_gives_each_model_its_own_temporary_cache(tmp_path):
    reports: list[WorkflowReport] = []

    def workflow(w: Workload, variants: tuple[str, ...], reps: int, report: WorkflowReport) -> list[Result]:
        assert variants == ("tunekit",)  # of the run's variants, only those dispatch serves are rerun
        Path(report.cache_dir).mkdir()
        reports.append(report)
        return model_workflow.tuned_rows(_fake_measure(w, variants, reps))

    run = ModelBenchRun([Workload("llama"), Workload("gpt2")], ("eager", "tunekit", "compile"), 2, "Fake GPU")
    run_bench(run, WorkflowOptions(trials=4), tmp_path, _fake_measure, workflow)
    assert [(r.model, r.variant) for r in run.results] == [
        (m, v) for m in ("llama", "gpt2") for v in ("eager", "tunekit", "compile", "tunekit (tuned plan)")
    ]
    assert run.workflows == reports and [r.trials for r in reports] == [4, 4]
    assert reports[0].cache_dir != reports[1].cache_dir and not any(r.cache_kept for r in reports)
    assert not any(Path(r.cache_dir).exists() for r in reports)  # temporary: deleted after the run
    assert [Path(r.plan) for r in reports] == [tmp_path / f"model_bench_plan_{m}.jsonl" for m in ("llama", "gpt2")]
    assert run.context()["workflow"][1]["model"] == "gpt2"


def test_run_bench_with_a_named_cache_keeps_it(tmp_path):
    caches: list[str] = []

    def workflow(w: Workload, variants: tuple[str, ...], reps: int, report: WorkflowReport) -> list[Result]:
        caches.append(report.cache_dir)
        assert report.cache_kept
        return []

    run = ModelBenchRun([Workload("llama"), Workload("gpt2")], ("tunekit+compile",), 2, "Fake GPU")
    run_bench(run, WorkflowOptions(trials=4, cache_dir=tmp_path / "mine"), None, _fake_measure, workflow)
    assert caches == [str(tmp_path / "mine")] * 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "bert"], "--model must be one of llama, gpt2, mistral, qwen2, gemma or all, but got 'bert'"),
        (["--variants", "eager,fast"], "--variants takes a comma list of eager, tunekit"),
        (["--variants", ","], "--variants takes a comma list"),
        (["--prefill", "4x"], "--prefill must be batch x tokens"),
        (["--decode", "0x1"], "--decode must be batch x tokens"),
        (["--train", "2x3x4"], "--train must be batch x tokens"),
        (["--hidden", "100"], "--hidden must be a multiple of 64 for gpt2"),
        (["--workflow", "--variants", "eager,compile"], "the workflow reruns tunekit, tunekit+compile"),
        (["--cache-dir", "c"], "--cache-dir is the workflow's cache: it goes with --workflow"),
        ([], "the model benchmark times CUDA GPUs"),
        (["--model", "llama", "--hidden", "100"], "the model benchmark times CUDA GPUs"),  # llama takes any width
    ],
)
def test_command_errors_are_one_line(args, message, monkeypatch):
    from tunekit.core import backend

    monkeypatch.setattr(backend, "INTERPRETED", True)  # as on this CPU machine, also on a GPU one: nothing runs
    result = cli("model-bench", *args)
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.output


def test_command_measures_runs_the_workflow_and_writes_the_outputs(tmp_path, monkeypatch):
    """As on a GPU, with the measurements faked: the options reach the workloads, the outputs are written."""
    from tunekit.core import backend

    measured: list[Workload] = []

    def measure(w: Workload, variants: tuple[str, ...], reps: int) -> list[Result]:
        measured.append(w)
        return _fake_measure(w, variants, reps)

    def workflow(w: Workload, variants: tuple[str, ...], reps: int, report: WorkflowReport) -> list[Result]:
        report.problems, report.tuned = 3, 3
        return model_workflow.tuned_rows(_fake_measure(w, variants, reps))

    monkeypatch.setattr(backend, "INTERPRETED", False)
    monkeypatch.setattr(model_bench, "measure", measure)
    monkeypatch.setattr(model_bench, "device_name", lambda: "Fake GPU")
    monkeypatch.setattr(model_workflow, "gpu_workflow", workflow)
    args = ["--model", "gpt2", "--layers", "3", "--hidden", "128", "--prefill", "2x16", "--variants", "tunekit,liger"]
    result = cli("model-bench", *args, "--reps", "2", "--workflow", "--trials", "5", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert measured == [Workload("gpt2", layers=3, hidden=128, prefill=(2, 16))]
    assert (
        "tunekit (tuned plan)" in result.output
        and "gpt2 workflow: 3 problems recorded, 3 tuned at 5 trials" in result.output
    )
    doc = json.loads((tmp_path / model_run.JSON_NAME).read_text())
    assert doc["device"] == "Fake GPU" and doc["variants"] == ["tunekit", "liger"] and doc["reps"] == 2
    assert doc["workflow"][0]["trials"] == 5 and doc["workloads"][0]["prefill"] == [2, 16]
    assert {"torch", "triton", "transformers"} <= set(doc["versions"])
    assert [r["variant"] for r in doc["results"]] == ["eager", "tunekit", "liger", "tunekit (tuned plan)"]
    assert (tmp_path / model_run.TABLE_NAME).read_text().strip() in result.output  # the table printed, and written
    assert f"png: {tmp_path / model_run.PNG_NAME}" in result.output or "png skipped" in result.output
    assert not math.isnan(doc["results"][1]["ms"])


def test_a_failing_workflow_keeps_what_was_measured(tmp_path, monkeypatch):
    from tunekit.core import backend

    def workflow(w: Workload, variants: tuple[str, ...], reps: int, report: WorkflowReport) -> list[Result]:
        raise TunekitError("the tuner ran out of patience")

    monkeypatch.setattr(backend, "INTERPRETED", False)
    monkeypatch.setattr(model_bench, "measure", _fake_measure)
    monkeypatch.setattr(model_bench, "device_name", lambda: "Fake GPU")
    monkeypatch.setattr(model_workflow, "gpu_workflow", workflow)
    result = cli("model-bench", "--model", "llama", "--workflow", "--out", str(tmp_path))
    assert result.exit_code == 1 and "error: the tuner ran out of patience" in result.output
    doc = json.loads((tmp_path / model_run.JSON_NAME).read_text())
    assert [r["variant"] for r in doc["results"]] == list(model_results.VARIANTS) and doc["workflow"] is None


def test_a_global_patch_is_undone_after_its_variant() -> None:
    """Liger-Kernel rewrites Llama's modeling module for every model of the process; after its variant the module
    and its classes are transformers' own again, so later variants (and the workflow) measure tunekit alone."""
    pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    from tunekit.evaluation.model_bench import _modeling_state, _restore

    rope, forward = modeling_llama.apply_rotary_pos_emb, modeling_llama.LlamaForCausalLM.forward
    state = _modeling_state("llama")
    modeling_llama.apply_rotary_pos_emb = lambda *a: a
    modeling_llama.LlamaForCausalLM.forward = lambda self, *a: a
    modeling_llama.LlamaMLP.extra = "added"
    modeling_llama.added_global = 1
    _restore(state)
    assert modeling_llama.apply_rotary_pos_emb is rope and modeling_llama.LlamaForCausalLM.forward is forward
    assert not hasattr(modeling_llama.LlamaMLP, "extra") and not hasattr(modeling_llama, "added_global")


def test_variants_are_timed_in_alternation_with_a_global_patch_swapped_in_only_for_its_own(monkeypatch) -> None:
    """Every variant is built first, then each run times them round by round in turn: the rows' speed is the median
    of per-round ratios to eager. A variant whose patch rewrites the modeling module for the whole process (as
    Liger-Kernel's does) has it only during its own calls, and transformers' own module is back afterwards."""
    pytest.importorskip("transformers")
    import copy
    import itertools

    from transformers.models.llama import modeling_llama

    rope = modeling_llama.apply_rotary_pos_emb
    calls: list[tuple[str, bool]] = []  # (variant, whether the modeling module was patched during the call)

    def variant(base, name, model_kind):
        model = copy.deepcopy(base)
        if name == "liger":
            modeling_llama.apply_rotary_pos_emb = lambda *a, **k: rope(*a, **k)

        def run(*args, **kwargs):
            calls.append((name, modeling_llama.apply_rotary_pos_emb is not rope))
            return model(*args, **kwargs)

        return model, run

    monkeypatch.setattr(model_bench, "DEVICE", "cpu")
    monkeypatch.setattr(model_bench, "_variant", variant)
    tiny = Workload("llama", layers=1, hidden=128, vocab=64, prefill=(2, 8), decode=(2, 1), train=(2, 8))
    results = model_bench.measure(tiny, ("eager", "liger"), reps=1, rounds=3)
    assert [(r.variant, r.run) for r in results] == [(v, r) for v in ("eager", "liger") for r in model_results.RUNS]
    assert all(r.vs_eager is not None and r.vs_eager > 0 and math.isfinite(r.ms) for r in results)
    assert all(r.logits_rel_err == 0.0 for r in results if r.variant == "liger" and r.run != "train")
    assert {patched for name, patched in calls if name == "eager"} == {False}
    assert {patched for name, patched in calls if name == "liger"} == {True}
    order = [name for name, _ in calls]
    switches = sum(a != b for a, b in itertools.pairwise(order))
    assert switches >= 3 * 3  # each run's rounds alternate the two variants, not one after the other
    assert modeling_llama.apply_rotary_pos_emb is rope
    liger_decode = next(r for r in results if r.run == "decode" and r.variant == "liger")
    assert speed_vs_eager(results)[("llama", "decode", "liger")] == liger_decode.vs_eager
