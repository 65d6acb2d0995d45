"""Time torch's op again, beside each entry's own config, for the entries of this GPU in the shipped databases
(cache/*.json and cache/packs/*.json) that serve a kernel, as the tuner now times both: torch on the inputs its
commonest call passes (GEMM: alpha = beta = 1, `torch_timing_inputs`), the config verified then timed through the
hot path as a user's eager call runs it (tunekit.tuning.verify.as_called_eagerly). A demoted entry is left as it
is (torch serves it anyway), and so is one timed by the current method (its timer GPU_TIMER).

Each database is written back under `--out` at its path relative to cache/, with each retimed entry's best time
and torch time replaced, its timer stamped GPU_TIMER and `retimed` (date, why) in its provenance; copy the files
over cache/ (no GPU needed).

    python tests/gpu/retime_torch.py [--out DIR] [--kernels gemm,rmsnorm] [--limit N]

Prints a table of the entries whose verdict changed last; JSON of every retimed entry under --out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path

from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.store.entry import DEMOTED, GPU_TIMER, TORCH_MS
from tunekit.tuning.spot_check import measure_here

CACHE = Path(__file__).resolve().parents[2] / "cache"
WHY = {
    "gemm": "torch timed as linear calls it (alpha = beta = 1), the config through the hot path",
    "": "the config timed through the hot path, as a user's eager call runs it",
}


def serves_kernel(data: dict) -> bool:
    torch_ms, best = data["provenance"].get(TORCH_MS), data["best"]["time_ms"]
    return DEMOTED not in data["provenance"] and (torch_ms is None or torch_ms > best)


def wanted(key: dict, kernels: set[str], here: str) -> bool:
    if key["device_key"] != here or (kernels and key["kernel"] not in kernels):
        return False
    try:
        spec = get_spec(key["kernel"])
    except Exception:  # a user kernel's entry: not ours to time
        return False
    return spec.torch_fallback and key["source_hash"] == spec.source_hash


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")))
    parser.add_argument("--kernels", default="", help="comma-separated (default: every kernel with a torch op)")
    parser.add_argument("--limit", type=int, default=0, help="retime at most N entries (0: all)")
    opts = parser.parse_args()
    here, kernels = fingerprint().key, set(filter(None, opts.kernels.split(",")))
    today = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    timed: dict[str, tuple[float, float | None]] = {}  # problem and config -> (config ms, torch ms): packs share them
    rows = []
    for path in [*sorted(CACHE.glob("*.json")), *sorted((CACHE / "packs").glob("*.json"))]:
        doc = json.loads(path.read_text())
        for data in doc["entries"]:
            key = data["key"]
            if (
                not wanted(key, kernels, here)
                or not serves_kernel(data)
                or data["provenance"].get("timer") == GPU_TIMER
            ):
                continue
            if opts.limit and len(timed) >= opts.limit:
                continue
            spec = get_spec(key["kernel"])
            problem, config = key["problem"], data["best"]["config"]
            ident = json.dumps([spec.name, problem, config], sort_keys=True)
            if ident not in timed:
                record, torch_ms = measure_here(spec, problem, config)
                if record.status != "ok" or record.time_ms is None:
                    print(f"skipped {problem}: {record.status} {record.error}", flush=True)
                    continue
                timed[ident] = (record.time_ms, torch_ms)
            ms, torch_ms = timed[ident]
            before = (data["best"]["time_ms"], data["provenance"].get(TORCH_MS))
            data["best"]["time_ms"] = ms
            if torch_ms is not None:
                data["provenance"][TORCH_MS] = round(torch_ms, 6)
            data["provenance"]["retimed"] = f"{today}: {WHY.get(spec.name, WHY[''])}"
            data["provenance"]["timer"] = GPU_TIMER
            rows.append({
                "file": str(path.relative_to(CACHE)), "kernel": spec.name, "problem": problem,
                "before": before, "after": (ms, torch_ms),
                "kernel_before": True, "kernel_after": serves_kernel(data),
            })  # fmt: skip
        target = opts.out / path.relative_to(CACHE)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    (opts.out / "retime_torch.json").write_text(json.dumps(rows, indent=1))
    flipped = [r for r in rows if not r["kernel_after"]]
    print(f"\nretimed {len(rows)} entries ({len(timed)} distinct); now torch's: {len(flipped)}")
    print("file | kernel problem | before: config, torch ms | after: config, torch ms | served now")
    for r in rows:
        problem = ",".join(str(v) for _, v in sorted(r["problem"].items()))
        after_torch = r["after"][1] if r["after"][1] is None else round(r["after"][1], 4)
        print(
            f"{r['file']:32} {r['kernel']} {problem} | {r['before'][0]:.4f} {r['before'][1]} | {r['after'][0]:.4f} "
            f"{after_torch} | {'kernel' if r['kernel_after'] else 'torch'}"
        )


if __name__ == "__main__":
    main()
