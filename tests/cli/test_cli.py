from __future__ import annotations

import json

import pytest
from helpers import cli

from tunekit.store.store import Store

pytestmark = pytest.mark.usefixtures("wide_terminal")


def test_help_on_every_command():
    for cmd in ([], ["tune"], ["show"], ["export"], ["import"], ["devices"]):
        result = cli(*cmd, "--help")
        assert result.exit_code == 0, result.output
        assert "Usage" in result.output


def test_tune_show_export_import(toy, tmp_path, monkeypatch):
    result = cli("tune", "--kernel", "toy", "--shape", "8x32", "--shape", "3x16", "--trials", "6")
    assert result.exit_code == 0, result.output
    assert "toy rows=8 cols=32 dtype=float32:" in result.output and "toy rows=4 cols=16 dtype=float32:" in result.output
    with Store() as store:
        assert len(store) == 2

    result = cli("show", "--kernel", "toy", "--shape", "8x32")
    assert result.exit_code == 0 and "served by cache" in result.output
    result = cli("show", "--kernel", "toy", "--shape", "8x8")
    assert "served by nearest" in result.output or "served by heuristic" in result.output
    assert "2 entries in the cache" in cli("show", "--no-shipped").output

    out = tmp_path / "db.json"
    result = cli("export", "--out", str(out), "--kernel", "toy", "--device", "current")
    assert result.exit_code == 0 and "exported 2 entries" in result.output
    assert len(json.loads(out.read_text())["entries"]) == 2

    monkeypatch.setenv("TUNEKIT_CACHE_DIR", str(tmp_path / "other"))
    result = cli("import", str(out))
    assert result.exit_code == 0 and "2 entries read, 2 added" in result.output
    with Store() as store:
        assert len(store) == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["tune", "--kernel", "nope"], "unknown kernel 'nope'. Available: ['cross_entropy', 'gemm', 'layernorm'"),
        (["tune", "--kernel", "toy", "--shape", "8xx2"], "--shape must be positive integers"),
        (["tune", "--kernel", "toy", "--shape", "0x4"], "--shape must be positive integers"),
        (["tune", "--kernel", "toy", "--shape", "8x4x2"], "toy shapes are MxN"),
        (["tune", "--kernel", "toy", "--sampler", "annealing"], "unknown sampler 'annealing'"),
        (["tune", "--kernel", "toy", "--trials", "0"], "trials must be >= 1"),
        (["export", "--kernel", "nope", "--out", "x.json"], "unknown kernel 'nope'"),
        (["show", "--shape", "8x8"], "--shape needs --kernel"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(toy, args, message):
    result = cli(*args)
    assert result.exit_code == 1
    assert message in result.output
    assert "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.startswith("error:")]) == 1


def test_bad_import_file_leaves_store_unchanged(toy, tmp_path):
    assert cli("tune", "-k", "toy", "-s", "8x32", "--trials", "3").exit_code == 0
    with Store() as store:
        before = [e.to_json() for e in store.entries()]
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "tunekit-db", "schema": 1, "entries": [{"key": 3}]}')
    result = cli("import", str(bad))
    assert result.exit_code == 1 and "entry 0" in result.output
    with Store() as store:
        assert [e.to_json() for e in store.entries()] == before


def test_unwritable_cache_dir(toy, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("TUNEKIT_CACHE_DIR", str(blocker))
    result = cli("tune", "-k", "toy", "-s", "8x32", "--trials", "2")
    assert result.exit_code == 1 and "TUNEKIT_CACHE_DIR must name a directory" in result.output


def test_devices_lists_the_interpreter():
    result = cli("devices")
    assert result.exit_code == 0 and "triton-interpreter" in result.output and "key=" in result.output


def test_import_counts_each_key_once_and_refuses_what_serving_would(toy, tmp_path):
    """The same key twice is an error (never "2 added"); a config that breaks the rules refuses the file."""
    from helpers import toy_entry

    from tunekit.core.device import fingerprint
    from tunekit.store.database import document

    entry = toy_entry(toy, fingerprint(), 1.0)
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps(document([entry]) | {"entries": [entry.to_json()] * 2}))
    result = cli("import", str(twice))
    assert result.exit_code == 1 and "entry 1: the same key as entry 0" in result.output
    wide = entry.to_json()
    wide["best"]["config"]["BLOCK"] = 64  # wider than the row (cols = 32)
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(document([]) | {"entries": [wide]}))
    result = cli("import", str(broken))
    assert result.exit_code == 1 and "breaks the toy space's rule 'block_fits_row'" in result.output
    with Store() as store:
        assert len(store) == 0
    once = tmp_path / "once.json"
    once.write_text(json.dumps(document([entry])))
    result = cli("import", str(once))
    assert result.exit_code == 0 and "1 entry read, 1 added, 0 improved" in result.output
    result = cli("import", str(once))
    assert result.exit_code == 0 and "1 entry read, 0 added, 0 improved, 1 left as they were" in result.output


def test_export_refuses_a_symlink_and_keeps_the_old_file_on_failure(toy, tmp_path):
    assert cli("tune", "-k", "toy", "-s", "8x32", "--trials", "2").exit_code == 0
    target = tmp_path / "elsewhere.json"
    target.write_text("not yours")
    link = tmp_path / "db.json"
    link.symlink_to(target)
    result = cli("export", "--out", str(link))
    assert result.exit_code == 1 and "it is a symbolic link" in result.output and "Traceback" not in result.output
    assert target.read_text() == "not yours"
    result = cli("export", "--out", str(tmp_path / "no" / "such" / "dir.json"))
    assert result.exit_code == 1 and "cannot write" in result.output
