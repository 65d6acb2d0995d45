"""What a new user met, each said in one clear line: an unknown --device for export, a plan file that
already exists, an environment variable with a bad value (the CLI and Python say the same), a cache directory that
is a file, explain on a machine with no GPU, bench's header in a pipe, an option's bad value, and counts that are
singular."""

from __future__ import annotations

import json

import pytest
from fingerprints import H200
from helpers import cli, toy_entry

from tunekit.core import settings
from tunekit.core.device import fingerprint
from tunekit.core.errors import TunekitError
from tunekit.store.store import Store


def _error_line(result) -> str:
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# ------------------------------------------------------------------------------------------ export --device


def test_export_of_an_unknown_device_is_an_error_naming_the_cache_devices(toy, tmp_path):
    with Store() as store:
        store.put(toy_entry(toy, H200, 0.5))
    out = tmp_path / "db.json"
    line = _error_line(cli("export", "--device", "nosuchdevice", "--out", str(out)))
    assert "'nosuchdevice'" in line and H200.key in line and "NVIDIA H200" in line, line
    assert not out.exists()


def test_export_takes_a_device_key_prefix_as_show_prints_it(toy, tmp_path):
    with Store() as store:
        store.put(toy_entry(toy, H200, 0.5))
        store.put(toy_entry(toy, fingerprint(), 1.0))
    out = tmp_path / "db.json"
    result = cli("export", "--device", H200.key[:8], "--out", str(out))
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(out.read_text())["entries"]
    assert entry["key"]["device_key"] == H200.key


def test_export_of_nothing_says_why(tmp_path):
    result = cli("export", "--device", "current", "--out", str(tmp_path / "db.json"))
    assert result.exit_code == 0, result.output
    assert "exported 0 entries" in result.output and "the cache holds no entry of this device" in result.output


# ------------------------------------------------------------------------------------------ plan FILE exists


def test_plan_refuses_to_replace_an_existing_plan_without_force(toy, tmp_path):
    plan = tmp_path / "plan.jsonl"
    assert cli("plan", str(plan), "-k", "toy", "-s", "8x32", "-s", "4x16").exit_code == 0
    before = plan.read_text()
    line = _error_line(cli("plan", str(plan), "-k", "toy", "-s", "2x8"))
    assert str(plan) in line and "2 problems" in line and "--force" in line, line
    assert plan.read_text() == before
    result = cli("plan", str(plan), "-k", "toy", "-s", "2x8", "--force")
    assert result.exit_code == 0, result.output
    assert "replaced the 2 problems it held" in result.output
    assert len(plan.read_text().splitlines()) == 1


# ------------------------------------------------------------------------------------------ environment


BAD_ENVIRONMENT = [
    ("TUNEKIT_STRICT", "maybe"),
    ("TUNEKIT_TUNE_ON_MISS", "sometimes"),
    ("TUNEKIT_BUCKETS", "2"),
    ("TUNEKIT_TUNE_ON_MISS_TRIALS", "-3"),
    ("TUNEKIT_CACHE_MAX_MB", "lots"),
    ("TUNEKIT_UNTUNED", "cuda"),
    ("TUNEKIT_OTHER_TRITON", "always"),
    ("TUNEKIT_EXTRA_KERNELS", "nomodule"),
    ("TUNEKIT_DEBUG", "maybe"),
]


@pytest.mark.parametrize(("name", "value"), BAD_ENVIRONMENT)
def test_a_bad_environment_variable_is_refused_alike_by_the_cli_and_python(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    line = _error_line(cli("show", "--no-shipped"))
    with pytest.raises(TunekitError) as raised:
        settings.check_environment()
    assert name in str(raised.value) and repr(value) in str(raised.value)
    assert line == f"error: {raised.value}"


def test_strict_names_its_valid_values(monkeypatch):
    monkeypatch.setenv("TUNEKIT_STRICT", "maybe")
    with pytest.raises(TunekitError, match=r"TUNEKIT_STRICT must be 1 or 0 \(true/false, yes/no, on/off\)"):
        settings.strict()


def test_a_cache_dir_that_is_a_file_is_one_clear_line(monkeypatch, tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("")
    for where in (afile, afile / "below"):
        monkeypatch.setenv("TUNEKIT_CACHE_DIR", str(where))
        line = _error_line(cli("show", "--no-shipped"))
        assert "FileExistsError" not in line and "Errno" not in line, line
        assert line == f"error: TUNEKIT_CACHE_DIR must name a directory, but {afile} is a file", line
        with pytest.raises(TunekitError, match="must name a directory"):
            Store()


# ------------------------------------------------------------------------------------------ one line, short


def test_explain_without_a_gpu_is_one_short_line():
    line = _error_line(cli("explain", "-k", "gemm", "-s", "64x64x64"))
    assert len(line) <= 120 and "--table" in line, line


def test_bench_header_in_a_pipe_is_whole_lines(narrow_terminal):
    result = cli("bench", "-k", "layernorm", "--quick", "-s", "4x256", "--dtype", "float16")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("interpreter-") and lines[0].endswith(", timer interpreter-wall-clock"), lines[:2]
    assert "note: torch.compile skipped: off by default in the interpreter; --compile runs it on the CPU" in lines


def test_a_bad_trial_count_names_the_option():
    result = cli("tune", "-k", "layernorm", "-s", "8x32", "--trials", "-3")
    assert _error_line(result) == "error: --trials must be >= 1, but got -3"


def test_one_repeat_suggestion_is_singular():
    from tunekit.cli.views import TuneResult

    class Report:
        skipped, shared_from, benchmarked, reused, stop_reason = False, None, 3, 1, "trial budget"

    class Stored:
        trials = (1, 2, 3)

    counts = TuneResult.counts(type("R", (), {"report": Report(), "entry": Stored(), "skipped": False})())
    assert counts == "3 measured (and 1 repeat suggestion answered from them), 3 stored (trial budget)"
