"""What the shipped databases serve and what each heuristic picks stay as recorded.

A guard for refactors of kernels/, search_spaces/ and dispatch: moving code must not change what runs. The golden
file holds, for every shipped entry, the layer and config that serve its key on its own device (dispatch's
`resolve`, no user cache) and the kernel's heuristic config for that problem on that device and in the interpreter
(what serves it untuned, with TUNEKIT_UNTUNED=triton); and, for every kernel, its heuristic on its default problems
(GPU and interpreter). The quantization model's internals (tiles, waves, predicted times, its ranking) are not
frozen here: its tests check what it must do (tests/tuning).

Re-record only for a deliberate behaviour change:
`PYTHONPATH=tests python tests/runtime/test_resolution_golden.py --record`.
"""

from __future__ import annotations

import json
import sys

from fingerprints import H200, INTERPRETER
from helpers import ROOT, TESTS

import tunekit.ops  # noqa: F401  (the ops register the kernels whose problems torch may serve: as in use, in any order)
from tunekit.core.device import DeviceFingerprint
from tunekit.core.registry import get_spec, kernel_names
from tunekit.runtime.dispatch import resolve
from tunekit.store.database import read_document

GOLDEN = TESTS / "golden" / "resolutions.json"
SHIPPED = sorted((ROOT / "cache").glob("*.json"))


def _entry_row(entry) -> dict[str, object]:
    kernel, problem = entry.key.kernel, dict(entry.key.problem)
    spec = get_spec(kernel)
    device = DeviceFingerprint.from_json(entry.device)
    served = resolve(spec, problem, device, None)
    return {
        "kernel": kernel,
        "problem": problem,
        "layer": served.layer,
        "config": dict(served.config),
        "heuristic": spec.heuristic(problem, device),
        "heuristic_interpreter": spec.heuristic(problem, INTERPRETER),
    }


def _default_rows() -> dict[str, object]:
    rows: dict[str, object] = {}
    for name in kernel_names():
        spec = get_spec(name)
        for label, device in (("h200", H200), ("interpreter", INTERPRETER)):
            rows[f"{name}/{label}"] = [[dict(p), spec.heuristic(p, device)] for p in spec.default_problems(device)]
    return rows


def _snapshot() -> dict[str, object]:
    entries = [e for path in SHIPPED for e in read_document(path)]
    rows = sorted((_entry_row(e) for e in entries), key=lambda r: json.dumps(r, sort_keys=True))
    return {"shipped": rows, "defaults": _default_rows()}


def test_shipped_resolutions_and_heuristics_are_as_recorded() -> None:
    golden = json.loads(GOLDEN.read_text())
    now = json.loads(json.dumps(_snapshot()))
    assert len(now["shipped"]) == len(golden["shipped"])
    changed = [(g, n) for g, n in zip(golden["shipped"], now["shipped"]) if g != n]
    assert not changed, f"{len(changed)} shipped keys resolve differently; first: {changed[0]}"
    assert now["defaults"] == golden["defaults"]


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    GOLDEN.parent.mkdir(exist_ok=True)
    snapshot = _snapshot()
    lines = [json.dumps(row, sort_keys=True) for row in snapshot["shipped"]]
    defaults = json.dumps(snapshot["defaults"], sort_keys=True, indent=1)
    GOLDEN.write_text('{"shipped": [\n' + ",\n".join(lines) + '\n],\n"defaults": ' + defaults + "}\n")
    print(f"recorded {GOLDEN}: {len(lines)} shipped entries")
