"""User kernels (tunekit.autotune) on the fleet: `tune --plan pkg.mod:kernel --workers N` queues their
problems as jobs; the workers import the user's module (the plan names it), tune each job once and share one store.
The workers here run in the interpreter, with a SQLite queue."""

from __future__ import annotations

import json
import os
from collections import Counter

from helpers import TESTS, cli

from tunekit.cli.fleet import default_queue_url
from tunekit.fleet.queue import JobQueue
from tunekit.store.store import Store

KERNEL = "fleet_user_kernels:tuned_add"
_MODULE = """
import pathlib, os
import triton, triton.language as tl
import tunekit
from user_kernel_example import FakeBench, add_inputs, add_kernel, CONFIGS

pathlib.Path(os.environ["FLEET_MARKER"], str(os.getpid())).write_text("imported")
tuned_add = tunekit.autotune(configs=CONFIGS, key=["n"], do_bench=FakeBench(), name={name!r}, inputs=add_inputs)(
    add_kernel
)
"""
SIZES = (40, 72, 100, 130)


def test_tune_plan_with_workers_tunes_each_user_kernel_job_once_into_one_store(tmp_path, monkeypatch):
    (tmp_path / "fleet_user_kernels.py").write_text(_MODULE.format(name=KERNEL))
    markers = tmp_path / "imported"
    markers.mkdir()
    monkeypatch.setenv("FLEET_MARKER", str(markers))
    # the workers find the user's module as a plan names it
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), str(TESTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.chdir(tmp_path)
    plan = tmp_path / "plan.jsonl"
    dtypes = {f"dtype.{a}": "float32" for a in ("x_ptr", "y_ptr", "out_ptr")}
    lines = [{"kernel": KERNEL, "problem": {"n": n, **dtypes}} for n in SIZES]
    plan.write_text("".join(json.dumps(line) + "\n" for line in lines))

    listed = cli("plan", str(plan))
    assert listed.exit_code == 0 and f"{len(SIZES)} problems" in listed.output, listed.output
    assert not any(markers.iterdir())  # `plan` never imports the user's module

    result = cli("tune", "--plan", str(plan), "--workers", "2")
    assert result.exit_code == 0, result.output
    assert f"{len(SIZES)} jobs queued" in result.output and f"{len(SIZES)} jobs on 2 workers" in result.output
    assert len(list(markers.iterdir())) >= 1  # a worker process imported it (this process did not)

    statuses = JobQueue(default_queue_url()).jobs()
    assert Counter(s.state for s in statuses) == Counter({"done": len(SIZES)})
    assert all(s.attempts == 1 for s in statuses)  # each job claimed once
    with Store() as store:
        entries = [e for e in store.entries() if e.key.kernel == KERNEL]
    assert sorted(dict(e.key.problem)["n"] for e in entries) == sorted(SIZES)  # one store: every job's entry
    assert all(len(e.trials) == 3 for e in entries)  # every config measured once per job, no job run twice

    again = cli("tune", "--plan", str(plan), "--workers", "1")
    assert again.exit_code == 0 and f"0 jobs queued, {len(SIZES)} already" in again.output, again.output
