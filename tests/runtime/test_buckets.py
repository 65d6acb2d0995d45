"""Token buckets: a GEMM's m between two tuned bucket edges is served the upper edge's config (layer
"bucket") only where both edges are tuned, not demoted, and both beat torch by the margin; otherwise torch. Plans
record the edges around each token count met."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest
import torch
from fingerprints import H200, INTERPRETER
from helpers import cli

import tunekit
import tunekit.ops as ops
from tunekit.core.buckets import TokenBuckets, token_edges
from tunekit.core.device import DeviceFingerprint
from tunekit.core.registry import get_spec
from tunekit.core.space import Problem, config_id
from tunekit.fleet.plans import read_plan
from tunekit.kernels.gemm.problem import make_problem
from tunekit.runtime import buckets, dispatch
from tunekit.store.entry import SUPERSEDED_TIMERS, TORCH_MS, Entry, demoted
from tunekit.store.key import CacheKey
from tunekit.store.store import Store

SPEC = get_spec("gemm")
N, K = 4000, 4000  # widths no shipped database holds


@pytest.fixture(autouse=True)
def buckets_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bucket layer as TUNEKIT_BUCKETS=1 turns it on for GPUs (off by default: see test_off_by_default...)."""
    monkeypatch.setenv("TUNEKIT_BUCKETS", "1")


def gemm(m: int, dtype: str = "bfloat16", **fields: object) -> dict:
    return dict(make_problem(m, N, K, dtype, **fields))  # type: ignore[arg-type]


def entry_for(problem: Problem, device: DeviceFingerprint, time_ms: float, torch_ms: float | None) -> Entry:
    """A tuned entry as the tuner stores it: the heuristic's config (valid there), its time and torch's."""
    key = CacheKey.make(SPEC.name, SPEC.source_hash, device.key, problem)
    provenance = {} if torch_ms is None else {TORCH_MS: torch_ms}
    return Entry(key, dict(SPEC.heuristic(problem, device)), time_ms, device.to_json(), provenance)


def other_than(entry: Entry, problem: Problem) -> Entry:
    """`entry` with another valid config than its own (so the served config was not measured at this edge)."""
    space = SPEC.space
    config = next(
        c for c in space.all_configs() if space.is_valid(c, problem, H200) and config_id(c) != config_id(entry.config)
    )
    return dataclasses.replace(entry, config=config)


def resolved(problem: Problem, *entries: Entry, device: DeviceFingerprint = H200) -> dispatch.Resolution:
    store = Store()
    try:
        for e in entries:
            store.put(e)
        return dispatch.resolve(SPEC, problem, device, store)
    finally:
        store.close()


def test_the_edges_are_powers_of_two_then_half_octaves() -> None:
    edges = token_edges()
    assert edges[:12] == (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768)
    assert all(b / a <= 2 for a, b in itertools.pairwise(edges))
    assert all(b / a <= 1.5 for a, b in itertools.pairwise(edges) if a >= 256)
    declared = SPEC.token_buckets
    assert declared is not None and declared.field == "m"
    assert declared.bracket(gemm(1000)) == (768, 1024)
    assert declared.bracket(gemm(1024)) is None  # an edge is its own bucket
    assert declared.bracket(gemm(1000, a_layout="col")) is None  # m of a transposed activation is a layer width
    assert declared.bracket(gemm((1 << 20) + 1)) is None  # past the last edge
    with pytest.raises(ValueError):
        TokenBuckets("m", edges=(4, 2))


def test_an_m_between_two_edges_that_beat_torch_is_served_the_upper_edges_config(isolated_cache) -> None:
    hi = entry_for(gemm(1024), H200, 1.2, 1.5)
    lo = other_than(entry_for(gemm(768), H200, 1.0, 1.5), gemm(768))
    res = resolved(gemm(1000), lo, hi)
    assert res.layer == "bucket" and res.entry is not None and res.entry.key == hi.key
    assert config_id(res.config) == config_id(hi.config)
    assert res.note == (
        "m=1000 in bucket (768, 1024): the config tuned at 1024 (the best config at 768 1.50x torch at 768, the "
        "config tuned at 1024 1.25x torch at 1024)"
    )


