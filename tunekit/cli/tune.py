"""`tunekit tune`: what to tune, and tuning it here (a job queue's path is tunekit.cli.fleet's)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from tunekit.cli.app import DtypeOpt, JsonOpt, QueueOpt, ShapeOpt, console, err_console, error_line, say
from tunekit.cli.fleet import tune_through_queue
from tunekit.cli.problems import kernel_problems
from tunekit.cli.user_kernels import tune_user_plan
from tunekit.cli.views import INTERPRETER_NOTE, TuneResult, printable, problem_text
from tunekit.core.errors import TunekitError

if TYPE_CHECKING:
    from tunekit.core.space import Problem
    from tunekit.core.spec import KernelSpec
    from tunekit.fleet.plans import PlanLines
    from tunekit.store.store import Store
    from tunekit.tuning.shared_bench import SharedBench
    from tunekit.tuning.tune_types import TuneOptions

# tune's queue and isolation options, named here so that its signature stays a readable list.
SubmitOpt = Annotated[
    bool,
    typer.Option("--submit", help="Only queue the problems as jobs in --storage, for `tunekit worker`s anywhere."),
]
WorkersOpt = Annotated[
    int | None,
    typer.Option(
        "--workers",
        help="Queue the jobs, run them on N local worker processes (one per GPU), wait, print the results. "
        "--storage defaults to sqlite in the cache directory.",
    ),
]
IsolateOpt = Annotated[
    bool | None,
    typer.Option(
        "--isolate/--no-isolate",
        help="Benchmark each candidate in a worker process that a hang or crash cannot take down "
        "(default: on for a GPU, off in the interpreter).",
    ),
]
CandidateTimeoutOpt = Annotated[
    float,
    typer.Option(
        help="With isolation: seconds one candidate may take (compile, check, time) before it is killed "
        "and recorded as failed."
    ),
]

BudgetOpt = Annotated[
    float | None,
    typer.Option(
        help="Seconds for the whole list, counted from the start of tuning: first every problem's first two "
        "configs (largest first), then the time left searched further in proportion to expected work "
        "(tunekit/tuning/plan_budget.py); --trials still caps each, and problems the time cannot reach stay "
        "untuned and are named. Configs are compiled ahead on the host's cores and timed over shorter windows "
        "(10 ms of warm-up and 25 ms of repetitions, not 25 and 100)."
    ),
]
EarlyStopOpt = Annotated[
    float | None,
    typer.Option(
        "--early-stop",
        help="With the model strategy: stop a shape's search once the model says no config left can beat the "
        "fastest by more than this relative timing noise (0.03: 3%; tunekit/tuning/early_stop.py).",
    ),
]


def _read_plan(plan: Path, kernel: str | None, shapes: list[str] | None, dtype: str | None, queued: bool) -> PlanLines:
    """The plan's lines. A queue takes a whole plan or none of it: with --submit/--workers the plan is refused at its
    first bad line, before anything is queued; tuned here, each bad line is named and the others run."""
    from tunekit.fleet.plans import read_plan_lines

    if kernel is not None or shapes or dtype:
        raise TunekitError("give --plan, or --kernel with --shape/--dtype, not both (a plan names its problems)")
    lines = read_plan_lines(plan)
    if queued and lines.refused:
        raise TunekitError(lines.refused[0])
    return lines


def _plan_first(lines: PlanLines, force: bool, queued: bool) -> int:
    """Each refused plan line as one `error:` line (the others still run), then the plan's user kernels tuned
    here (queued: left to the workers); how many of them failed."""
    for refusal in lines.refused:
        error_line(refusal)
    return len(lines.refused) + tune_user_plan(lines.problems, force, queued)


def _work_list(
    kernel: str | None, shapes: list[str] | None, dtype: str | None, plan: PlanLines | None
) -> list[tuple[KernelSpec, Problem]]:
    """What `tune` works on: --kernel's shapes (or its default set), or the plan's problems of tunekit's kernels."""
    from tunekit.core.registry import get_spec
    from tunekit.store.user_entries import is_user_kernel

    if plan is not None:
        return [(get_spec(line.kernel), line.problem) for line in plan.problems if not is_user_kernel(line.kernel)]
    if kernel is None:
        raise TunekitError("tune needs --kernel (with --shape/--dtype) or --plan FILE")
    spec = get_spec(kernel)
    return [(spec, p) for p in kernel_problems(kernel, shapes, dtype)]


