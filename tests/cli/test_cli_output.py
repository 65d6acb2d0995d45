"""What `tunekit tune`, `show` and `devices` print: readable at 80 columns with nothing cut, one plain line per
finished shape when stdout is not a terminal, JSON with --json, shipped entries in `show` with the layer that serves
each, --version and `python -m tunekit`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import cli

from tunekit import DISTRIBUTION, __version__


def test_tune_at_80_columns_prints_the_full_problem_and_config(toy, narrow_terminal):
    result = cli("tune", "-k", "toy", "-s", "8x32", "--trials", "4")
    assert result.exit_code == 0, result.output
    assert "toy rows=8 cols=32 dtype=float32" in result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("toy rows=8")]
    assert "config BLOCK=" in line and "variant=" in line and "num_warps=" in line  # nothing cut


def test_tune_on_a_terminal_at_80_columns_prints_the_full_problem(toy, narrow_terminal, monkeypatch):
    monkeypatch.setenv("TTY_COMPATIBLE", "1")  # rich treats stdout as a terminal: progress bar, result blocks
    result = cli("tune", "-k", "toy", "-s", "8x32", "--trials", "4")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "toy rows=8 cols=32 dtype=float32" in lines  # the block's own line, whole
    config_line = next(line for line in lines if line.startswith("  config "))
    assert "BLOCK=" in config_line and "variant=" in config_line and "num_warps=" in config_line


def test_gemm_problems_are_not_cut_at_80_columns(narrow_terminal):
    """The longest problem form (GEMM) stays whole in show's output at 80 columns."""
    result = cli("show", "--kernel", "gemm", "--shape", "4097x4096x4096", "--dtype", "float16")
    assert result.exit_code == 0, result.output
    want = (
        "gemm m=4097 n=4096 k=4096 dtype=float16 a_layout=row b_layout=row activation=none has_bias=False "
        "has_residual=False aligned16=True"
    )
    assert want in result.output.splitlines()


def test_not_a_terminal_one_plain_line_per_finished_shape(toy):
    result = cli("tune", "-k", "toy", "-s", "8x32", "-s", "3x16", "--trials", "3")
    assert result.exit_code == 0, result.output
    assert "\x1b[" not in result.output  # no progress bar, no colour
    results = [line for line in result.output.splitlines() if line.startswith("toy ")]
    assert [line.split(":")[0] for line in results] == [
        "toy rows=8 cols=32 dtype=float32",
        "toy rows=4 cols=16 dtype=float32",
    ]
    assert all("measured" in line and "; config " in line for line in results)


def test_interpreter_timings_are_called_meaningless_and_give_no_speedup(toy):
    result = cli("tune", "-k", "toy", "-s", "8x32", "--trials", "3")
    assert "mean nothing for a GPU" in result.output
    assert "heuristic" not in result.output and "x)" not in result.output


def test_tune_json(toy):
    result = cli("tune", "-k", "toy", "-s", "8x32", "--trials", "3", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["device"]["interpreter"] is True and "mean nothing" in document["note"]
    (r,) = document["results"]
    assert r["kernel"] == "toy" and r["problem"] == {"rows": 8, "cols": 32, "dtype": "float32"}
    assert r["status"] == "tuned" and r["measured"] == 3 and r["stored_trials"] == 3
    assert set(r["config"]) == {"BLOCK", "variant", "num_warps"} and r["timer"] == "interpreter-wall-clock"
    # Where the problem's seconds went (tunekit.tuning.phases): each candidate's first launch, check and timing.
    assert all(r["phases"][p] > 0 for p in ("compile", "verify", "bench", "store"))
    assert document["phases"]["bench"] == pytest.approx(r["phases"]["bench"], abs=1e-3)


def test_show_json_lists_cache_and_shipped_entries_with_the_serving_layer(toy):
    assert cli("tune", "-k", "toy", "-s", "8x32", "--trials", "3").exit_code == 0
    result = cli("show", "--json", "--all-devices")  # the shipped entries are the H200's and H100's
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    by_source: dict[str, list[dict]] = {}
    for entry in document["entries"]:
        by_source.setdefault(entry["source"], []).append(entry)
    (mine,) = by_source["cache"]
    assert mine["kernel"] == "toy" and mine["served_here_by"] == "cache" and mine["servable_here"] is True
    shipped = by_source["shipped"]
    assert len(shipped) > 100 and "NVIDIA H200" in {e["device_name"] for e in shipped}
    # On this CPU machine no shipped (GPU) entry can serve: each problem falls to the nearest tuned one or the
    # heuristic.
    assert {e["served_here_by"] for e in shipped} <= {"nearest", "heuristic"}
    assert all(not e["servable_here"] for e in shipped)


def test_show_text_lists_shipped_entries_with_their_layer(narrow_terminal):
    result = cli("show", "--kernel", "layernorm", "--all-devices")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    shipped = [line for line in lines if line.startswith("  shipped · NVIDIA H200")]
    assert shipped and all("served here by " in line for line in shipped)
    assert lines[-1].startswith("0 entries in the cache, ") and lines[-1].endswith(" shipped")
    assert sum(line.startswith("layernorm rows=") for line in lines) == len(shipped)
    assert "shipped entries hidden by --no-shipped" in cli("show", "--no-shipped").output


def test_show_escapes_stored_text(toy):
    """A device name from storage is printed as text: no rich markup applied, no control characters passed."""
    from dataclasses import replace

    from tunekit.store.store import Store

    assert cli("tune", "-k", "toy", "-s", "8x32", "--trials", "2").exit_code == 0
    with Store() as store:
        (entry,) = store.entries()
        store.delete(entry.key.digest)  # (a stored time of 0, which would win the merge, is never served)
        store.put(replace(entry, device={**entry.device, "name": "[bold]x[/bold]\x1b[31mred"}))
    result = cli("show", "--no-shipped")
    assert result.exit_code == 0, result.output
    assert "[bold]x[/bold]\\x1b[31mred" in result.output and "\x1b" not in result.output


def test_devices_json():
    result = cli("devices", "--json")
    assert result.exit_code == 0, result.output
    (device,) = json.loads(result.stdout)["devices"]
    assert device["interpreter"] is True and device["vendor"] == "triton-interpreter" and len(device["key"]) >= 8


def test_show_kernels_json():
    document = json.loads(cli("show", "--kernels", "--json").stdout)
    assert {"gemm", "layernorm", "softmax"} <= set(document["kernels"])


def test_version():
    result = cli("--version")
    assert result.exit_code == 0 and result.output.strip() == f"tunekit {__version__} (distribution {DISTRIBUTION})"


def test_python_dash_m_tunekit():
    done = subprocess.run(
        [sys.executable, "-m", "tunekit", "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "Usage: tunekit" in done.stdout and "tune" in done.stdout
    done = subprocess.run(
        [sys.executable, "-m", "tunekit", "--version"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip().startswith(f"tunekit {__version__}")