@pytest.mark.parametrize(
    ("lo_times", "hi_times", "why"),
    [
        ((1.0, 1.05), (1.0, 2.0), "the best config at 768 is 1.05x torch at 768"),  # faster, but under the margin
        ((1.0, 2.0), (1.0, 0.9), "the config tuned at 1024 is 0.90x torch at 1024"),  # slower than torch
        ((1.0, None), (1.0, 2.0), "the entry at 768 holds no torch time"),
    ],
)
def test_an_edge_not_beating_torch_by_the_margin_leaves_torch(isolated_cache, lo_times, hi_times, why) -> None:
    lo, hi = other_than(entry_for(gemm(768), H200, *lo_times), gemm(768)), entry_for(gemm(1024), H200, *hi_times)
    res = resolved(gemm(1000), lo, hi)
    assert res.layer == "torch" and res.config is dispatch.TORCH
    assert why in res.note


def test_a_launch_bound_edge_an_earlier_method_timed_leaves_torch(isolated_cache) -> None:
    """Edges beating torch by the margin, but under the host floor and stamped by an earlier timer: the bucket
    refuses, as dispatch refuses the edge itself (tunekit.store.entry.superseded_floor)."""
    stamp = {"timer": sorted(SUPERSEDED_TIMERS)[0]}
    assert resolved(gemm(12), entry_for(gemm(8), H200, 0.02, 0.05), entry_for(gemm(16), H200, 0.02, 0.05)).layer == (
        "bucket"
    )
    lo, hi = (entry_for(gemm(m), H200, 0.02, 0.05) for m in (32, 64))
    lo, hi = (dataclasses.replace(e, provenance={**e.provenance, **stamp}) for e in (lo, hi))
    res = resolved(gemm(48), lo, hi)
    assert res.layer == "torch" and "launch-bound, timed by an earlier method" in res.note


def test_off_by_default_on_a_gpu_serves_torch_between_edges(isolated_cache, monkeypatch) -> None:
    monkeypatch.delenv("TUNEKIT_BUCKETS")
    hi = entry_for(gemm(1024), H200, 1.2, 1.5)
    lo = other_than(entry_for(gemm(768), H200, 1.0, 1.5), gemm(768))
    res = resolved(gemm(1000), lo, hi)
    assert res.layer == "torch" and "TUNEKIT_BUCKETS=1" in res.note


@pytest.mark.parametrize("edge", [768, 1024])
def test_a_missing_edge_leaves_torch(isolated_cache, edge) -> None:
    res = resolved(gemm(1000), entry_for(gemm(edge), H200, 1.0, 2.0))
    other = 1792 - edge
    assert res.layer == "torch" and res.config is dispatch.TORCH and f"no tuned entry at m={other}" in res.note


@pytest.mark.parametrize("device", [H200, INTERPRETER])
def test_a_demoted_edge_serves_torch_to_its_bucket(isolated_cache, device) -> None:
    lo = entry_for(gemm(768), device, 1.0, 2.0)
    hi = demoted(entry_for(gemm(1024), device, 1.0, 2.0), "made the model step slower")
    res = resolved(gemm(1000), lo, hi, device=device)
    assert res.layer == "demoted" and res.config is dispatch.TORCH and res.entry is not None
    assert res.entry.key == hi.key


@pytest.mark.parametrize(
    "other", [{"dtype": "float16"}, {"b_layout": "col"}, {"activation": "gelu"}, {"has_bias": True}]
)
def test_a_bucket_never_crosses_another_field(isolated_cache, other) -> None:
    edges = [entry_for({**gemm(m), **other}, H200, 1.0, 2.0) for m in (768, 1024)]
    assert resolved(gemm(1000), *edges).layer == "torch"
    assert resolved({**gemm(1000), **other}, *edges).layer == "bucket"


