"""Issue 29's denial-of-service cases at the adversary's scale, timed (a script, not a test: it takes a minute).

    TUNEKIT_CACHE_DIR=$(mktemp -d) .venv/bin/python tests/adversarial/issue29_scale.py [ENTRIES]

1. A valid import of ENTRIES (default 20,000) layernorm entries for another device (an H200): `tunekit import`,
   then `tunekit show --json` (was 4 min 43 s, quadratic), then the dispatch resolution of new op keys on this
   device (was 1.2-1.8 s each, the nearest-entry scan).
2. 100 crafted rows of this kernel and device just under the 16 MiB payload cap (their trials hold the bulk):
   one op call's time and peak memory (was 3.3 GB and 8 s).
Prints one line per measurement.
"""

from __future__ import annotations

import json
import os
import resource
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from fingerprints import H200
from typer.testing import CliRunner

import tunekit.ops as ops
from tunekit.cli import app
from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.runtime.dispatch import resolve
from tunekit.store.document_reader import FORMAT
from tunekit.store.entry import Entry, TrialRecord
from tunekit.store.key import SCHEMA_VERSION, CacheKey
from tunekit.store.store import DB_NAME, MAX_PAYLOAD_CHARS, Store


def _entry(spec, device, rows: int, cols: int, time_ms: float, trials: int = 1) -> Entry:
    problem = {"rows": rows, "cols": cols, "dtype": "float16", "weight": True, "bias": True}
    config = spec.heuristic(problem, device)
    key = CacheKey.make(spec.name, spec.source_hash, device.key, problem)
    return Entry(key, config, time_ms, device.to_json(), {"strategy": "tpe", "timer": "cuda-events-median-l2-flushed"},
                 tuple(TrialRecord(config, "ok", time_ms) for _ in range(trials)))  # fmt: skip


def main(count: int) -> None:
    assert os.environ.get("TUNEKIT_CACHE_DIR"), "set TUNEKIT_CACHE_DIR to an empty directory"
    spec, here = get_spec("layernorm"), fingerprint()
    entries = [_entry(spec, H200, 1 + i // 64, 64 * (1 + i % 64), 0.5).to_json() for i in range(count)]
    doc = Path(tempfile.mkdtemp()) / "import.json"
    doc.write_text(json.dumps({"format": FORMAT, "schema": SCHEMA_VERSION, "entries": entries}))
    print(f"document: {count} entries, {doc.stat().st_size / 1e6:.1f} MB")
    runner = CliRunner()
    t = time.perf_counter()
    result = runner.invoke(app, ["import", str(doc)])
    print(f"import: exit {result.exit_code}, {time.perf_counter() - t:.1f} s: {result.output.strip()[:100]}")
    t = time.perf_counter()
    result = runner.invoke(app, ["show", "--json"])
    shown = len(json.loads(result.output)["entries"]) if result.exit_code == 0 else None
    print(f"show --json: exit {result.exit_code}, {shown} entries, {time.perf_counter() - t:.1f} s")
    store = Store()
    times = []
    for rows in (3, 5, 7, 9, 11):
        t = time.perf_counter()
        resolve(spec, {"rows": rows, "cols": 96, "dtype": "float32", "weight": True, "bias": True}, here, store)
        times.append(time.perf_counter() - t)
    print(f"new op keys: first {times[0] * 1e3:.1f} ms, then {max(times[1:]) * 1e3:.1f} ms at most")

    # 2. crafted rows under the payload cap, of this kernel and device
    one = _entry(spec, here, 4, 64, 1.0).to_json()
    trial = json.dumps(one["trials"][0])
    per_row = (MAX_PAYLOAD_CHARS - 10_000) // (len(trial) + 2)
    rows = []
    for i in range(100):
        data = _entry(spec, here, 1000 + i, 64, 1.0).to_json()
        text = json.dumps(data)
        text = text.replace('"trials": [', '"trials": [' + ", ".join([trial] * per_row) + ", ", 1)
        rows.append((CacheKey.from_json(data["key"]).digest, 0.0, text))
    with sqlite3.connect(Path(os.environ["TUNEKIT_CACHE_DIR"]) / DB_NAME) as conn:
        conn.executemany("INSERT OR REPLACE INTO entries VALUES (?, ?, ?)", rows)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    x = torch.randn(4, 96)
    y = ops.layer_norm(x, (96,))
    elapsed = time.perf_counter() - t
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    ok = torch.allclose(y, torch.nn.functional.layer_norm(x, (96,)), atol=1e-5)
    print(f"op call over 100 crafted ~16 MiB rows: {elapsed:.2f} s, peak memory +{grown:.0f} MiB, correct={ok}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20_000)
