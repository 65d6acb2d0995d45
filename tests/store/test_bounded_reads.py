"""Every file tunekit reads goes through one bounded reader: a FIFO, a device or a socket is refused
without blocking, a symlink is followed and its target checked, the size is capped, JSON nesting is bounded before
json's recursion, and the error is one line naming the file. Before: a FIFO as a plan, as other_triton.json, as a
pack or given to `tunekit import` hung forever; a plan linked to /dev/zero grew to 15 GB in a minute;
other_triton.json holding `[` x 100000 raised RecursionError from the first op call.

A read that would hang runs in a thread (or, where it would grow without limit, a memory-capped subprocess) under
a timeout, so a regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import ROOT, cli

from tunekit.core.errors import DatabaseError, TunekitError
from tunekit.store import bounded_file
from tunekit.store.bounded_file import UnreadableFileError, load_json, read_text

HANG_S = 20.0  # a refusal takes milliseconds; a read still blocked after this is a hang


def within(read: Callable[[], Any], fifo: Path | None = None) -> Any:
    """`read()`'s result (or the exception it raised), failing the test if it is still running after HANG_S. A
    reader blocked on `fifo` is released by opening its other end, so the thread ends."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = read()
        except BaseException as exc:  # handed to the test, which asserts on it
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    if thread.is_alive():
        if fifo is not None:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the blocked reader sees end of file
            thread.join(HANG_S)
        pytest.fail(f"the read was still blocked after {HANG_S:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "fifo.json"
    os.mkfifo(path)
    return path


# ------------------------------------------------------------------------------------------ the reader itself


def test_a_regular_file_is_read(tmp_path):
    path = tmp_path / "a.json"
    path.write_text('{"a": [1, {"b": 2}]}')
    assert load_json(path, "a test file") == {"a": [1, {"b": 2}]}
    assert read_text(path, "a test file") == '{"a": [1, {"b": 2}]}'


def test_a_symlink_to_a_regular_file_is_read(tmp_path):
    target = tmp_path / "target.json"
    target.write_text("[1]")
    (tmp_path / "link.json").symlink_to(target)
    assert load_json(tmp_path / "link.json", "a test file") == [1]


@pytest.mark.parametrize(
    "make, kind",
    [
        (lambda p: os.mkfifo(p), "a FIFO"),
        (lambda p: p.symlink_to("/dev/zero"), "a character device"),
        (lambda p: p.symlink_to("/dev/null"), "a character device"),
        (lambda p: p.mkdir(), "a directory"),
    ],
    ids=["fifo", "dev-zero", "dev-null", "directory"],
)
def test_what_is_not_a_regular_file_is_refused_without_blocking(tmp_path, make, kind):
    path = tmp_path / "thing.json"
    make(path)
    with pytest.raises(UnreadableFileError) as info:
        within(lambda: read_text(path, "a test file"), path if kind == "a FIFO" else None)
    message = str(info.value)
    assert str(path) in message and kind in message and "not a regular file" in message, message
    assert "\n" not in message


def test_a_socket_is_refused(tmp_path):
    path = tmp_path / "s.json"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        with pytest.raises(UnreadableFileError, match="a socket, not a regular file"):
            within(lambda: read_text(path, "a test file"))


def test_a_file_past_the_cap_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.json"
    with open(path, "wb") as f:
        f.truncate(1001)
    with pytest.raises(UnreadableFileError, match="larger than 1000 bytes"):
        read_text(path, "a test file", max_bytes=1000)


def test_a_missing_file_says_so(tmp_path):
    with pytest.raises(UnreadableFileError) as info:
        read_text(tmp_path / "nope.json", "a test file")
    assert info.value.missing and "nope.json" in str(info.value)


@pytest.mark.parametrize("text", ["[" * 100_000, "[" * 100_000 + "]" * 100_000, '{"a": ' * 50_000 + "1" + "}" * 50_000])
def test_deep_nesting_is_refused_before_json_recurses(tmp_path, text, monkeypatch):
    path = tmp_path / "deep.json"
    path.write_text(text)
    monkeypatch.setattr(json, "loads", lambda *a, **k: pytest.fail("json ran on a document nested too deeply"))
    with pytest.raises(UnreadableFileError, match="nested deeper than"):
        load_json(path, "a test file")


def test_brackets_inside_strings_are_not_nesting(tmp_path):
    path = tmp_path / "strings.json"
    path.write_text(json.dumps({"a": "[" * 1000 + '\\"{' * 100, "b": ["]" * 5]}))
    assert load_json(path, "a test file")["b"] == ["]" * 5]


def test_nesting_at_the_limit_is_read(tmp_path):
    path = tmp_path / "limit.json"
    depth = bounded_file.MAX_JSON_DEPTH
    path.write_text("[" * depth + "]" * depth)
    assert load_json(path, "a test file") is not None
    path.write_text("[" * (depth + 1) + "]" * (depth + 1))
    with pytest.raises(UnreadableFileError):
        load_json(path, "a test file")


# ------------------------------------------------------------------------------------------ each surface


def test_a_fifo_as_a_plan_is_refused(fifo):
    from tunekit.fleet.plans import read_plan

    with pytest.raises(TunekitError, match="a FIFO, not a regular file"):
        within(lambda: read_plan(fifo), fifo)
    result = within(lambda: cli("plan", str(fifo)), fifo)
    assert result.exit_code == 1 and "a FIFO" in result.output and "Traceback" not in result.output


def test_a_fifo_given_to_import_is_refused(fifo):
    result = within(lambda: cli("import", str(fifo)), fifo)
    assert result.exit_code == 1 and "a FIFO, not a regular file" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_fifo_as_a_database_is_refused(fifo):
    from tunekit.store.database import read_document

    with pytest.raises(DatabaseError, match="a FIFO"):
        within(lambda: read_document(fifo), fifo)


def test_a_fifo_as_a_pack_is_skipped_with_a_warning(tmp_path, caplog):
    from tunekit.store.database import read_shipped

    (tmp_path / "packs").mkdir()
    os.mkfifo(tmp_path / "packs" / "model.json")
    with caplog.at_level(logging.WARNING):
        found = within(lambda: read_shipped(tmp_path), tmp_path / "packs" / "model.json")
    assert found == {} and "a FIFO" in caplog.text


def _verdicts_file(isolated_cache: Path) -> Path:
    from tunekit.runtime.version_policy import verdicts_path

    isolated_cache.mkdir(parents=True, exist_ok=True)
    assert verdicts_path().parent == isolated_cache
    return verdicts_path()


def test_a_fifo_as_other_triton_json_is_ignored(isolated_cache, caplog):
    from tunekit.runtime import version_policy

    path = _verdicts_file(isolated_cache)
    os.mkfifo(path)
    with caplog.at_level(logging.WARNING):
        assert within(version_policy._read_verdicts, path) == {}
    assert "a FIFO" in caplog.text


@pytest.mark.parametrize("text", ["[" * 100_000, '{"format": ' + "[" * 100_000])
def test_deeply_nested_other_triton_json_is_ignored(isolated_cache, caplog, text):
    from tunekit.runtime import version_policy

    _verdicts_file(isolated_cache).write_text(text)
    with caplog.at_level(logging.WARNING):
        assert version_policy._read_verdicts() == {}
    assert "nested deeper than" in caplog.text


def test_a_fifo_as_a_timing_table_is_refused(fifo):
    from tunekit.evaluation.timing_table import load_tables

    with pytest.raises(TunekitError, match="not a regular file"):
        within(lambda: load_tables(fifo), fifo)


def test_a_deeply_nested_timing_table_is_refused(tmp_path):
    import gzip

    from tunekit.evaluation.timing_table import load_tables

    path = tmp_path / "deep.json.gz"
    with gzip.open(path, "wb") as f:
        f.write(b"[" * 100_000)
    with pytest.raises(TunekitError, match="nested deeper than"):
        load_tables(path)


def test_a_fifo_as_saved_bench_results_is_refused(fifo):
    result = within(lambda: cli("bench", "--summary", str(fifo)), fifo)
    assert result.exit_code == 1 and "a FIFO, not a regular file" in result.output, result.output


_READ_PLAN = "import sys, pathlib; from tunekit.fleet.plans import read_plan; read_plan(pathlib.Path(sys.argv[1]))"


def test_a_plan_linked_to_dev_zero_is_refused(tmp_path):
    """In a subprocess capped at 4 GiB of address space: before, the read grew without limit."""
    link = tmp_path / "plan.jsonl"
    link.symlink_to("/dev/zero")
    limit = "import resource; resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30)); "
    proc = subprocess.run(
        [sys.executable, "-c", limit + _READ_PLAN, str(link)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "TUNEKIT_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert "a character device, not a regular file" in proc.stderr, proc.stderr[-2000:]
    assert "MemoryError" not in proc.stderr
