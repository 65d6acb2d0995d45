"""Every bad command-line value is one line: each command's options, fuzzed over their types.

For every option of every command, the test builds the command's smallest valid invocation, replaces that one
option's value with values its type refuses (a word for a number, a negative count, a missing file, an unknown
kernel or dtype, ...), runs it, and asserts: a non-zero exit, no traceback, and exactly one line on stderr that
starts with `error:`. A new option whose type the table below does not know fails the test until it is listed.
"""

from __future__ import annotations

import json

import pytest
import typer
from helpers import cli

from tunekit.cli import app

# The smallest valid invocation of each command (before the fuzzed option is added). `{tmp}` is the test's
# temporary directory. Every one of them must fail fast on the fuzzed value: none reaches a measurement.
BASE: dict[str, list[str]] = {
    "tune": ["-k", "toy", "-s", "8x32", "--trials", "1"],
    "worker": ["--storage", "{tmp}/queue.journal", "--max-jobs", "1"],
    "status": ["--storage", "{tmp}/queue.journal"],
    "requeue": ["--storage", "{tmp}/queue.journal", "--stale"],
    "plan": ["{tmp}/plan.jsonl", "-k", "toy", "-s", "8x32"],
    "show": ["-k", "toy"],
    "export": ["--out", "{tmp}/db.json"],
    "import": ["{tmp}/db.json"],
    "forget": ["--kernel", "toy", "--dry-run"],
    "in-step": ["--kernel", "layernorm"],
    "bench": ["-k", "toy", "--quick"],
    "plot": ["{tmp}/run.json"],
    "record": ["-k", "toy", "-s", "8x32"],
    "explain": ["-k", "gemm", "-s", "64x64x64", "--table", "h200-sm90-132sm/gemm"],
    "efficiency": ["--strategies", "random"],
    "devices": [],
    "bench-host": ["--calls", "1"],
    "model-bench": [],
}

# Where the fuzzed option replaces part of the base (the base's other options would be refused with it).
BASE_FOR: dict[tuple[str, str], list[str]] = {
    ("tune", "plan"): ["--trials", "1"],
    ("bench", "suite"): ["--quick"],
    ("bench", "summary"): [],
}

# Bad values per option type (the annotation's type, without `| None`); an option of its own meaning is listed by
# name below (whether a path must exist, a string is a kernel or a dtype, depends on the option).
BY_TYPE: dict[str, list[str]] = {"int": ["abc", "1.5", ""], "float": ["abc", "1e", ""]}
NEGATIVE_COUNTS = ["-1", "0"]


def problem_options(
    command: str, shapes: tuple[str, ...] = (), dtypes: tuple[str, ...] = ()
) -> dict[tuple[str, str], list[str]]:
    """Bad values of a command's kernel, shape and dtype options: an unknown kernel, a shape with a zero and a dtype no
    kernel takes, then the command's own `shapes` and `dtypes`."""
    bad = {"kernel": ["nope"], "shape": ["0x4", *shapes], "dtype": ["float8", *dtypes]}
    return {(command, option): values for option, values in bad.items()}


