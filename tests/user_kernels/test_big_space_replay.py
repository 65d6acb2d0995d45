"""The analysis of tests/gpu/autotune_big_spaces.py on the CPU (tests/gpu/autotune_replay.py): tunekit.autotune's own
search replayed over a recorded timing table (through its do_bench and pre_hook, nothing of tunekit bypassed), the
random-order baseline, and the `--analyse` entry point, on synthetic tables."""

from __future__ import annotations

import itertools
import json
import math
import statistics
import sys
from pathlib import Path

import pytest

pytest.importorskip("liger_kernel.ops.jsd", reason="liger-kernel is not installed (pip install liger-kernel==0.8.5)")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import autotune_replay as replay
from big_space_kernels import KERNELS


def _synthetic(config: dict) -> float:
    """A smooth landscape with its optimum at BLOCK_SIZE 1024, 8 warps, 2 stages (about 1.0 ms)."""
    return (
        1.0
        + 0.3 * abs(math.log2(config["BLOCK_SIZE"]) - 10)
        + 0.2 * abs(math.log2(config["num_warps"]) - 3)
        + 0.05 * abs(config["num_stages"] - 2)
    )


def _table(results: list[dict] | None = None) -> dict:
    configs = KERNELS["layer_norm"].configs(False)
    if results is None:
        results = [{"status": "ok", "ms": _synthetic(c)} for c in configs]
        results[0] = {"status": "failed", "error": "OutOfResources: shared memory"}  # the search's first config
        results[5] = {"status": "wrong", "error": "y: 12 elements not written or NaN"}
    shape = {"label": "4096x4096", "shape": [4096, 4096], "problem": {"N": 4096}, "results": results}
    return {"format": replay.FORMAT, "smoke": False, "kernels": {"layer_norm": {"configs": configs, "shapes": [shape]}}}


def test_random_order_is_exact():
    for n, good in ((6, 1), (6, 2), (7, 3)):
        firsts = [
            next(pos for pos, item in enumerate(order, 1) if item < good) for order in itertools.permutations(range(n))
        ]
        expected, median = replay.random_order(n, good)
        assert expected == pytest.approx(statistics.fmean(firsts))
        assert median == min(k for k in range(1, n + 1) if 2 * sum(f <= k for f in firsts) >= len(firsts))


def test_good_configs_count_only_correct_runs():
    results = [{"status": "ok", "ms": 1.0}, {"status": "wrong", "error": "x"}, {"status": "ok", "ms": 1.02},
               {"status": "failed", "error": "y"}, {"status": "ok", "ms": 1.05}]  # fmt: skip
    assert replay.good_configs(results, 0.03) == (1.0, {0, 2})
    assert replay.good_configs([{"status": "failed", "error": "y"}], 0.03) == (None, set())
    assert replay.first_hit([3, 1, 2, 0], {0, 2}) == 3 and replay.first_hit([1, 3], {0}) is None


def test_replayed_search_is_tunekits_and_a_budget_only_stops_it():
    analysis = replay.analyse(_table(), replay_trials=24, budgets=(8,))
    row = analysis["kernels"]["layer_norm"]["shapes"][0]
    results, configs = _table()["kernels"]["layer_norm"]["shapes"][0]["results"], KERNELS["layer_norm"].configs(False)
    order = row["tunekit_order"]
    assert row["tunekit_measured"] == 24 and len(set(order)) == 24  # each benchmarked once, failed ones counted
    assert order[0] == 0  # tunekit measures the space's first valid config first (recorded failed: still a trial)
    best, good = replay.good_configs(results, 0.03)
    assert row["tunekit_trials"] == replay.first_hit(order, good)
    # After 8 trials tunekit serves the fastest correct config it measured in those 8, and those 8 are the first 8
    # of the 24-trial run.
    first8 = [i for i in order[:8] if results[i]["status"] == "ok"]
    fastest = min(first8, key=lambda i: results[i]["ms"])
    pick = row["tunekit_picks"]["8"]
    assert pick["config"] == configs[fastest] and pick["prefix_of_long_run"]
    assert pick["gap"] == pytest.approx(results[fastest]["ms"] / best - 1)
    summary = analysis["kernels"]["layer_norm"]["summary"]
    assert summary["configs"] == 144 and summary["shapes"] == 1 and summary["prefix_consistent"]
    assert summary["random"]["median"] == pytest.approx(replay.random_order(144, len(good))[0])


def test_a_table_of_another_space_is_refused(tmp_path):
    table = _table()
    table["kernels"]["layer_norm"]["configs"] = table["kernels"]["layer_norm"]["configs"][1:]
    with pytest.raises(replay.TableError, match="not its space's 144 valid configs"):
        replay.analyse(table)
    path = tmp_path / "table.json"
    path.write_text(json.dumps({**table, "format": "other/1"}))
    assert replay.main(["--analyse", str(path)]) == 1


def test_analyse_entry_point_writes_the_analysis_and_prints_the_table(tmp_path, capsys):
    results = [{"status": "failed", "error": "CompilationError"}] * 144  # a shape where nothing ran is said, not hidden
    table = _table()
    table["kernels"]["layer_norm"]["shapes"].append({**_table(results)["kernels"]["layer_norm"]["shapes"][0],
                                                     "label": "1x1", "problem": {"N": 1}})  # fmt: skip
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    assert replay.main(["--analyse", str(path), "--replay-trials", "12", "--budgets", "6", "--out", str(tmp_path)]) == 0
    analysis = json.loads((tmp_path / "analysis.json").read_text())
    kernel = analysis["kernels"]["layer_norm"]
    assert kernel["summary"]["shapes"] == 1 and kernel["summary"]["skipped_shapes"] == 1
    assert kernel["shapes"][1]["skipped"] == "no config ran and matched the reference"
    printed = capsys.readouterr().out
    assert printed.splitlines()[2].split()[:3] == ["layer_norm", "144", "1"]