def tune(
    kernel: Annotated[
        str | None, typer.Option("--kernel", "-k", help="Kernel name (see `tunekit show --kernels`).")
    ] = None,
    shape: ShapeOpt = None,
    dtype: DtypeOpt = None,
    trials: Annotated[
        int,
        typer.Option(
            help="Configs measured per shape, counting those already stored for it: a tuned shape is skipped, a "
            "rerun after an interruption measures only what is missing, a larger budget continues."
        ),
    ] = 30,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Tune even a shape whose stored trials reach --trials: up to --trials configs not measured before.",
        ),
    ] = False,
    timeout: Annotated[float | None, typer.Option(help="Seconds per shape (a budget, not a kill).")] = None,
    budget: BudgetOpt = None,
    sampler: Annotated[
        str, typer.Option(help="model (TPE guided by the quantization model), tpe, gp, random or exhaustive.")
    ] = "model",
    early_stop: EarlyStopOpt = None,
    storage: Annotated[
        str | None,
        typer.Option(
            help="Optuna storage URL (e.g. sqlite:///tune.db) of the studies, and with --submit/--workers of the "
            "job queue (a journal file path works there too); in-memory if unset."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the sampler and of the random inputs.")] = 0,
    plan: Annotated[
        Path | None, typer.Option("--plan", help="Tune every problem of a plan file (see `tunekit plan`).")
    ] = None,
    submit: SubmitOpt = False,
    workers: WorkersOpt = None,
    queue: QueueOpt = "default",
    isolate: IsolateOpt = None,
    candidate_timeout: CandidateTimeoutOpt = 120.0,
    json_out: JsonOpt = False,
) -> None:
    """Tune KERNEL for each shape (a default set when none is given), or every problem of a --plan; store the winners.

    One result per shape as it finishes (one plain line each when stdout is not a terminal). With --submit or
    --workers the problems become jobs in a queue in --storage, for workers on any machine.
    """
    from tunekit.tuning.samplers import make_sampler
    from tunekit.tuning.tune_types import TuneOptions

    if trials < 1:  # TuneOptions refuses it too, without the option's name
        raise TunekitError(f"--trials must be >= 1, but got {trials}")
    queued = submit or workers is not None
    lines = _read_plan(plan, kernel, shape, dtype, queued) if plan is not None else None
    work_list = _work_list(kernel, shape, dtype, lines)
    failed = _plan_first(lines, force, queued) if lines is not None else 0
    if lines is not None and not work_list and not (queued and lines.problems):
        raise typer.Exit(1 if failed else 0)
    options = TuneOptions(
        trials=trials,
        timeout_s=timeout,
        sampler=sampler,
        storage=storage,
        seed=seed,
        isolate=isolate,
        candidate_timeout_s=candidate_timeout,
        force=force,
        early_stop=early_stop,
    )
    make_sampler(sampler, seed)  # an unknown name fails before anything runs or is queued
    if submit or workers is not None:
        if force or json_out or budget is not None:
            raise TunekitError("--force, --budget and --json tune here: they do not go with --submit or --workers")
        tune_through_queue(work_list, options, submit, workers, queue, lines.user_items() if lines else [])
        return
    failed += _tune_here(work_list, options, json_out, budget, lines)
    if failed:
        raise typer.Exit(1)


def _tune_here(
    work_list: list[tuple[KernelSpec, Problem]],
    options: TuneOptions,
    json_out: bool,
    budget: float | None = None,
    lines: PlanLines | None = None,
) -> int:
    """Tune here, one problem after another; returns how many failed. Each result is printed as it finishes: a block
    on a terminal (with a progress bar while it runs), one plain line otherwise, or all of them as one JSON document
    at the end. A problem whose tuning fails is one `error:` line naming it (and its plan line); the rest still run."""
    import time

    started = time.monotonic()  # a budget counts from here: optuna's import included
    from tunekit.core.device import fingerprint
    from tunekit.runtime.recorder import plan_line
    from tunekit.tuning.bench import budget_timer, default_timer
    from tunekit.tuning.plan_loop import tune_in_turn
    from tunekit.tuning.shared_bench import SharedBench

    device = fingerprint()
    timer = budget_timer() if budget is not None else default_timer()
    terminal = console.is_terminal and not json_out
    failed: list[str] = []
    if not json_out:
        kernels = ", ".join(dict.fromkeys(spec.name for spec, _ in work_list))
        n = len(work_list)
        what = f"{n} problem{'s' if n != 1 else ''}, {options.trials} trials each"
        say(f"tuning {kernels} on {device.label} ({timer.label}): {what}")
        if device.is_interpreter:
            say(INTERPRETER_NOTE)
    # One isolation worker for the whole list, as a fleet worker has (tune() alone starts one per problem).
    benches = SharedBench(timer, options.isolate, options.candidate_timeout_s)
    where = {plan_line(line.kernel, line.problem): line.where for line in lines.problems} if lines else {}
    visits: list[TuneResult] = []

    def tune_one(spec: KernelSpec, problem: Problem, these: TuneOptions, store: Store) -> None:
        try:
            result = _tune_one(benches, spec, problem, (these, options.trials), store, terminal, json_out)
        except KeyboardInterrupt:
            _interrupted(visits, len(work_list), f"{spec.name} {problem_text(spec, problem)}")
        visits.append(result)
        if not json_out:
            for line in result.block() if terminal else [result.line()]:
                say(line)

    def failure(spec: KernelSpec, problem: Problem, exc: TunekitError) -> None:
        # this problem only: named with its plan line, and the next one runs
        place = where.get(plan_line(spec.name, problem))
        failed.append(f"{place + ': ' if place else ''}{spec.name} {problem_text(spec, problem)}: {exc}")
        error_line(failed[-1])

    run = tune_in_turn(work_list, options, benches, tune_one, failure, budget_s=budget, started=started)
    unreached = [f"{spec.name} {problem_text(spec, problem)}" for spec, problem in run.unreached]
    _summary(visits, failed, unreached, json_out, budget, timer.label, run.cache)
    return len(failed)


def _tune_one(
    benches: SharedBench,
    spec: KernelSpec,
    problem: Problem,
    visit: tuple[TuneOptions, int],
    store: Store,
    terminal: bool,
    quiet: bool,
) -> TuneResult:
    """One problem tuned into `store` (`visit`: this visit's options, and the trials its progress counts to)."""
    from tunekit.core.device import fingerprint
    from tunekit.store.key import CacheKey

    device = fingerprint()
    previous = store.get(CacheKey.make(spec.name, spec.source_hash, device.key, problem))
    stored = len(previous.trials) if previous is not None else 0
    these, trials = visit
    with _progress(spec, problem, trials, stored, terminal, quiet=quiet) as advance:
        entry, report = benches.tune(spec, problem, device, these, store, on_trial=advance)
    heuristic = dict(spec.heuristic(problem, device))
    h_ms = next((t.time_ms for t in entry.trials if t.config == heuristic and t.status == "ok"), None)
    return TuneResult(spec, problem, report, entry, h_ms, device.is_interpreter)


def _interrupted(visits: list[TuneResult], total: int, name: str) -> NoReturn:
    done = sum(not r.skipped for r in {r.entry.key: r for r in visits}.values())
    err_console.print(
        f"interrupted: {done} of {total} problems tuned and stored; "
        f"{name} kept the trials it measured (stored after each). Run the same command again to continue.",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    raise typer.Exit(130) from None


def _summary(
    visits: list[TuneResult],
    failed: list[str],
    unreached: list[str],
    json_out: bool,
    budget: float | None,
    timer: str,
    cache: Path,
) -> None:
    """The run's last lines (or its JSON document): counts, the cache, problems --budget did not reach, phases."""
    import json

    from tunekit.core.device import fingerprint
    from tunekit.tuning.phases import PhaseTimes

    device = fingerprint()
    results = {r.entry.key: r for r in visits}  # each problem's last visit: a budget's second visit replaces
    phases = PhaseTimes.summed(r.report.phases for r in visits)
    if json_out:
        document = {
            "device": {"label": device.label, "key": device.key, "interpreter": device.is_interpreter},
            "timer": timer,
            "note": INTERPRETER_NOTE if device.is_interpreter else None,
            "cache": str(cache),
            "results": [r.to_json() for r in results.values()],
            "failed": failed,  # "problem: why" (with its plan line) for each problem whose tuning failed
            "phases": phases.to_json(),  # seconds by phase over every problem (tunekit.tuning.phases)
            "unreached": unreached,  # problems --budget did not pay for (not tuned: torch serves them)
        }
        print(json.dumps(document, indent=1))
        return
    skipped = sum(r.skipped for r in results.values())
    failures = f", {len(failed)} failed (named above)" if failed else ""
    say(f"{len(results) - skipped} tuned, {skipped} already tuned{failures}; cache: {cache}")
    if unreached:
        say(_unreached_note(budget, unreached))
    say(f"time by phase: {phases.describe()}")


def _unreached_note(budget: float | None, unreached: list[str]) -> str:
    return (
        f"--budget {budget:g} s spent before {len(unreached)} problem(s), the smallest, were reached: not tuned "
        "(torch serves them); a larger budget, or none, tunes them: " + "; ".join(unreached)
    )


PROGRESS_EVERY_TRIALS = 10  # without a terminal: a progress line per this many trials measured...
PROGRESS_EVERY_S = 30.0  # ...or after this many seconds, whichever comes first


@contextlib.contextmanager
def _progress(
    spec: KernelSpec, problem: Problem, trials: int, stored: int, terminal: bool, quiet: bool = False
) -> Iterator[Callable[[object, int], None]]:
    """A progress bar for one problem on a terminal (its stored trials count as done); in a log, a line per
    PROGRESS_EVERY_TRIALS trials or PROGRESS_EVERY_S seconds with the trials done and the best time so far;
    nothing with --json (its stdout is one document)."""
    if quiet:
        yield lambda record, done: None
        return
    if not terminal:
        yield _progress_lines(f"{spec.name} {problem_text(spec, problem)}", trials, stored)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn(printable(f"{spec.name} {problem_text(spec, problem)}"), markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("tune", total=max(trials, stored), completed=min(stored, trials))

        def advance(record: object, done: int) -> None:
            progress.update(task, completed=min(stored + done, max(trials, stored)))

        yield advance


def _progress_lines(what: str, trials: int, stored: int) -> Callable[[object, int], None]:
    """on_trial for a log: `  progress <problem>: 10/30 trials (20 measured now), best 0.0123 ms`."""
    import time

    best: list[float] = []
    last = [time.monotonic(), 0]

    def advance(record: object, done: int) -> None:
        ms = getattr(record, "time_ms", None)
        if getattr(record, "status", None) == "ok" and isinstance(ms, float):
            best[:] = [min([ms, *best])]
        now = time.monotonic()
        if done - last[1] < PROGRESS_EVERY_TRIALS and now - last[0] < PROGRESS_EVERY_S:
            return
        last[:] = [now, done]
        total = max(trials, stored)
        so_far = f"best {best[0]:.4f} ms" if best else "none correct yet"
        say(f"  progress {what}: {min(stored + done, total)}/{total} trials ({done} measured now), {so_far}")

    return advance
