"""The in-step arbiter (tunekit.evaluation.in_step): profiler events charged to the op calls that launched them (the
forward range, what it nests, and the backward of the autograd nodes it made), calls that share a problem decided
together, the control bounding a win, and tune_model keeping what the step measured (on the CPU, host time: the
interpreter's Triton kernels lose to torch's ops by orders of magnitude, which makes torch's win certain)."""

from __future__ import annotations

import contextlib
import statistics
import sys

import pytest
import torch
from helpers import TESTS, cli

import tunekit.ops as ops
from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.evaluation.in_step import (
    BACKWARD,
    BEFORE,
    CONTROL,
    TORCH_OP,
    TUNED,
    TraceEvent,
    _groups,
    call_costs,
    decide,
    group_verdict,
)
from tunekit.evaluation.tune_model import tune_model
from tunekit.runtime.attribution import attributing
from tunekit.runtime.dispatch import Dispatcher, resolve
from tunekit.runtime.hotpath import HotPath
from tunekit.store.database import read_document, write_document
from tunekit.store.entry import DEMOTED, in_step_record
from tunekit.store.store import Store

sys.path.insert(0, str(TESTS / "evaluation"))
from test_tune_model import _model, _plant


def _host(name: str, start: int, end: int, thread: int = 1, **kw: int) -> TraceEvent:
    return TraceEvent(name, False, start, end, thread, **kw)


def _range(name: str, start: int, end: int, thread: int = 1) -> TraceEvent:
    return TraceEvent(name, False, start, end, thread, annotation=True)


def _kernel(correlation: int, ns: int) -> TraceEvent:
    return TraceEvent("some_kernel", True, 10_000, 10_000 + ns, 0, correlation=correlation)


def _trace() -> list[TraceEvent]:
    """Two top-level calls of run 0. Call 0 launches one kernel (50 ns), makes autograd node 5, whose backward (on
    thread 2) runs an inner call that launches another (30 ns). Call 1 launches one (7 ns). A launch outside every
    call (1000 ns) is nobody's."""
    return [
        _range("tunekit.call#0.0", 0, 100),
        _host("aten::mm", 10, 40, sequence_nr=5),
        _host("cudaLaunchKernel", 20, 25, correlation=100),
        _kernel(100, 50),
        _host(f"{BACKWARD} MmBackward0", 190, 310, thread=2, sequence_nr=5, fwd_thread=1),
        _range("tunekit.inner#0.0", 200, 300, thread=2),
        _host("cuLaunchKernelEx", 250, 260, thread=2, correlation=101),
        _kernel(101, 30),
        _host("cudaLaunchKernel", 500, 505, correlation=102),
        _kernel(102, 1000),
        _range("tunekit.call#0.1", 400, 450),
        _host("aten::add", 405, 410, sequence_nr=9),  # a node with no backward run in this trace
        _host("cudaLaunchKernel", 420, 425, correlation=103),
        _kernel(103, 7),
    ]


def test_a_call_is_charged_its_kernels_its_nested_calls_and_its_backward() -> None:
    costs = call_costs(_trace(), top={0, 1})
    assert costs.ms == {(0, 0): pytest.approx(80e-6), (0, 1): pytest.approx(7e-6)}
    assert costs.members == {(0, 0): {(0, 0)}, (0, 1): set()}


def test_a_step_whose_gpu_idles_most_of_its_span_is_bound_by_the_host() -> None:
    """With the long launch outside every call, the GPU is busy 1087 ns of the calls' 450 ns span; without it, 87
    ns: the step waits on the host. The calls are charged their GPU time either way (host time is timed apart)."""
    assert not call_costs(_trace(), top={0, 1}).host_bound
    costs = call_costs([e for e in _trace() if e.correlation != 102], top={0, 1})
    assert costs.host_bound
    assert costs.ms == {(0, 0): pytest.approx(80e-6), (0, 1): pytest.approx(7e-6)}
    assert not call_costs([e for e in _trace() if not e.on_device], top={0, 1}).host_bound  # no GPU: host time


def test_whether_the_host_binds_is_read_from_the_timed_runs_alone() -> None:
    """A warm-up run on the full path spends host time the timed runs do not: run 0's call spans 1000 ns with 10 ns
    of GPU work, run 1's 100 ns with 200 ns. Counted from run 0 the step looks bound by the host; from run 1 it is
    not."""
    trace = [
        _range("tunekit.call#0.0", 0, 1000),
        _host("cudaLaunchKernel", 500, 505, correlation=1),
        _kernel(1, 10),
        _range("tunekit.call#1.0", 2000, 2100),
        _host("cudaLaunchKernel", 2010, 2015, correlation=2),
        _kernel(2, 200),
    ]
    assert call_costs(trace, top={0}).host_bound
    assert not call_costs(trace, top={0}, timed_from=1).host_bound