BY_NAME: dict[tuple[str, str], list[str]] = {
    **problem_options("tune", shapes=("axb", "8x32x2"), dtypes=("int8", "float64")),
    ("tune", "trials"): NEGATIVE_COUNTS,
    ("tune", "timeout"): ["-1", "0"],
    ("tune", "sampler"): ["annealing"],
    ("tune", "storage"): ["nope://x"],
    ("tune", "plan"): ["{tmp}/missing.jsonl"],
    ("tune", "workers"): NEGATIVE_COUNTS,
    ("tune", "candidate_timeout"): ["-1", "0"],
    ("tune", "budget"): ["-1", "0"],
    ("worker", "storage"): ["nope://x"],
    ("worker", "heartbeat"): NEGATIVE_COUNTS,
    ("worker", "lease"): NEGATIVE_COUNTS,
    ("worker", "max_retries"): ["-1"],
    ("worker", "max_jobs"): NEGATIVE_COUNTS,
    ("status", "storage"): ["nope://x"],  # a missing file is "nothing queued yet": status creates nothing
    ("requeue", "storage"): ["nope://x"],
    ("plan", "file"): ["{tmp}/missing/plan.jsonl"],
    **problem_options("plan", shapes=("axb",), dtypes=("int8",)),
    **problem_options("show"),
    ("export", "out"): ["{tmp}/missing/db.json", "{tmp}"],
    ("export", "kernel"): ["nope"],
    ("export", "storage"): ["nope://x"],
    ("import", "path"): ["{tmp}/missing.json", "{tmp}", "{tmp}/garbage.json"],
    ("forget", "kernel"): ["nope"],
    ("in-step", "kernel"): ["nope"],
    **problem_options("bench"),
    ("bench", "suite"): ["nope"],
    ("bench", "summary"): ["{tmp}/missing.json"],
    ("bench", "compile_timeout"): ["-1"],
    ("plot", "results"): ["{tmp}/missing.json", "{tmp}/garbage.json"],
    **problem_options("record"),
    ("record", "workers"): NEGATIVE_COUNTS,
    **problem_options("explain", shapes=("64x64",)),
    ("explain", "table"): ["nope/none", "{tmp}/missing.json.gz"],
    ("efficiency", "tables"): ["{tmp}/missing.json.gz", "{tmp}/garbage.json"],
    ("efficiency", "strategies"): ["nope", ","],
    ("efficiency", "seeds"): NEGATIVE_COUNTS,
    ("efficiency", "gp_cap"): NEGATIVE_COUNTS,
    ("efficiency", "workers"): NEGATIVE_COUNTS,
    ("bench-host", "rows"): NEGATIVE_COUNTS,
    ("bench-host", "width"): NEGATIVE_COUNTS,
    ("bench-host", "calls"): NEGATIVE_COUNTS,
    ("bench-host", "out"): ["{tmp}/missing/out.json"],
    ("model-bench", "model"): ["nope"],
    ("model-bench", "prefill"): ["4", "0x8", "ax1"],
    ("model-bench", "decode"): ["4"],
    ("model-bench", "train"): ["4"],
    ("model-bench", "variants"): ["nope", ","],
    ("model-bench", "layers"): ["0"],
    ("model-bench", "hidden"): ["0"],
    ("model-bench", "vocab"): ["0"],
    ("model-bench", "reps"): ["0"],
    ("model-bench", "trials"): ["0"],
}
# Options any value of whose type is valid: names, filters, flags, and files a command creates.
FREE = {
    "queue",
    "json_out",
    "force",
    "submit",
    "isolate",
    "seed",
    "kernels",
    "shipped",
    "all_devices",
    "device",
    "key",
    "dry_run",
    "quick",
    "png",
    "compile_",
    "max_autotune",
    "cold_cache",
    "jobs",
    "job",
    "stale",
    "in_sample",
    "workflow",
    "keep_studies",
    "cache_dir",
    "timeout_s",
    "version",
    "help",
}
FREE_HERE = {("export", "device"), ("bench", "json_out"), ("efficiency", "out"), ("record", "out"), ("plot", "out")}
FREE_HERE |= {("model-bench", "out")}


def cases() -> list[tuple[str, str, str]]:
    group = typer.main.get_command(app)
    found = []
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        for param in command.params:
            if param.name in FREE or (name, param.name) in FREE_HERE:
                continue
            values = BY_NAME.get((name, param.name), []) + BY_TYPE.get(param.bare_type(), [])
            assert values, f"{name} {param.name} ({param.bare_type()}): list its bad values in BY_NAME, or in FREE"
            for value in values:
                found.append((name, param.name, value))
    return found


def _invocation(command: str, option: str, value: str, tmp: str) -> list[str]:
    group = typer.main.get_command(app)
    param = next(p for p in group.commands[command].params if p.name == option)  # type: ignore[attr-defined]
    base = [a.format(tmp=tmp) for a in BASE_FOR.get((command, option), BASE[command])]
    value = value.format(tmp=tmp)
    if not param.opts[0].startswith("-"):  # an argument: it replaces the base's first one
        return [command, value, *base[1:]]
    flag = param.opts[0]
    drop = {o for o in param.opts}
    kept: list[str] = []
    skip = False
    for arg in base:
        if skip:
            skip = False
            continue
        if arg in drop:
            skip = True
            continue
        kept.append(arg)
    return [command, *kept, flag, value]


CASES = cases()


@pytest.mark.parametrize(("command", "option", "value"), CASES, ids=[f"{c}-{o}-{v!r}" for c, o, v in CASES])
def test_a_bad_value_is_one_line(toy, tmp_path, narrow_terminal, command, option, value):
    (tmp_path / "garbage.json").write_text("{not json")
    (tmp_path / "db.json").write_text(json.dumps({"format": "tunekit-db", "schema": 1, "entries": []}))
    args = _invocation(command, option, value, str(tmp_path))
    result = cli(*args)
    assert result.exit_code not in (0, None), f"{args} was accepted: {result.output}"
    assert "Traceback" not in result.output, result.output
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{args}: {result.stderr!r}"


# A plan file whose problems no kernel takes: refused when read (tunekit/fleet/plans.py checks each problem against
# its kernel's declaration).
BAD_PLAN_LINES = [
    pytest.param(
        {"kernel": "layernorm", "problem": {"rows": 4, "cols": 4097, "dtype": "float8", "weight": True, "bias": True}},
        id="problem-float8",
    ),
    pytest.param({"kernel": "gemm", "shape": [64, 64, 64], "dtype": "int8"}, id="shape-int8"),
]


@pytest.mark.parametrize("line", BAD_PLAN_LINES)
@pytest.mark.parametrize("command", [["plan"], ["tune", "--trials", "1", "--plan"]], ids=["plan", "tune"])
def test_a_bad_plan_is_one_line(tmp_path, command, line):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(line) + "\n")
    result = cli(*command, str(path))
    assert result.exit_code not in (0, None), result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, KeyError)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
