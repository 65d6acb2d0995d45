"""What the shipped databases serve, what each heuristic picks and what the model predicts stay as recorded.

A guard for refactors of kernels/, search_spaces/ and the quantization model: moving code must not
change behaviour. The golden file holds, for every shipped entry,
- the layer and config that serve its key on its own device (dispatch's `resolve`, no user cache);
- the kernel's heuristic config for that problem on that device and in the interpreter;
- the quantization model's view of the served config on the H200's limits: tiles, waves, predicted time, and a
  digest of the problem's quantization signature;
and, for every kernel, its heuristic on its default problems (GPU and interpreter) and the model's seeds,
pruning and ranking of the valid configs of its GPU default problems.

Re-record only for a deliberate behaviour change:
`PYTHONPATH=tests python tests/runtime/test_resolution_golden.py --record`.
"""

from __future__ import annotations

import hashlib
import json
import sys

from fingerprints import H200, H200_LIMITS, INTERPRETER
from helpers import ROOT, TESTS

import tunekit.ops  # noqa: F401  (the ops register the kernels whose problems torch may serve: as in use, in any order)
from tunekit.core.device import DeviceFingerprint
from tunekit.core.registry import get_spec, kernel_names
from tunekit.runtime.dispatch import resolve
from tunekit.store.database import read_document
from tunekit.tuning import perf_model

GOLDEN = TESTS / "golden" / "resolutions.json"
SHIPPED = sorted((ROOT / "cache").glob("*.json"))


def _digest(value: object) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def _modelled(kernel: str, config: dict, problem: dict) -> list[object] | None:
    q = perf_model.quantize(kernel, config, problem, H200_LIMITS)
    return None if q is None else [q.tiles, q.waves, q.programs_per_sm, repr(q.predicted_clk), q.tile_shape]


def _entry_row(entry) -> dict[str, object]:
    kernel, problem = entry.key.kernel, dict(entry.key.problem)
    spec = get_spec(kernel)
    device = DeviceFingerprint.from_json(entry.device)
    served = resolve(spec, problem, device, None)
    signature = perf_model.signature(kernel, problem, spec.space, H200_LIMITS)
    return {
        "kernel": kernel,
        "problem": problem,
        "layer": served.layer,
        "config": dict(served.config),
        "heuristic": spec.heuristic(problem, device),
        "heuristic_interpreter": spec.heuristic(problem, INTERPRETER),
        # the model's view of the entry's config (where torch serves the problem, of the config it would replace)
        "model": _modelled(kernel, dict(served.entry.config if served.entry is not None else served.config), problem),
        "signature": None if signature is None else _digest(signature),
    }


def _ranking(kernel: str, problem: dict) -> list[object]:
    """The model's seeds, pruning and full ranking of the valid configs of a problem on the H200."""
    valid = get_spec(kernel).space.valid_configs(problem, H200)
    ranked = perf_model.rank(kernel, valid, problem, H200_LIMITS) or []
    pruning = perf_model.prune(kernel, valid, problem, H200_LIMITS)
    return [
        perf_model.seed_configs(kernel, valid, problem, H200_LIMITS, 8),
        None if pruning is None else [len(pruning.kept), _digest(pruning.pruned)],
        _digest([(sorted(q.config.items()), repr(q.predicted_clk)) for q in ranked]),
    ]


def _default_rows() -> dict[str, object]:
    rows: dict[str, object] = {}
    for name in kernel_names():
        spec = get_spec(name)
        for label, device in (("h200", H200), ("interpreter", INTERPRETER)):
            rows[f"{name}/{label}"] = [[dict(p), spec.heuristic(p, device)] for p in spec.default_problems(device)]
        rows[f"{name}/model"] = [_ranking(name, dict(p)) for p in spec.default_problems(H200)]
    return rows


def _snapshot() -> dict[str, object]:
    entries = [e for path in SHIPPED for e in read_document(path)]
    rows = sorted((_entry_row(e) for e in entries), key=lambda r: json.dumps(r, sort_keys=True))
    return {"shipped": rows, "defaults": _default_rows()}


def test_shipped_resolutions_heuristics_and_model_are_as_recorded():
    golden = json.loads(GOLDEN.read_text())
    now = json.loads(json.dumps(_snapshot()))
    assert len(now["shipped"]) == len(golden["shipped"])
    changed = [(g, n) for g, n in zip(golden["shipped"], now["shipped"]) if g != n]
    assert not changed, f"{len(changed)} shipped keys resolve or model differently; first: {changed[0]}"
    assert now["defaults"] == golden["defaults"]


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    GOLDEN.parent.mkdir(exist_ok=True)
    snapshot = _snapshot()
    lines = [json.dumps(row, sort_keys=True) for row in snapshot["shipped"]]
    defaults = json.dumps(snapshot["defaults"], sort_keys=True, indent=1)
    GOLDEN.write_text('{"shipped": [\n' + ",\n".join(lines) + '\n],\n"defaults": ' + defaults + "}\n")
    print(f"recorded {GOLDEN}: {len(lines)} shipped entries")
