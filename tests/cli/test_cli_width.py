"""Every command rendered on an 80-column terminal: no line over 80 columns (save one unbreakable word, such as a
long path), records wrapped between their `name=value` pairs, tables as records where they would not fit. Also the
log form of `tune` (progress lines, Ctrl-C), and the environment variables of tunekit/cli/README.md."""

from __future__ import annotations

import json
import re
import sys

import pytest
from helpers import ROOT, cli

from tunekit.core import settings

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@pytest.fixture
def terminal_80(narrow_terminal, monkeypatch):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich treats stdout as a terminal


def render(*args: str) -> list[str]:
    result = cli(*args)
    assert result.exit_code == 0, result.output
    lines = [ANSI.sub("", line) for line in result.output.splitlines()]
    over = [line for line in lines if len(line) > 80 and len(line.split()) > 1]
    assert not over, f"{args}: lines over 80 columns:\n" + "\n".join(over)
    return lines


def test_each_command_fits_80_columns(toy, terminal_80, tmp_path):
    journal = str(tmp_path / "q.journal")
    render("tune", "-k", "toy", "-s", "8x32", "-s", "3x16", "--trials", "3")
    render("tune", "-k", "toy", "-s", "8x32", "-s", "3x16", "--trials", "2", "--submit", "--storage", journal)
    status = render("status", "--storage", journal, "--jobs")
    assert any(line.startswith("  queue=default id=") for line in status)  # the jobs table, as records
    gemm = render("show", "-k", "gemm", "-s", "4097x4096x4096")
    assert "    activation=none has_bias=False has_residual=False aligned16=True" in gemm  # wrapped between pairs
    render("show", "-k", "layernorm")
    render("show", "--no-shipped")
    plan = tmp_path / "plan.jsonl"
    render("plan", str(plan), "-k", "gemm", "-s", "4097x4096x4096")
    render("plan", str(plan))
    explained = render("explain", "-k", "gemm", "-s", "4097x4096x4096", "--table", "h200-sm90-132sm/gemm")
    assert any(line.startswith("persistent 128x256: valid=") for line in explained)  # the family table as records
    render("devices")
    db = tmp_path / "db.json"
    render("export", "--out", str(db))
    render("import", str(db))
    render("forget", "--kernel", "toy", "--dry-run")
    render("--help")
    for command in ("tune", "worker", "status", "plan", "show", "export", "import", "explain", "bench"):
        render(command, "--help")


def test_help_shows_flags_without_a_metavar_and_lists_the_environment(terminal_80):
    tune = render("tune", "--help")
    assert not any("<bool>" in line for line in tune)
    assert any(line.startswith("  --force ") for line in tune)
    top = "\n".join(render("--help"))
    assert all(name in top for name, _, _ in settings.ENVIRONMENT)


def test_the_reference_lists_exactly_the_environment_variables():
    """tunekit/cli/README.md's table: settings.ENVIRONMENT's variables, in its order, each with its default and its
    meaning (a row may say more after it), so that the reference cannot go stale."""
    reference = (ROOT / "tunekit" / "cli" / "README.md").read_text()
    section = reference[reference.index("## Environment variables") :]
    rows = re.findall(r"^\| `([A-Z_]+)` \| (.*) \| (.*) \|$", section, re.M)
    assert [name for name, _, _ in rows] == [name for name, _, _ in settings.ENVIRONMENT]
    for (name, meaning, default), (_, code_meaning, code_default) in zip(rows, settings.ENVIRONMENT):
        assert default == code_default, name
        assert meaning.startswith(code_meaning), (name, meaning, code_meaning)


def test_a_log_gets_progress_lines(toy, monkeypatch):
    monkeypatch.setattr(sys.modules["tunekit.cli.tune"], "PROGRESS_EVERY_TRIALS", 2)  # the name `tune` is the command
    result = cli("tune", "-k", "toy", "-s", "8x32", "--trials", "4")
    assert result.exit_code == 0, result.output
    progress = [line for line in result.output.splitlines() if line.startswith("  progress ")]
    assert progress[0].startswith("  progress toy rows=8 cols=32 dtype=float32: 2/4 trials (2 measured now), best ")
    assert progress[-1].startswith("  progress toy rows=8 cols=32 dtype=float32: 4/4 trials")


def test_ctrl_c_says_what_was_stored_and_exits_130(toy, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("tunekit.tuning.orchestrate.tune_and_store", interrupted)
    result = cli("tune", "-k", "toy", "-s", "8x32", "--trials", "4")
    assert result.exit_code == 130
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert line.startswith("interrupted: 0 of 1 problems tuned and stored; toy rows=8 cols=32 dtype=float32 kept")


def test_status_reads_the_default_storage_and_creates_nothing(isolated_cache):
    result = cli("status")
    assert result.exit_code == 0 and "no queues in sqlite:///" in result.output
    assert not isolated_cache.exists()
    document = json.loads(cli("status", "--json").stdout)
    assert document["queues"] == {} and document["storage"].endswith("fleet.db")


def test_json_on_status_plan_explain_export_import(toy, tmp_path):
    def document(*args: str) -> dict:
        result = cli(*args)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    journal = str(tmp_path / "q.journal")
    assert cli("tune", "-k", "toy", "-s", "8x32", "--submit", "--storage", journal).exit_code == 0
    status = document("status", "--storage", journal, "--jobs", "--json")
    assert status["queues"]["default"]["counts"]["queued"] == 1 and len(status["queues"]["default"]["jobs"]) == 1
    plan = tmp_path / "plan.jsonl"
    assert document("plan", str(plan), "-k", "toy", "-s", "8x32", "--json")["written"] == 1
    assert document("plan", str(plan), "--json")["problems"] == [
        {"kernel": "toy", "problem": {"rows": 8, "cols": 32, "dtype": "float32"}}
    ]
    explained = document("explain", "-k", "gemm", "-s", "64x64x64", "--table", "h200-sm90-132sm/gemm", "--json")
    assert explained["problem"]["m"] == 64 and "Candidate families" in explained["text"]
    assert cli("tune", "-k", "toy", "-s", "8x32", "--trials", "2").exit_code == 0
    db = tmp_path / "db.json"
    assert document("export", "--out", str(db), "--json")["exported"] == 1
    assert document("import", str(db), "--json") | {"file": None, "cache": None} == {
        "file": None, "cache": None, "read": 1, "added": 0, "improved": 0, "kept": 1, "refused": 0
    }  # fmt: skip
