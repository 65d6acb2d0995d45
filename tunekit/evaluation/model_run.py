"""One run of the model benchmark as `tunekit model-bench` runs it: every workload measured, optionally the
workflow (record, tune, rerun) per workload, and the outputs: the JSON, the table as text, the PNG."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tunekit.core.errors import TunekitError
from tunekit.evaluation.model_plot import plot_speeds
from tunekit.evaluation.model_results import DTYPE_NAME, Result, Workload, rerun_variants, table, versions, write_json
from tunekit.evaluation.model_workflow import WorkflowReport

Measure = Callable[[Workload, tuple[str, ...], int], list[Result]]
Workflow = Callable[[Workload, tuple[str, ...], int, WorkflowReport], list[Result]]
JSON_NAME, TABLE_NAME, PNG_NAME = "model_bench.json", "model_bench.txt", "model_bench.png"


@dataclass(frozen=True)
class WorkflowOptions:
    trials: int = 20  # per recorded problem
    cache_dir: Path | None = None  # None: a fresh temporary directory per model, deleted after the run


@dataclass
class ModelBenchRun:
    workloads: list[Workload]
    variants: tuple[str, ...]
    reps: int
    device: str
    results: list[Result] = field(default_factory=list)
    workflows: list[WorkflowReport] = field(default_factory=list)

    def context(self) -> dict[str, Any]:
        """Everything of the JSON document but the rows: what was run, where, with which versions."""
        return {
            "device": self.device,
            "dtype": DTYPE_NAME,
            "reps": self.reps,
            "variants": list(self.variants),
            "workloads": [asdict(w) for w in self.workloads],
            "versions": versions(),
            "workflow": [asdict(r) for r in self.workflows] if self.workflows else None,
        }

    def text(self) -> str:
        """The table, then one line per workflow."""
        return "\n".join([table(self.results), *(r.summary() for r in self.workflows)])

    def title(self) -> str:
        v = versions()
        return f"{self.device}, torch {v['torch']}, triton {v['triton']}, {DTYPE_NAME}: median of {self.reps} reps"


def run_bench(
    run: ModelBenchRun,
    workflow: WorkflowOptions | None,
    plan_dir: Path | None,
    measure: Measure,
    workflow_step: Workflow,
    say: Callable[[str], None] = lambda line: None,
) -> ModelBenchRun:
    """Measure each of `run.workloads` (and, with `workflow`, its workflow) into `run`. Plans are written to
    `plan_dir` (default: the temporary directory, with the working caches unless `workflow.cache_dir` is set)."""
    rerun = rerun_variants(run.variants) if workflow is not None else ()
    with tempfile.TemporaryDirectory(prefix="tunekit-model-bench-") as tmp:
        for w in run.workloads:
            say(f"measuring {w.model}: {', '.join(run.variants)}")
            run.results += measure(w, run.variants, run.reps)
            if workflow is None:
                continue
            cache = workflow.cache_dir or Path(tmp) / f"cache-{w.model}"  # fresh per model: no warm start between
            plan = (plan_dir or Path(tmp)) / f"model_bench_plan_{w.model}.jsonl"
            report = WorkflowReport(w.model, workflow.trials, str(cache), workflow.cache_dir is not None, str(plan))
            say(f"workflow {w.model}: record, tune ({workflow.trials} trials per problem), rerun {', '.join(rerun)}")
            run.results += workflow_step(w, rerun, run.reps, report)
            run.workflows.append(report)
            say(report.summary())
    return run


def write_outputs(run: ModelBenchRun, out: Path) -> list[str]:
    """Write the JSON, the text table and the PNG into `out`; returns one line per file (or why the PNG is not)."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(run.results, out / JSON_NAME, run.context())
    (out / TABLE_NAME).write_text(run.text() + "\n")
    lines = [f"json: {out / JSON_NAME}", f"table: {out / TABLE_NAME}"]
    try:
        lines.append(f"png: {plot_speeds(run.results, out / PNG_NAME, run.title())}")
    except TunekitError as exc:  # no matplotlib, or nothing measured against eager: the numbers are written
        lines.append(f"png skipped: {exc}")
    return lines
