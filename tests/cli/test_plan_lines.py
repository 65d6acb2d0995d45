"""One bad plan line never abandons a plan: it is one `error:` line naming the plan line, and the other
lines are still listed or tuned. Before: `{"kernel": "softmax", "shape": "1048576x1048576", "dtype": "float32"}`
passed `tunekit plan`, then `tune --plan` (and `tune --shape`) died in the allocator with a raw traceback and every
later line was dropped; user-kernel plan lines with a misspelt argument, `n: true`, `"dtype.x_ptr": "__class__"` or
`n` of 2^40 raised KeyError / ValueError / TypeError / an allocation failure, naming no plan line.
"""

from __future__ import annotations

import json

import pytest
from helpers import cli

from tunekit.core.errors import TunekitError
from tunekit.fleet.plans import read_plan

HUGE = {"kernel": "softmax", "shape": "1048576x1048576", "dtype": "float32"}  # 8 TiB of float32 in and out
SMALL = {"kernel": "softmax", "shape": "4x16", "dtype": "float32"}


def errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


def write_plan(path, *items) -> None:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))


def test_a_problem_too_large_for_this_machine_is_refused_when_read(tmp_path):
    path = tmp_path / "plan.jsonl"
    write_plan(path, HUGE, SMALL)
    from tunekit.fleet.plans import read_plan_lines

    read = read_plan_lines(path)
    assert [(line.number, line.kernel) for line in read.problems] == [(2, "softmax")]
    assert len(read.refused) == 1 and read.refused[0].startswith(f"{path} line 1: softmax ")
    assert "cannot fit" in read.refused[0] and "memory" in read.refused[0], read.refused
    with pytest.raises(TunekitError, match=r"line 1: softmax .* cannot fit"):
        read_plan(path)  # the strict reader (the queue's): the whole plan, refused at its first bad line


def test_plan_lists_the_good_lines_and_names_the_bad_one(tmp_path):
    path = tmp_path / "plan.jsonl"
    write_plan(path, HUGE, SMALL)
    result = cli("plan", str(path))
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "softmax rows=4 cols=16" in result.output and "1 problem in" in result.output
    [error] = errors(result.output)
    assert "line 1" in error and "cannot fit" in error
    listed = cli("plan", str(path), "--json")
    assert listed.exit_code == 1 and json.loads(listed.stdout)["refused"] == [error.removeprefix("error: ")]


def test_tune_plan_tunes_the_rest_and_names_the_bad_line(tmp_path):
    path = tmp_path / "plan.jsonl"
    write_plan(path, HUGE, SMALL)
    result = cli("tune", "--plan", str(path), "--trials", "1", "--sampler", "random")
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    [error] = errors(result.output)
    assert f"{path} line 1: softmax" in error and "cannot fit" in error
    assert "rows=4,cols=16" in result.output.replace(" ", ",") or "rows=4 cols=16" in result.output
    assert "1 tuned" in result.output


@pytest.mark.parametrize("command", [["tune"], ["plan", "out.jsonl"]], ids=["tune", "plan-write"])
def test_a_shape_too_large_for_this_machine_is_one_line(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    result = cli(*command, "-k", "softmax", "--shape", "1048576x1048576", "--dtype", "float32")
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and "cannot fit" in result.output


def test_a_problem_failing_while_tuned_leaves_the_rest_tuned(tmp_path, monkeypatch):
    """A failure the plan check cannot see (here a TunekitError raised by the tuning): named with its plan line,
    and the next line is still tuned."""
    from tunekit.tuning.shared_bench import SharedBench

    real = SharedBench.tune

    def tune(self, spec, problem, *args, **kwargs):
        if problem["rows"] == 8:
            raise TunekitError("the bench broke")
        return real(self, spec, problem, *args, **kwargs)

    monkeypatch.setattr(SharedBench, "tune", tune)
    path = tmp_path / "plan.jsonl"
    write_plan(path, {**SMALL, "shape": "8x16"}, SMALL)
    result = cli("tune", "--plan", str(path), "--trials", "1", "--sampler", "random")
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    [error] = errors(result.output)
    assert f"{path} line 1" in error and "the bench broke" in error
    assert "1 tuned" in result.output


def test_tune_plan_in_the_library_counts_bad_lines_as_failed(tmp_path):
    from tunekit.evaluation.plan_tuning import tune_plan

    path = tmp_path / "plan.jsonl"
    write_plan(path, HUGE, SMALL)
    counts = tune_plan(path, tmp_path / "store", trials=1)
    assert counts.tuned == 1 and len(counts.failed) == 1 and "line 1" in counts.failed[0], counts.failed


# ------------------------------------------------------------------------------------------ user kernels

USER = "user_kernel_example:tunekit_add"
GOOD = {"n": 48, "dtype.x_ptr": "float32", "dtype.y_ptr": "float32", "dtype.out_ptr": "float32"}
USER_BAD = [
    pytest.param({**{k: v for k, v in GOOD.items() if k != "n"}, "nn": 48}, "'nn'", id="misspelt-argument"),
    pytest.param({**GOOD, "n": True}, "", id="n-true"),
    pytest.param({**GOOD, "dtype.x_ptr": "__class__"}, "'__class__'", id="dtype-dunder"),
    pytest.param({**GOOD, "n": 2**40}, "", id="n-2^40"),
]


@pytest.mark.parametrize(("problem", "named"), USER_BAD)
def test_a_bad_user_kernel_line_is_one_line_and_the_rest_runs(tmp_path, problem, named):
    import user_kernel_example as ex

    ex.tunekit_add.forget_memo()
    path = tmp_path / "plan.jsonl"
    write_plan(path, {"kernel": USER, "problem": problem}, {"kernel": USER, "problem": GOOD})
    result = cli("tune", "--plan", str(path))
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    [error] = errors(result.output)
    assert f"{path} line 1: {USER}" in error and named in error, error
    assert "n=48" in result.output and "measured 3 configs" in result.output, result.output
