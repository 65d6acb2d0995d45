"""The model benchmark's workflow measurement: what a user does to make tunekit fast on their model, timed.

    record the problems of the patched model's runs (tunekit.record_problems) -> a plan file
    tune the plan (what `tunekit tune --plan` does) into a working cache
    on a GPU: time each run before and after in alternation, and demote what slowed one (tunekit.tune_model,
    which does the recording and tuning there)
    rerun the tunekit variants served by that cache

The tuning runs in this process, through the functions `tunekit tune --plan` calls (`read_plan`, then
`tune_and_store` per problem with the CLI's defaults but the trial budget), not as a subprocess of the CLI: the
counts of tuned, skipped and failed problems come from the tuner's reports rather than from parsing its output,
and the workflow runs in the interpreter for the tests. What this leaves out of the tune time is one CLI start
(importing torch and Triton, seconds).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tunekit.evaluation.model_bench import DTYPE, build, forward, inputs, loss, measure, run_once
from tunekit.evaluation.model_results import TUNED_SUFFIX, Result, Workload
from tunekit.evaluation.plan_tuning import TuneCounts
from tunekit.runtime.dispatch import reset_all
from tunekit.runtime.recorder import record_problems


@dataclass
class WorkflowReport:
    model: str
    trials: int  # the trial budget per problem
    cache_dir: str  # the working cache the plan was tuned into and the rerun was served from
    cache_kept: bool  # False: a temporary directory, deleted after the run
    plan: str  # the plan file
    problems: int = 0  # distinct (kernel, problem) pairs recorded
    tuned: int = 0
    skipped: int = 0
    failed: list[str] = field(default_factory=list)
    demoted: list[str] = field(default_factory=list)  # entries that slowed a step, served torch from then on
    record_s: float = 0.0  # wall time of the recorded runs (on the GPU, tune_model records: counted in tune_s)
    tune_s: float = 0.0
    rerun_s: float = 0.0  # the rerun's measurement (eager again, as its reference, then the tunekit variants)
    total_s: float = 0.0  # record, tune and rerun

    def summary(self) -> str:
        """One line: what was recorded and tuned, how long each step took, where the cache is."""
        failed = f", {len(self.failed)} failed" if self.failed else ""
        failed += f", {len(self.demoted)} demoted" if self.demoted else ""
        kept = "" if self.cache_kept else " (temporary, deleted)"
        return (
            f"{self.model} workflow: {self.problems} problems recorded, {self.tuned} tuned at {self.trials} trials "
            f"({self.skipped} already tuned{failed}); record {self.record_s:.1f} s, tune {self.tune_s:.1f} s, "
            f"rerun {self.rerun_s:.1f} s, total {self.total_s:.1f} s; cache {self.cache_dir}{kept}"
        )


def tuned_rows(results: list[Result]) -> list[Result]:
    """The rerun's rows as extra rows of the benchmark: its eager reference dropped (the first run's stands), every
    other variant renamed `<variant> (tuned plan)`."""
    return [dataclasses.replace(r, variant=r.variant + TUNED_SUFFIX) for r in results if r.variant != "eager"]


@contextlib.contextmanager
def serving_from(cache_dir: Path) -> Iterator[None]:
    """Dispatch serves from `cache_dir` (and the shipped databases) inside, with every memo forgotten on the way in
    and out: it opens its store from TUNEKIT_CACHE_DIR on each miss, and a memo would keep serving the configs
    resolved before."""
    before = os.environ.get("TUNEKIT_CACHE_DIR")
    os.environ["TUNEKIT_CACHE_DIR"] = str(cache_dir)
    reset_all()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TUNEKIT_CACHE_DIR", None)
        else:
            os.environ["TUNEKIT_CACHE_DIR"] = before
        reset_all()


def record_plan(model: torch.nn.Module, ids: dict[str, torch.Tensor], plan: Path) -> int:
    """Run the patched `model` once per run (prefill, decode, train) under the recorder; writes the plan and
    returns the number of problems in it (the runs' own problems, not token-bucket edges: the runs are timed)."""
    with record_problems(plan, buckets=False) as recorder:
        run_once(model, model, ids)
    return len(recorder.problems)


def run_workflow(
    report: WorkflowReport,
    record: Callable[[Path], int],
    tune: Callable[[Path, Path, int], TuneCounts],
    rerun: Callable[[], list[Result]],
    clock: Callable[[], float] = time.perf_counter,
) -> list[Result]:
    """Record into `report.plan`, tune it into `report.cache_dir`, rerun served from there; fills `report` (counts
    and wall times) and returns the rerun's rows, renamed (`tuned_rows`)."""
    plan, cache_dir = Path(report.plan), Path(report.cache_dir)
    start = clock()
    report.problems = record(plan)
    recorded = clock()
    counts = tune(plan, cache_dir, report.trials)
    tuned = clock()
    with serving_from(cache_dir):
        rows = rerun()
    done = clock()
    report.tuned, report.skipped, report.failed = counts.tuned, counts.skipped, list(counts.failed)
    report.record_s, report.tune_s, report.rerun_s = recorded - start, tuned - recorded, done - tuned
    report.total_s = done - start
    return tuned_rows(rows)


def model_steps(ids: dict[str, torch.Tensor]) -> dict[str, Callable[[torch.nn.Module], object]]:
    """The benchmark's runs as tune_model's steps: prefill and decode forwards in eval mode, a training forward and
    backward in train mode."""

    def infer(run: str) -> Callable[[torch.nn.Module], object]:
        def step(model: torch.nn.Module) -> object:
            model.eval()
            return forward(model, ids[run])()

        return step

    def train(model: torch.nn.Module) -> None:
        model.train()
        loss(model, ids["train"]).backward()

    return {"prefill": infer("prefill"), "decode": infer("decode"), "train": train}


def gpu_workflow(w: Workload, variants: tuple[str, ...], reps: int, report: WorkflowReport) -> list[Result]:
    """The workflow of one workload on the GPU: `tunekit.tune_model` on its patched model (record, tune, time
    before and after in alternation, demote what slowed a step), then `variants` rerun (`measure`) served by the
    tuned cache."""
    from tunekit.evaluation.tune_model import tune_model

    device = torch.device("cuda")
    held = [build(w, device, DTYPE)]  # given up by tuning: the rerun builds its own copies
    ids = inputs(w, device)

    def tune(plan: Path, cache_dir: Path, trials: int) -> TuneCounts:
        with serving_from(cache_dir):
            tuned = tune_model(held.pop(), model_steps(ids), trials=trials, plan=plan, compare_eager=False)
        torch.cuda.empty_cache()
        report.problems = tuned.problems
        report.demoted = [f"{d.kernel} {d.problem} ({d.step} {d.gain:.1%} faster without it)" for d in tuned.demoted]
        return TuneCounts(tuned.tuned, tuned.problems - tuned.tuned - len(tuned.failed), list(tuned.failed))

    def rerun() -> list[Result]:
        torch._dynamo.reset()  # a compiled graph keeps the configs dispatch served when it was traced
        return measure(w, variants, reps)

    return run_workflow(report, lambda plan: 0, tune, rerun)
