"""Timing-table files are opened as regular files only, and decompressed under a cap (a FIFO at a table's
path hung `tunekit efficiency`; a 2.5 MB gzip expanding to 2.7 GB ended in MemoryError)."""

from __future__ import annotations

import gzip
import os
import threading

import pytest

from tunekit.core.errors import TunekitError
from tunekit.evaluation import timing_table
from tunekit.evaluation.timing_table import load_tables


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "gemm.json.gz"
    os.mkfifo(fifo)
    outcome: list[object] = []
    worker = threading.Thread(target=lambda: outcome.append(_load(fifo)), daemon=True)
    worker.start()
    worker.join(5)
    if worker.is_alive():  # unblock the reader so the test process can end
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("loading a FIFO blocked")
    assert isinstance(outcome[0], TunekitError) and "regular file" in str(outcome[0])


def test_a_directory_is_refused(tmp_path):
    (tmp_path / "dir.json.gz").mkdir()
    with pytest.raises(TunekitError, match="regular file"):
        load_tables(tmp_path / "dir.json.gz")


def test_a_decompression_bomb_is_refused_under_the_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(timing_table, "MAX_DECOMPRESSED_BYTES", 1 << 20)
    bomb = tmp_path / "bomb.json.gz"
    with gzip.GzipFile(bomb, "wb") as f:
        chunk = b" " * (1 << 20)
        for _ in range(8):  # 8 MiB of spaces: a few KB compressed
            f.write(chunk)
    assert bomb.stat().st_size < 100_000
    with pytest.raises(TunekitError, match="larger than"):
        load_tables(bomb)


def test_the_shipped_tables_load_under_the_cap():
    from tunekit.evaluation.timing_table import load_all

    assert load_all()


def _load(path):
    try:
        return load_tables(path)
    except TunekitError as exc:
        return exc