@pytest.mark.parametrize("first_host_bound", [True, False])
def test_in_a_step_bound_by_the_host_a_call_costs_the_longer_of_its_host_and_gpu_time(
    first_host_bound: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the first profile says the step waits on the host, every serving's calls are also timed on the host
    without the profiler, and each is charged the longer of the two; otherwise their GPU time."""
    from tunekit.evaluation import in_step

    profiles: list[bool] = []

    def profiled(call, attribution, first_run, runs, timed_from):
        attribution.top.add(0)
        profiles.append(first_host_bound if not profiles else not first_host_bound)  # later ones disagree
        ms = {(run, 0): 0.010 for run in range(first_run, first_run + runs)}
        return in_step.CallCosts(ms=ms, members={k: set() for k in ms}, host_bound=profiles[-1])

    monkeypatch.setattr(in_step, "_profile", profiled)
    monkeypatch.setattr(in_step, "_host_ms", lambda *a: {0: 0.050})
    servings = {"tuned": contextlib.nullcontext, "before": contextlib.nullcontext}
    timed, _ = in_step._time_servings(lambda: None, servings, 1, 2, 1)
    want = 0.050 if first_host_bound else 0.010
    assert timed.ms == {"tuned": [{0: pytest.approx(want)}], "before": [{0: pytest.approx(want)}]}


def test_timing_on_the_host_charges_each_top_level_call_its_own_host_time() -> None:
    x, w = torch.randn(8, 32), torch.randn(32)
    with attributing() as attribution, attribution.timing_host() as host_ns:
        attribution.begin_run(0)
        ops.rms_norm(x, (32,), w)
        ops.softmax(x, -1)
        ns = dict(host_ns)
    assert set(ns) == {0, 1} and all(v > 0 for v in ns.values())
    assert attribution._host_ns is None  # off again after the block


def test_only_top_level_calls_are_charged() -> None:
    assert set(call_costs(_trace(), top={1}).ms) == {(0, 1)}


def test_with_no_gpu_activity_a_call_is_charged_its_windows_host_time() -> None:
    events = [e for e in _trace() if not e.on_device]
    costs = call_costs(events, top={0, 1})
    assert costs.ms[(0, 0)] == pytest.approx((100 + 120) / 1e6)  # its range, and its node's backward
    assert costs.ms[(0, 1)] == pytest.approx(50 / 1e6)


def test_calls_that_share_a_problem_are_one_group() -> None:
    a, b, c = ("gemm", (1,)), ("gemm", (2,)), ("layer_norm", (3,))
    groups = _groups({0: {a}, 1: {b}, 2: {a, c}, 3: {c}})
    assert sorted((sorted(positions), sorted(problems)) for positions, problems in groups) == [
        ([0, 2, 3], sorted([a, c])),
        ([1], [b]),
    ]


@pytest.mark.parametrize(
    ("tuned", "torch_", "control", "kept"),
    [
        ([9.0, 9.0, 9.0], [11.0, 11.0, 11.0], [9.0, 9.0, 9.0], TUNED),  # 10% faster, a quiet control
        ([9.8, 9.8, 9.8], [11.0, 11.0, 11.0], [9.4, 10.2, 10.4], BEFORE),  # 2% faster, a 4% control spread
        ([9.0, 9.0, 9.0], [5.0, 5.0, 5.0], [9.0, 9.0, 9.0], TORCH_OP),  # both win: the fastest
        ([9.98, 9.98, 9.98], [11.0, 11.0, 11.0], [9.98, 9.98, 9.98], BEFORE),  # 0.2%: under the floor
    ],
)
def test_a_serving_replaces_before_only_past_the_controls_spread(tuned, torch_, control, kept) -> None:
    per_block = {BEFORE: [10.0, 10.0, 10.0], TUNED: tuned, TORCH_OP: torch_, CONTROL: control}
    chosen, ratios, noise = decide(per_block, floor=0.005)
    assert chosen == kept
    assert ratios[BEFORE] == 1.0 and CONTROL not in ratios
    assert noise == pytest.approx(statistics.median(abs(c / t - 1) for c, t in zip(control, tuned)))


def test_a_serving_under_which_a_call_did_not_run_is_left_out() -> None:
    """Torch serving a patched loss: the loss calls torch directly, no tunekit call runs, and its missing time must
    not read as 0 ms (an earlier run on the H200 kept torch for cross-entropy so)."""
    problem = ("cross_entropy", (1,))
    block = {0: 0.3, 1: 1.0}
    ms = {BEFORE: [block] * 3, TUNED: [block] * 3, CONTROL: [block] * 3, TORCH_OP: [{1: 1.0}] * 3}
    verdict = group_verdict([0], {problem}, ms, floor=0.005)
    assert verdict.chosen == BEFORE and verdict.left_out == (TORCH_OP,) and TORCH_OP not in verdict.ms
    both = group_verdict([0, 1], {problem}, {**ms, TORCH_OP: [{0: 0.1, 1: 0.5}] * 3}, floor=0.005)
    assert both.chosen == TORCH_OP and both.left_out == () and both.ms[TORCH_OP] == pytest.approx(0.6)


def test_the_hooks_are_on_only_inside_an_attribution() -> None:
    call, config = HotPath.__call__, Dispatcher.config
    with attributing():
        assert HotPath.__call__ is not call and Dispatcher.config is not config
        with pytest.raises(RuntimeError, match="already running"), attributing():
            pass
    assert HotPath.__call__ is call and Dispatcher.config is config


def test_positions_and_problems_are_the_same_whatever_serves_them() -> None:
    """A patched model's calls keep their positions when a problem is served torch's op instead of a kernel, and
    each position notes the problems dispatch served in it."""
    from tunekit.integrations.patching import patch
    from tunekit.runtime.dispatch import TORCH, serving

    model = _model()
    patch(model)
    x = torch.randn(24, 32)
    with attributing() as attribution:
        attribution.begin_run(0)
        model(x)
        first = (set(attribution.top), {k: set(v) for k, v in attribution.notes.items()})
        gemm = {key: TORCH for kernel, key in set().union(*attribution.notes.values()) if kernel == "gemm"}
        attribution.notes.clear()
        with serving({"gemm": gemm}):
            attribution.begin_run(1)
            model(x)
        assert set(attribution.top) == first[0]
        assert {k: v for k, v in attribution.notes.items() if isinstance(k, int)} == {
            k: v for k, v in first[1].items() if isinstance(k, int)
        }
    assert len(first[0]) >= 3  # three Linear layers, each a top-level call


def test_tune_model_keeps_what_the_step_measured_and_records_it(tmp_path) -> None:
    model = _model()
    x = torch.randn(24, 32)
    planted: dict = {}

    def train(m: torch.nn.Module) -> None:
        m(x).square().mean().backward()

    report = tune_model(model, {"train": train}, timer=lambda call, reps: (call(), 10.0)[1], tune=_plant(planted))
    assert report.in_step and all(d.step == "train" for d in report.in_step)
    decided = {p for d in report.in_step for p in d.verdict.problems}
    spec, device = get_spec("gemm"), fingerprint()
    for which in ("slow", "fast"):
        assert ("gemm", planted[which]) in decided
    # In the interpreter torch's ops beat the Triton kernels inside the step by far: every group keeps torch, and
    # each planted entry is demoted with what the step measured.
    assert {d.verdict.chosen for d in report.in_step} == {TORCH_OP}, report.table()
    with Store() as store:
        for which in ("slow", "fast"):
            problem = spec.problem_dict(planted[which])
            served = resolve(spec, problem, device, store)
            assert served.layer == "demoted"
            record = in_step_record(served.entry.provenance)
            assert record["kept"] == TORCH_OP and record["step"] == "train"
            assert record["ms"][TORCH_OP] < record["ms"][TUNED]
            assert "in step train" in served.entry.provenance[DEMOTED]
    assert "kept torch" in report.table()
    # What the step measured travels with the entry: a database written from the cache reads back (flat provenance).
    with Store() as store:
        entries = list(store.entries())
    write_document(tmp_path / "db.json", entries)
    assert [in_step_record(e.provenance) for e in read_document(tmp_path / "db.json")] == [
        in_step_record(e.provenance) for e in entries
    ]
    listing = cli("in-step", "--kernel", "gemm")
    assert listing.exit_code == 0, listing.output
    assert listing.output.count("gemm ") >= 2 and "torch" in listing.output
