"""Problems are validated by their kernel's declaration wherever they enter: plan files (read and written),
`tunekit plan`, `tune --plan`, imports and store rows (rows=true, cols=0, a_layout="diag", m=0,
activation="tanh", dtype float64 and rows=1e30 were tuned and stored, or raised KeyError / TypeError; a deeply
nested plan raised RecursionError)."""

from __future__ import annotations

import json

import pytest
from helpers import cli

from tunekit.core.errors import DatabaseError, TunekitError
from tunekit.core.problems import problem_error
from tunekit.core.registry import get_spec
from tunekit.fleet.plans import read_plan
from tunekit.runtime.recorder import write_plan
from tunekit.store.database import shipped_entries, validate_entry

LN = {"rows": 8, "cols": 256, "dtype": "float32", "weight": True, "bias": True}
GEMM = {
    "m": 32, "n": 32, "k": 128, "dtype": "float32", "a_layout": "row", "b_layout": "row", "activation": "relu",
    "has_bias": True, "has_residual": False, "aligned16": True,
}  # fmt: skip
BAD = [
    ("layernorm", {**LN, "rows": True}),
    ("layernorm", {**LN, "cols": 0}),
    ("layernorm", {**LN, "rows": 1e30}),
    ("layernorm", {**LN, "rows": 10**30}),
    ("layernorm", {**LN, "dtype": "float64"}),
    ("layernorm", {**LN, "weight": 1}),
    ("gemm", {**GEMM, "a_layout": "diag"}),
    ("gemm", {**GEMM, "m": 0}),
    ("gemm", {**GEMM, "activation": "tanh"}),
    ("gemm", {**GEMM, "dtype": "int8"}),
]
IDS = [f"{k}-{i}" for i, (k, _) in enumerate(BAD)]


@pytest.mark.parametrize(("kernel", "problem"), BAD, ids=IDS)
def test_the_declaration_refuses(kernel, problem):
    assert problem_error(get_spec(kernel), problem)


@pytest.mark.parametrize(("kernel", "problem"), [("layernorm", LN), ("gemm", GEMM)])
def test_the_declaration_accepts_real_problems(kernel, problem):
    spec = get_spec(kernel)
    assert problem_error(spec, problem) is None
    from tunekit.core.device import fingerprint

    for p in spec.default_problems(fingerprint()):
        assert problem_error(spec, p) is None, p


def test_every_shipped_and_default_problem_is_valid():
    for entry in shipped_entries().values():
        spec = get_spec(entry.key.kernel)
        assert problem_error(spec, dict(entry.key.problem)) is None, entry.key


@pytest.mark.parametrize(("kernel", "problem"), BAD, ids=IDS)
def test_a_plan_file_is_refused_read_and_written(kernel, problem, tmp_path):
    path = tmp_path / "plan.jsonl"
    path.write_text(json.dumps({"kernel": kernel, "problem": problem}) + "\n")
    with pytest.raises(TunekitError) as info:
        read_plan(path)
    assert "\n" not in str(info.value)
    with pytest.raises(TunekitError):
        write_plan(tmp_path / "out.jsonl", [(kernel, problem)])
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize(("kernel", "problem"), BAD, ids=IDS)
def test_tune_plan_and_plan_refuse_in_one_line(kernel, problem, tmp_path):
    path = tmp_path / "plan.jsonl"
    path.write_text(json.dumps({"kernel": kernel, "problem": problem}) + "\n")
    for args in (["plan", str(path)], ["tune", "--plan", str(path), "--trials", "1"]):
        result = cli(*args)
        assert result.exit_code == 1, (args, result.output, result.exception)
        assert "Traceback" not in result.output and result.output.strip().count("\n") == 0, result.output


def test_a_deeply_nested_plan_is_refused(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(TunekitError):
        read_plan(path)
    path.write_text('{"kernel": "layernorm", "problem": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(TunekitError):
        read_plan(path)


@pytest.mark.parametrize(("kernel", "problem"), BAD, ids=IDS)
def test_an_import_is_refused(kernel, problem):
    entry = next(e for e in shipped_entries().values() if e.key.kernel == kernel).to_json()
    entry["key"]["problem"] = problem
    with pytest.raises(DatabaseError):
        validate_entry(entry)


@pytest.mark.parametrize("bad", [{**LN, "rows": True}, {**LN, "cols": 0}, {**LN, "dtype": "float64"}])
def test_a_store_row_outside_the_declaration_is_never_served(bad):
    from tunekit.core.device import fingerprint
    from tunekit.store.entry import Entry
    from tunekit.store.key import CacheKey
    from tunekit.store.store import Store

    spec, device = get_spec("layernorm"), fingerprint()
    good = Entry(
        CacheKey.make("layernorm", spec.source_hash, device.key, LN), spec.heuristic(LN, device), 1.0,
        device.to_json(), {"strategy": "tpe"},
    )  # fmt: skip
    entry = Entry(CacheKey.make("layernorm", spec.source_hash, device.key, bad), *list(good.__dict__.values())[1:])
    with Store() as store:
        store.put(good)
        store.put(entry)
        assert store.get(good.key) == good
        assert store.get(entry.key) is None