def test_an_untuned_edge_and_another_device_get_no_bucket(isolated_cache) -> None:
    edges = [entry_for(gemm(m), H200, 1.0, 2.0) for m in (768, 1024)]
    assert resolved(gemm(1024)).layer == "torch"  # an edge itself: its own entry or nothing
    other_gpu = dataclasses.replace(H200, name="NVIDIA H100 80GB HBM3")
    assert resolved(gemm(1000), *edges, device=other_gpu).layer == "torch"


def test_an_upper_config_invalid_at_m_leaves_torch(isolated_cache, monkeypatch) -> None:
    lo, hi = entry_for(gemm(768), H200, 1.0, 2.0), entry_for(gemm(1024), H200, 1.0, 2.0)
    valid = SPEC.space.is_valid

    def is_valid(self, config, problem, device) -> bool:  # hi's config breaks a rule at m=1000 only
        return valid(config, problem, device) and (self is not SPEC.space or problem["m"] != 1000)

    monkeypatch.setattr(type(SPEC.space), "is_valid", is_valid)
    res = resolved(gemm(1000), lo, hi)
    assert res.layer == "torch" and "breaks" in res.note


def test_an_own_entry_wins_over_the_bucket(isolated_cache) -> None:
    edges = [entry_for(gemm(m), H200, 1.0, 2.0) for m in (768, 1024)]
    own = entry_for(gemm(1000), H200, 1.0, 2.0)
    assert resolved(gemm(1000), *edges, own).layer == "cache"


def test_the_interpreter_runs_the_bucket_config(isolated_cache) -> None:
    """In the interpreter (no torch times) both edges suffice: an op call at m=6 runs the config tuned at m=8."""
    problems = {m: make_problem(m, 32, 48, "float32") for m in (4, 8)}
    store = Store()
    try:
        for problem in problems.values():
            store.put(entry_for(problem, INTERPRETER, 1.0, None))
    finally:
        store.close()
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(6, 48, generator=gen), torch.randn(48, 32, generator=gen)
    got = ops.matmul(a, b)
    torch.testing.assert_close(got, a @ b, atol=1e-2, rtol=1e-2)
    served = dispatch.dispatcher("gemm").served_by
    assert list(served.values()) == ["bucket"], served


