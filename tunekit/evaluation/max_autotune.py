"""torch.compile's max-autotune as a benchmark baseline: the parent's side (a child process per shape, stopped at the
time limit) and the child's (one request on stdin, one result line on stdout)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunekit.evaluation.suite import Family

from tunekit.evaluation.checked_timing import MAX_NOTE, check_then_time
from tunekit.evaluation.names import MAX_AUTOTUNE
from tunekit.evaluation.results import BenchOptions, Measurement

_RESULT_PREFIX = "tunekit-bench-result: "


def max_autotune_measurement(
    family: Family, problem: dict[str, Any], method: str, options: BenchOptions, interpreted: bool
) -> Measurement:
    """torch.compile max-autotune in a child process: its autotuning can run for many minutes on one shape, and only
    a process can be stopped at the time limit (its GPU work with it). It rebuilds the same inputs from the seed."""
    if interpreted and options.compile_backend == "inductor":
        return Measurement(MAX_AUTOTUNE, "skipped", note="max-autotune benchmarks Triton templates on a GPU")
    request = {
        "family": family.name,
        "kernel": family.kernel,
        "problem": problem,
        "method": method,
        "backend": options.compile_backend,
    }
    child = "from tunekit.evaluation.max_autotune import max_autotune_child; max_autotune_child()"
    command = [sys.executable, "-c", child]
    limit = options.compile_timeout_s
    proc = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: inductor's compile workers die with it
    )
    try:
        out, err = proc.communicate(json.dumps(request), timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return Measurement(MAX_AUTOTUNE, "timeout", note=f"compile + check + timing did not finish in {limit:g} s")
    for line in reversed(out.splitlines()):
        if line.startswith(_RESULT_PREFIX):
            return Measurement.from_json(json.loads(line[len(_RESULT_PREFIX) :]))
    tail = err.strip().splitlines()[-1] if err.strip() else f"exit status {proc.returncode}"
    return Measurement(MAX_AUTOTUNE, "failed", note=f"child process: {tail}"[:MAX_NOTE])


def max_autotune_child() -> None:
    """The child's side: one request on stdin, one result line on stdout."""
    from tunekit.core import backend
    from tunekit.core.registry import get_spec
    from tunekit.evaluation.runners import compiled_runner
    from tunekit.evaluation.suite import SEED, families, family_for
    from tunekit.tuning.bench import default_timer

    request = json.loads(sys.stdin.read())
    family = families().get(request["family"]) or family_for(request["kernel"])
    spec = get_spec(family.kernel)
    inputs = family.adapt_inputs(spec.make_inputs(request["problem"], backend.torch_device(), SEED))
    program = family.torch_program
    assert program is not None
    build = lambda: compiled_runner(program(inputs), "max-autotune", request["backend"])  # noqa: E731
    expected = spec.reference(inputs)
    m = check_then_time(MAX_AUTOTUNE, build, spec, expected, request["method"], default_timer(), baseline=True)
    print(_RESULT_PREFIX + json.dumps(asdict(m)), flush=True)
