"""Issue 7 on the H200: isolated tuning survives real GPU faults.

Tunes the planted-fault kernel (tests/gpu/faulty_kernel.py) exhaustively with isolation on: a compile error, a
shared-memory overflow, an infinite loop (killed by the per-candidate timeout) and an illegal memory access (a
corrupted CUDA context: the worker is replaced). Checks that each fault is one failed record, that the run goes on
and ends with a valid best config, that the parent process's CUDA context is still healthy, and that a rerun
from the stored trials benchmarks nothing again. Prints a table last; exit status 0 when every check holds.

Run (repo root, on the GPU machine):  python tests/gpu/fault_run.py
In the interpreter (no GPU) it runs too, without the hang and illegal-access cases: TRITON_INTERPRET=1.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # the worker gets the parent's sys.path, so it finds faulty_kernel too
os.environ.setdefault("TUNEKIT_CACHE_DIR", tempfile.mkdtemp(prefix="tunekit-issue7-"))

import torch  # noqa: E402

from tunekit.core import backend, registry  # noqa: E402

registry.KERNELS["faulty"] = "faulty_kernel"

from tunekit.core.device import fingerprint  # noqa: E402
from tunekit.store.key import CacheKey  # noqa: E402
from tunekit.store.store import Store  # noqa: E402
from tunekit.tuning.tune_types import TuneOptions  # noqa: E402
from tunekit.tuning.tuner import tune  # noqa: E402

CANDIDATE_TIMEOUT_S = float(os.environ.get("CANDIDATE_TIMEOUT_S", "20"))


def main() -> int:
    spec = registry.get_spec("faulty")
    device = fingerprint()
    (problem,) = spec.default_problems(device)
    print(
        f"device: {device.label} (interpreter={backend.INTERPRETED}); problem {problem}; "
        f"candidate timeout {CANDIDATE_TIMEOUT_S:g} s; cache {os.environ['TUNEKIT_CACHE_DIR']}",
        flush=True,
    )
    options = TuneOptions(
        trials=100, sampler="exhaustive", isolate=True, candidate_timeout_s=CANDIDATE_TIMEOUT_S, remeasure_top=3
    )
    start = time.monotonic()

    def progress(record, n):
        detail = f"{record.time_ms:.4f} ms" if record.status == "ok" else (record.error or "")[:110]
        print(
            f"  [{time.monotonic() - start:6.1f} s] #{n:2d} {dict(record.config)} -> {record.status}: {detail}",
            flush=True,
        )

    with Store() as store:
        report = tune(spec, problem, device, options, on_trial=progress, checkpoint=store.put)
        stored = store.put(report.entry)
        elapsed = time.monotonic() - start
        # a rerun of the same command: everything is answered from the stored trials
        again = tune(
            spec,
            problem,
            device,
            options,
            previous=store.get(CacheKey.make(spec.name, spec.source_hash, device.key, problem)),
        )

    checks: list[tuple[str, bool]] = []
    by_mode: dict[str, list] = {}
    for t in stored.trials:
        by_mode.setdefault(str(t.config["mode"]), []).append(t)
    # mode -> (status, any of these in the error, what the check says)
    expected = {
        "compile_error": ("failed", ("Compil", "planted compile error"), "a compile error"),
        "smem": ("ok", ("",), "no shared-memory limit in the interpreter")
        if backend.INTERPRETED
        else ("failed", ("OutOfResources", "shared memory"), "out of shared memory"),
        "hang": ("failed", ("timeout",), "killed at the candidate timeout"),
        "illegal": ("failed", ("illegal memory access", "worker died"), "an illegal memory access"),
    }
    for mode, (status, texts, what) in expected.items():
        if backend.INTERPRETED and mode in ("hang", "illegal"):
            continue
        records = by_mode.get(mode, [])
        hit = (
            len(records) == 1
            and records[0].status == status
            and any(text in (records[0].error or "") for text in texts)
        )
        checks.append((f"{mode}: recorded {status}: {what}", hit))
    ok_records = by_mode.get("ok", [])
    checks.append(("every ok-mode config measured ok", bool(ok_records) and all(t.status == "ok" for t in ok_records)))
    checks.append(("the best config is a valid (ok-mode) config", stored.config["mode"] == "ok"))
    checks.append(("the run measured the whole space", report.stop_reason == "space exhausted"))
    want_restarts = 0 if backend.INTERPRETED else 2  # the hang (killed) and the illegal access (context gone)
    checks.append(
        (f"workers replaced: {report.restarts} (expected >= {want_restarts})", report.restarts >= want_restarts)
    )
    if not backend.INTERPRETED:
        parent_ok = float((torch.ones(1024, device="cuda") * 2).sum().item()) == 2048.0
        checks.append(("the tuner's own CUDA context is healthy", parent_ok))
    checks.append((f"rerun benchmarked {again.benchmarked} new configs (expected 0)", again.benchmarked == 0))
    checks.append((f"finished in {elapsed:.0f} s (< 180 s)", elapsed < 180))

    print()
    print(f"{'mode':<14} {'BLOCK':>5} {'warps':>5} {'status':<7} time (ms) / error")
    for t in sorted(
        stored.trials,
        key=lambda t: (MODES_ORDER.index(str(t.config["mode"])), t.config["BLOCK"], t.config["num_warps"]),
    ):
        detail = f"{t.time_ms:.4f}" if t.status == "ok" else (t.error or "")[:100]
        print(f"{t.config['mode']:<14} {t.config['BLOCK']:>5} {t.config['num_warps']:>5} {t.status:<7} {detail}")
    print(
        f"best: {dict(stored.config)} at {stored.time_ms:.4f} ms; worker restarts {report.restarts}; "
        f"{report.benchmarked} measured in {elapsed:.1f} s"
    )
    print()
    for name, passed in checks:
        print(f"{'PASS' if passed else 'FAIL'}  {name}")
    failed = [name for name, passed in checks if not passed]
    print("ALL CHECKS PASSED" if not failed else f"{len(failed)} CHECK(S) FAILED")
    return 1 if failed else 0


MODES_ORDER = ["ok", "compile_error", "smem", "hang", "illegal"]

if __name__ == "__main__":
    sys.exit(main())