def test_a_recorded_plan_holds_the_bucket_edges(isolated_cache, tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    b = torch.randn(48, 32, generator=gen)
    exact = tunekit.record_problems(tmp_path / "exact.jsonl", buckets=False)
    with tunekit.record_problems(tmp_path / "plan.jsonl") as seen, exact:
        for m in (5, 6, 7, 8, 3):
            ops.matmul(torch.randn(m, 48, generator=gen), b)
    assert sorted(p["m"] for _, p in seen.problems) == [3, 5, 6, 7, 8]
    plan = read_plan(tmp_path / "plan.jsonl")
    assert [p["m"] for _, p in plan] == [4, 8, 2], plan  # 5 -> (4, 8); 8 is an edge; 3 -> (2, 4)
    assert {k for k, _ in plan} == {"gemm"}
    lines = [json.loads(line) for line in (tmp_path / "plan.jsonl").read_text().splitlines()]
    assert [line.get("serves") for line in lines] == [{"m": [3, 5, 6, 7]}, {"m": [5, 6, 7]}, {"m": [3]}]
    assert sorted(p["m"] for _, p in read_plan(tmp_path / "exact.jsonl")) == [3, 5, 6, 7, 8]


def test_the_layer_is_known_to_dispatch() -> None:
    assert "bucket" in dispatch.LAYERS and "bucket" not in dispatch.UNTUNED
    assert buckets.BUCKET_MARGIN > 1.0


def test_show_names_the_bucket_layer_and_why(isolated_cache) -> None:
    store = Store()
    try:
        store.put(entry_for(make_problem(8, 32, 48, "float32"), INTERPRETER, 1.0, None))
    finally:
        store.close()
    show = ["show", "--kernel", "gemm", "--shape", "6x32x48", "--dtype", "float32"]
    result = cli(*show)
    assert result.exit_code == 0, result.output
    assert "(m=6 in bucket (4, 8): no tuned entry at m=4)" in result.output  # the interpreter: nearest serves it
    store = Store()
    try:
        store.put(entry_for(make_problem(4, 32, 48, "float32"), INTERPRETER, 1.0, None))
    finally:
        store.close()
    result = cli(*show, "--json")
    assert result.exit_code == 0, result.output
    (served,) = json.loads(result.output)["resolutions"]
    assert served["layer"] == "bucket" and served["bucket"] == "m=6 in bucket (4, 8): the config tuned at 8"


def test_tune_models_demotion_of_a_bucket_served_m_demotes_its_edge(isolated_cache) -> None:
    """tunekit.tune_model demotes what slowed a model step; an m the bucket layer served has no entry of its own, so
    the edge whose config served it is demoted, and the bucket then serves torch."""
    from tunekit.evaluation import tune_model

    store = Store()
    try:
        for m in (4, 8):
            store.put(entry_for(make_problem(m, 32, 48, "float32"), INTERPRETER, 1.0, None))
    finally:
        store.close()
    problem = make_problem(6, 32, 48, "float32")
    assert resolved(problem, device=INTERPRETER).layer == "bucket"
    key = ("gemm", SPEC.problem_key(problem))
    tune_model._demote([key], {key: "the step ran 5% faster without it"})
    res = resolved(problem, device=INTERPRETER)
    assert res.layer == "demoted" and res.config is dispatch.TORCH and "the entry at 8 is demoted" in res.note


@pytest.mark.parametrize(("measured_ms", "layer"), [(1.9, "torch"), (1.5, "bucket")])
def test_where_the_lower_edge_measured_the_upper_config_its_own_time_there_decides(
    isolated_cache, measured_ms, layer
) -> None:
    """lo's best beats torch 2x, but the config that would serve (hi's) was also measured at lo: its time decides."""
    from tunekit.store.entry import TrialRecord

    hi = entry_for(gemm(1024), H200, 1.0, 2.0)
    lo = entry_for(gemm(768), H200, 1.0, 2.0)
    lo = dataclasses.replace(other_than(lo, gemm(768)), trials=(TrialRecord(dict(hi.config), "ok", measured_ms),))
    res = resolved(gemm(1000), lo, hi)
    assert res.layer == layer
    speed = f"{2.0 / measured_ms:.2f}x"
    assert f"the config tuned at 1024 {'is ' if layer == 'torch' else ''}{speed} torch at 768" in res.note


def test_tune_plan_over_a_recorded_plan_tunes_the_edges_that_then_serve_the_bucket(isolated_cache, tmp_path) -> None:
    gen = torch.Generator().manual_seed(0)
    b = torch.randn(48, 32, generator=gen)
    a5, a6 = torch.randn(5, 48, generator=gen), torch.randn(6, 48, generator=gen)
    with tunekit.record_problems(tmp_path / "plan.jsonl"):
        ops.matmul(a5, b), ops.matmul(a6, b)
    result = cli("tune", "--plan", str(tmp_path / "plan.jsonl"), "--trials", "2")
    assert result.exit_code == 0, result.output
    with Store() as store:
        assert sorted(dict(e.key.problem)["m"] for e in store.entries()) == [4, 8]  # the edges, not 5 and 6
    dispatch.reset_all()
    torch.testing.assert_close(ops.matmul(a6, b), a6 @ b, atol=1e-2, rtol=1e-2)
    assert list(dispatch.dispatcher("gemm").served_by.values()) == ["bucket"]
