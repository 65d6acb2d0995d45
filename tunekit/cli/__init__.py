"""The `tunekit` command: thin commands over the library, one error boundary, one line per known error."""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tunekit import DISTRIBUTION
from tunekit.cli.views import INTERPRETER_NOTE, TuneResult, config_text, list_entries, printable
from tunekit.core import settings
from tunekit.core.errors import InvalidShapeError, TunekitError
from tunekit.core.render import markup, plain
from tunekit.core.space import Config, Problem
from tunekit.core.spec import KernelSpec

if TYPE_CHECKING:
    from tunekit.tuning.tuner import TuneOptions

app = typer.Typer(
    name="tunekit",
    help="Autotune Triton kernels per problem shape and GPU; keep the winners in a device-keyed cache.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


def _print_version(value: bool) -> None:
    if value:
        from tunekit import __version__

        print(f"tunekit {__version__} (distribution {DISTRIBUTION})")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print tunekit's version and exit."),
    ] = False,
) -> None:
    """Autotune Triton kernels per problem shape and GPU; keep the winners in a device-keyed cache."""


def _one_line_errors(fn: Callable[..., None]) -> Callable[..., None]:
    """The error boundary: a known error is one line on stderr and exit code 1 (TUNEKIT_DEBUG=1: traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except TunekitError as exc:
            if settings.debug():
                raise
            err_console.print(f"error: {plain(exc)}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper


def command(name: str | None = None) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def register(fn: Callable[..., None]) -> Callable[..., None]:
        return app.command(name)(_one_line_errors(fn))

    return register


KernelOpt = Annotated[str, typer.Option("--kernel", "-k", help="Kernel name (see `tunekit show --kernels`).")]
ShapeOpt = Annotated[
    list[str] | None, typer.Option("--shape", "-s", help="Problem shape, e.g. 4096x1024 (repeatable).")
]
DtypeOpt = Annotated[str | None, typer.Option("--dtype", help="float16, bfloat16 or float32.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout instead of text.")]
QueueOpt = Annotated[str, typer.Option("--queue", help="The job queue's name (one storage holds many).")]
FleetStorageOpt = Annotated[
    str,
    typer.Option(
        "--storage",
        help="The shared store: an Optuna RDB URL (postgresql://..., sqlite:///fleet.db) or a journal file path.",
    ),
]


def parse_shape(text: str) -> tuple[int, ...]:
    parts = text.lower().replace("*", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if not dims or any(d < 1 for d in dims):
        raise InvalidShapeError(f"--shape must be positive integers joined by 'x' (e.g. 4096x1024), but got {text!r}")
    return dims


def _problems(kernel: str, shapes: list[str] | None, dtype: str | None) -> list[Problem]:
    from tunekit.core.device import fingerprint
    from tunekit.core.registry import get_spec

    spec = get_spec(kernel)
    if not shapes:
        problems = spec.default_problems(fingerprint())
        return [dict(p, dtype=dtype) if dtype else dict(p) for p in problems]
    default_dtype = dtype or ("float32" if fingerprint().is_interpreter else "float16")
    return [dict(spec.problem_from_shape(parse_shape(s), default_dtype)) for s in shapes]


def _work_list(
    kernel: str | None, shapes: list[str] | None, dtype: str | None, plan: Path | None
) -> list[tuple[KernelSpec, Problem]]:
    """What `tune` works on: --kernel's shapes (or its default set), or every problem of a plan file."""
    from tunekit.core.registry import get_spec
    from tunekit.fleet.plans import read_plan

    if plan is not None:
        if kernel is not None or shapes or dtype:
            raise TunekitError("give --plan, or --kernel with --shape/--dtype, not both (a plan names its problems)")
        return [(get_spec(k), p) for k, p in read_plan(plan)]
    if kernel is None:
        raise TunekitError("tune needs --kernel (with --shape/--dtype) or --plan FILE")
    spec = get_spec(kernel)
    return [(spec, p) for p in _problems(kernel, shapes, dtype)]


def _show_config(spec: KernelSpec, config: Config) -> str:
    return " ".join(f"{name}={config[name]}" for name in spec.space.names)


@command()
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
    sampler: Annotated[
        str, typer.Option(help="model (TPE guided by the quantization model), tpe, gp, random or exhaustive.")
    ] = "model",
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
    submit: Annotated[
        bool,
        typer.Option("--submit", help="Only queue the problems as jobs in --storage, for `tunekit worker`s anywhere."),
    ] = False,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            help="Queue the jobs, run them on N local worker processes (one per GPU), wait, print the results. "
            "--storage defaults to sqlite in the cache directory.",
        ),
    ] = None,
    queue: QueueOpt = "default",
    isolate: Annotated[
        bool | None,
        typer.Option(
            "--isolate/--no-isolate",
            help="Benchmark each candidate in a worker process that a hang or crash cannot take down "
            "(default: on for a GPU, off in the interpreter).",
        ),
    ] = None,
    candidate_timeout: Annotated[
        float,
        typer.Option(
            help="With isolation: seconds one candidate may take (compile, check, time) before it is killed "
            "and recorded as failed."
        ),
    ] = 120.0,
    json_out: JsonOpt = False,
) -> None:
    """Tune KERNEL for each shape (a default set when none is given), or every problem of a --plan; store the winners.

    One result per shape as it finishes (one plain line each when stdout is not a terminal). With --submit or
    --workers the problems become jobs in a queue in --storage, for workers on any machine.
    """
    from tunekit.tuning.samplers import make_sampler
    from tunekit.tuning.tuner import TuneOptions

    work_list = _work_list(kernel, shape, dtype, plan)
    options = TuneOptions(
        trials=trials,
        timeout_s=timeout,
        sampler=sampler,
        storage=storage,
        seed=seed,
        isolate=isolate,
        candidate_timeout_s=candidate_timeout,
        force=force,
    )
    make_sampler(sampler, seed)  # an unknown name fails before anything runs or is queued
    if submit or workers is not None:
        if force or json_out:
            raise TunekitError("--force and --json tune here: they do not go with --submit or --workers")
        _tune_fleet(work_list, options, submit, workers, queue)
        return
    _tune_here(work_list, options, json_out)


def _tune_here(work_list: list[tuple[KernelSpec, Problem]], options: TuneOptions, json_out: bool) -> None:
    """Tune here, one problem after another. Each result is printed as it finishes: a block on a terminal (with a
    progress bar while it runs), one plain line otherwise, or all of them as one JSON document at the end."""
    import json

    from tunekit.core.device import fingerprint
    from tunekit.store.key import CacheKey
    from tunekit.store.store import Store
    from tunekit.tuning.bench import default_timer
    from tunekit.tuning.orchestrate import tune_and_store

    device = fingerprint()
    timer = default_timer()
    terminal = console.is_terminal and not json_out
    results: list[TuneResult] = []
    if not json_out:
        kernels = ", ".join(dict.fromkeys(spec.name for spec, _ in work_list))
        n = len(work_list)
        what = f"{n} problem{'s' if n != 1 else ''}, {options.trials} trials each"
        _say(f"tuning {kernels} on {device.label} ({timer.label}): {what}")
        if device.is_interpreter:
            console.print(INTERPRETER_NOTE, markup=False, highlight=False)  # wrapped between words
    with Store() as store:
        for spec, problem in work_list:
            previous = store.get(CacheKey.make(spec.name, spec.source_hash, device.key, problem))
            stored = len(previous.trials) if previous is not None else 0
            with _progress(spec, problem, options.trials, stored, terminal) as advance:
                entry, report = tune_and_store(spec, problem, device, options, store, timer=timer, on_trial=advance)
            heuristic = dict(spec.heuristic(problem, device))
            h_ms = next((t.time_ms for t in entry.trials if t.config == heuristic and t.status == "ok"), None)
            result = TuneResult(spec, problem, report, entry, h_ms, device.is_interpreter)
            results.append(result)
            if json_out:
                continue
            for line in result.block() if terminal else [result.line()]:
                _say(line)
    if json_out:
        document = {
            "device": {"label": device.label, "key": device.key, "interpreter": device.is_interpreter},
            "timer": timer.label,
            "note": INTERPRETER_NOTE if device.is_interpreter else None,
            "cache": str(store.directory),
            "results": [r.to_json() for r in results],
        }
        print(json.dumps(document, indent=1))
        return
    skipped = sum(r.skipped for r in results)
    _say(f"{len(results) - skipped} tuned, {skipped} already tuned; cache: {store.directory}")


def _say(text: str) -> None:
    """One line of output, never cut: rich markup off (stored text is printed as it is) and no hard wrapping."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


@contextlib.contextmanager
def _progress(
    spec: KernelSpec, problem: Problem, trials: int, stored: int, terminal: bool
) -> Iterator[Callable[[object, int], None]]:
    """A progress bar for one problem on a terminal (its stored trials count as done); nothing otherwise."""
    if not terminal:
        yield lambda record, done: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tunekit.cli.views import problem_text

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


def _tune_fleet(
    work_list: list[tuple[KernelSpec, Problem]], options: TuneOptions, submit: bool, workers: int | None, queue: str
) -> None:
    from tunekit.fleet.queue import Job, JobQueue
    from tunekit.fleet.workers import interleave_kernels, run_workers

    if submit and workers is not None:
        raise TunekitError("--submit only queues the jobs and --workers also runs them here: give one of them")
    if workers is not None and workers < 1:
        raise TunekitError(f"--workers must be >= 1, but got {workers}")
    url = options.storage
    if url is None:
        if submit:
            raise TunekitError("--submit needs --storage URL: the shared store the workers read")
        settings.cache_dir().mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{settings.cache_dir() / 'fleet.db'}"
    jobs = interleave_kernels(
        Job(spec.name, dict(problem), options.trials, options.sampler, options.seed, options.timeout_s)
        for spec, problem in work_list
    )
    q = JobQueue(url, queue)
    added, skipped = q.submit(jobs)
    console.print(markup(f"queue {queue!r} at {url}: {added} jobs queued, {skipped} already queued, running or done"))
    if workers is None:
        return
    try:
        exits = run_workers(workers, url, queue)
    except KeyboardInterrupt:
        err_console.print("interrupted: the workers gave their jobs back to the queue")
        raise typer.Exit(130) from None
    wanted = {job.id for job in jobs}
    statuses = [s for s in q.jobs() if s.job.id in wanted]
    table = Table(title=f"{len(statuses)} jobs on {workers} workers (queue {queue!r}, ms)")
    for col in ("kernel", "problem", "state", "best", "best config", "worker"):
        table.add_column(col)
    for s in statuses:
        spec = next(spec for spec, _ in work_list if spec.name == s.job.kernel)
        table.add_row(
            s.job.kernel,
            markup(spec.describe_problem(s.job.problem)),
            markup(f"{s.state}: {s.error}" if s.error else s.state),
            f"{s.entry.time_ms:.4f}" if s.entry else "-",
            _show_config(spec, s.entry.config) if s.entry else "-",
            markup(s.worker),
        )
    console.print(table)
    crashed = [f"worker {i} (exit status {code})" for i, code in enumerate(exits) if code != 0]
    unfinished = [s for s in statuses if s.state != "done"]
    if unfinished or crashed:
        what = f"{len(unfinished)} of {len(statuses)} jobs not done"
        raise TunekitError(what + (f"; {', '.join(crashed)} ended abnormally" if crashed else "") + " (see above)")


@command()
def worker(
    storage: FleetStorageOpt,
    queue: QueueOpt = "default",
    heartbeat: Annotated[int, typer.Option(help="Seconds between heartbeats while a job runs (RDB storages).")] = 10,
    lease: Annotated[
        int, typer.Option(help="Seconds without a heartbeat after which a job goes back to the queue.")
    ] = 60,
    max_retries: Annotated[int, typer.Option(help="Times a job whose worker vanished is queued again.")] = 2,
    max_jobs: Annotated[int | None, typer.Option(help="Stop after this many jobs.")] = None,
) -> None:
    """Take jobs from the queue in --storage and tune them on this process's GPU, until none is queued or running.

    Run one per GPU (CUDA_VISIBLE_DEVICES=i), on as many machines as you like; results go to this machine's
    cache and back into the shared store. Every worker of a queue should use the same --heartbeat and --lease.
    """
    import signal

    from tunekit.fleet.workers import stop_as_interrupted, work
    from tunekit.tuning.storage import Lease

    terms = Lease(heartbeat, lease, max_retries)
    signal.signal(signal.SIGTERM, stop_as_interrupted)  # terminated, the worker gives its job back as for Ctrl-C
    try:
        work(storage, queue, terms, max_jobs=max_jobs, say=lambda line: print(plain(line), flush=True))
    except KeyboardInterrupt:
        err_console.print("worker interrupted: its job went back to the queue")
        raise typer.Exit(130) from None


@command()
def status(
    storage: FleetStorageOpt,
    queue: Annotated[str | None, typer.Option("--queue", help="Only this queue.")] = None,
    jobs: Annotated[bool, typer.Option("--jobs", help="Also list every job.")] = False,
) -> None:
    """Jobs queued, running, done and failed in each queue of --storage."""
    from tunekit.fleet.queue import STATES, JobQueue, queue_names

    names = [queue] if queue is not None else queue_names(storage)
    if not names:
        console.print(markup(f"no queues in {storage}"))
        return
    queues = [JobQueue(storage, name, create=False) for name in names]
    statuses = {q.name: q.jobs() for q in queues}  # an unreadable job or result: warned about, never a traceback
    table = Table(title=markup(f"jobs in {storage}"))
    for col in ("queue", *STATES):
        table.add_column(col)
    for q in queues:
        counts = dict.fromkeys(STATES, 0) | Counter(s.state for s in statuses[q.name])
        table.add_row(markup(q.name), *(str(counts[state]) for state in STATES))
    console.print(table)
    if jobs:
        table = Table(title="jobs")
        for col in ("queue", "id", "kernel", "problem", "state", "attempts", "best ms", "worker", "error"):
            table.add_column(col)
        for name, s in ((name, s) for name, group in statuses.items() for s in group):
            table.add_row(
                markup(name),
                s.job.id[:12],
                markup(s.job.kernel),
                markup(",".join(f"{k}={v}" for k, v in s.job.problem.items())),
                s.state + (" (worker gone)" if s.owner_gone else ""),
                str(s.attempts),
                f"{s.entry.time_ms:.4f}" if s.entry else "-",
                markup(s.worker),
                markup(s.error),
            )
        console.print(table)
    gone = sum(s.owner_gone for group in statuses.values() for s in group)
    if gone:
        console.print(
            markup(
                f"{gone} running jobs belong to worker processes that are gone: `tunekit requeue --storage "
                f"{storage} --stale` queues them again"
            )
        )
    skipped = sum(len(q.skipped) for q in queues)
    if skipped:
        console.print(f"{skipped} jobs with an unreadable job or result (see the warnings above)")


@command()
def requeue(
    storage: FleetStorageOpt,
    queue: Annotated[str | None, typer.Option("--queue", help="Only this queue.")] = None,
    job: Annotated[
        str | None,
        typer.Option("--job", help="Queue this running job again (its id, or a prefix: `tunekit status --jobs`)."),
    ] = None,
    stale: Annotated[
        bool,
        typer.Option("--stale", help="Queue again every running job whose worker process is gone (this machine)."),
    ] = False,
) -> None:
    """Queue again jobs stuck as running because their worker was killed (on a journal storage, nothing else does).

    --stale finds the jobs whose worker ran on this machine and is gone. A job whose worker ran on another machine
    is re-queued by --job ID, once you know the worker is gone: if it is not, it can no longer complete that job.
    """
    from tunekit.fleet.queue import JobQueue, queue_names

    if (job is None) == (not stale):
        raise TunekitError("requeue needs --job ID or --stale (one of them)")
    names = [queue] if queue is not None else queue_names(storage)
    if not names:
        raise TunekitError(f"no queues in {storage}")
    queues = [JobQueue(storage, name, create=False) for name in names]
    if job is not None:
        found = [q for q in queues if any(s.job.id.startswith(job) for s in q.jobs())]
        if len(found) != 1:
            where = "no queue" if not found else f"{len(found)} queues ({[q.name for q in found]})"
            raise TunekitError(
                f"{where} of {storage} holds a job with an id starting {job!r}; see `tunekit status --jobs`"
            )
        requeued = found[0].requeue(job)
        console.print(markup(f"re-queued job {requeued.id[:12]} ({requeued.describe()}) in queue {found[0].name!r}"))
        return
    count = 0
    for q in queues:
        for requeued in q.reclaim(max_retry=None):
            count += 1
            console.print(markup(f"re-queued job {requeued.id[:12]} ({requeued.describe()}) in queue {q.name!r}"))
    unknown = sum(s.state == "running" and not s.owner_gone for q in queues for s in q.jobs())
    console.print(
        f"{count} jobs re-queued; {unknown} running jobs have a live worker here or one this machine cannot check"
        + (" (re-queue those by --job ID once their worker is gone)" if unknown else "")
    )


@command()
def plan(
    file: Annotated[Path, typer.Argument(help="The plan file: JSON lines, one problem per line.")],
    kernel: Annotated[
        list[str] | None, typer.Option("--kernel", "-k", help="Write FILE for these kernels (repeatable).")
    ] = None,
    shape: ShapeOpt = None,
    dtype: Annotated[
        list[str] | None, typer.Option("--dtype", help="float16, bfloat16 or float32 (repeatable).")
    ] = None,
) -> None:
    """Write a plan (kernels x shapes x dtypes) to FILE; without --kernel, check FILE and list its problems.

    A plan line is {"kernel": "layernorm", "shape": [4096, 1024], "dtype": "float16"} or
    {"kernel": "layernorm", "problem": {...}} (what tunekit.record_problems writes). Without --shape, each
    kernel's default problems on this machine's device.
    """
    from tunekit.core.registry import get_spec
    from tunekit.fleet.plans import read_plan
    from tunekit.runtime.recorder import write_plan

    if not kernel:
        if shape or dtype:
            raise TunekitError("--shape and --dtype go with --kernel (to write a plan)")
        problems = read_plan(file)
        table = Table()
        for col in ("kernel", "problem"):
            table.add_column(col)
        for name, problem in problems:
            table.add_row(name, markup(get_spec(name).describe_problem(problem)))
        console.print(table)
        console.print(markup(f"{len(problems)} problems in {file}"))
        return
    dtypes: list[str | None] = list(dtype) if dtype else [None]
    pairs = [(k, p) for k in kernel for d in dtypes for p in _problems(k, shape, d)]
    console.print(f"wrote {write_plan(file, pairs)} problems to {file}")


@command()
def show(
    kernel: Annotated[str | None, typer.Option("--kernel", "-k", help="Only this kernel.")] = None,
    shape: ShapeOpt = None,
    dtype: DtypeOpt = None,
    kernels: Annotated[bool, typer.Option("--kernels", help="List the kernels and exit.")] = False,
    shipped: Annotated[
        bool, typer.Option("--shipped/--no-shipped", help="Also list the entries of the shipped databases.")
    ] = True,
    json_out: JsonOpt = False,
) -> None:
    """What the cache and the shipped databases hold, and which dispatch layer serves each problem on this device;
    with --kernel and --shape, which layer serves that problem."""
    import json

    from tunekit.cli.views import device_json, problem_text
    from tunekit.core.device import fingerprint
    from tunekit.core.registry import get_spec, kernel_names
    from tunekit.runtime.dispatch import resolve
    from tunekit.store.store import Store

    if kernels:
        described = {name: get_spec(name).description for name in kernel_names()}
        if json_out:
            print(json.dumps({"kernels": described}, indent=1))
            return
        for name, description in described.items():
            _say(f"{name}: {description}")
        return
    device = fingerprint()
    with Store() as store:
        if shape:
            if kernel is None:
                raise TunekitError("--shape needs --kernel")
            spec = get_spec(kernel)
            served = []
            for problem in _problems(kernel, shape, dtype):
                res = resolve(spec, problem, device, store)
                served.append({"kernel": kernel, "problem": problem, "layer": res.layer, "config": dict(res.config)})
                if not json_out:
                    _say(f"{kernel} {problem_text(spec, problem)}")
                    _say(f"  served by {res.layer}: {config_text(spec, res.config)}")
            if json_out:
                print(json.dumps({"device": device_json(device), "resolutions": served}, indent=1))
            return
        if kernel is not None:
            get_spec(kernel)  # an unknown name fails with the list of valid ones
        listed = list_entries(store, device, kernel, shipped)
    if json_out:
        document = {
            "device": device_json(device),
            "cache": str(store.directory),
            "entries": [e.to_json() for e in listed.entries],
            "unknown_kernels": listed.unknown,
        }
        print(json.dumps(document, indent=1, default=str))
        return
    _say(f"this device: {device.label} (key {device.key})")
    _say(f"cache: {store.directory}")
    for shown in listed.entries:
        for line in shown.block():
            _say(line)
    counts = {source: sum(e.source == source for e in listed.entries) for source in ("cache", "shipped")}
    summary = f"{counts['cache']} {_entries(counts['cache'])} in the cache"
    summary += f", {counts['shipped']} shipped" if shipped else " (shipped entries not listed: --shipped lists them)"
    if listed.unknown:
        summary += f"; {listed.unknown} {_entries(listed.unknown)} of kernels this tunekit does not know, not listed"
    _say(summary)


def _entries(n: int) -> str:
    return "entry" if n == 1 else "entries"


@command("export")
def export_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="File to write (JSON).")],
    kernel: Annotated[str | None, typer.Option("--kernel", "-k", help="Only this kernel.")] = None,
    device: Annotated[
        str | None, typer.Option(help="Only this device key, or 'current' for this machine's device.")
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage", help="Export every device's results from this shared fleet store instead of the local cache."
        ),
    ] = None,
) -> None:
    """Write the cache, or a fleet's shared store (filtered by kernel and device), as a tuning database."""
    from tunekit.core.device import fingerprint
    from tunekit.core.registry import get_spec
    from tunekit.store.database import export_entries, write_document
    from tunekit.store.store import Store

    device_key = fingerprint().key if device == "current" else device
    if storage is not None:
        from tunekit.fleet import queue

        if kernel is not None:
            get_spec(kernel)  # unknown names fail with the list of valid ones
        skipped: dict[str, str] = {}
        n = write_document(out, queue.export_entries(storage, kernel, device_key, skipped=skipped))
        console.print(markup(f"exported {n} entries from {storage} to {out}"))
        if skipped:
            console.print(f"{len(skipped)} jobs left out: their job or result is unreadable (see the warnings above)")
        return
    with Store() as store:
        n = write_document(out, export_entries(store, kernel, device_key))
    console.print(markup(f"exported {n} entries to {out}"))


@command("import")
def import_cmd(path: Annotated[Path, typer.Argument(help="A tuning database written by `tunekit export`.")]) -> None:
    """Validate FILE, then merge it into the cache.

    Every entry must be what this tunekit would serve (its config in the space and within the space's rules, its
    times above the physical floor); one bad entry refuses the whole file. Per key, the local best is kept unless
    the file's entry was measured faster by the same timer.
    """
    from tunekit.store.database import import_document
    from tunekit.store.store import Store

    with Store() as store:
        result = import_document(store, path)
    console.print(
        markup(
            f"imported {path}: {result.read} entries read, {result.added} added, {result.improved} improved, "
            f"{result.kept} kept as they were (the local best was faster, or measured by another timer)"
        )
    )


@command()
def forget(
    kernel: Annotated[str | None, typer.Option("--kernel", "-k", help="Entries of this kernel.")] = None,
    device: Annotated[
        str | None,
        typer.Option(help="Entries of this device key (or a prefix, as `tunekit show` prints it), or 'current'."),
    ] = None,
    key: Annotated[
        str | None, typer.Option("--key", help="The entry with this cache key digest (or a unique prefix).")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would be removed; remove nothing.")] = False,
) -> None:
    """Remove entries from the cache: those matching every filter given (at least one)."""
    from tunekit.core.device import fingerprint
    from tunekit.store.forget import Selection, select
    from tunekit.store.forget import forget as forget_entries
    from tunekit.store.store import Store

    selection = Selection(kernel, fingerprint().key if device == "current" else device, key)
    with Store() as store:
        if dry_run:
            found = select(store, selection)
            for e in found:
                problem = ",".join(f"{k}={v}" for k, v in e.key.problem)
                console.print(markup(f"{e.key.digest}  {e.key.kernel}  {e.device.get('name', '?')}  {problem}"))
            console.print(f"{len(found)} entries would be removed")
            return
        removed = forget_entries(store, selection)
    console.print(f"removed {removed} entries")


@command()
def bench(
    kernel: Annotated[
        str | None, typer.Option("--kernel", "-k", help="One kernel's family (see `tunekit show --kernels`).")
    ] = None,
    suite: Annotated[
        str | None, typer.Option("--suite", help="A named suite: memory (norms, GELU, softmax, reductions), gemm, all.")
    ] = None,
    shape: ShapeOpt = None,
    dtype: DtypeOpt = None,
    quick: Annotated[bool, typer.Option("--quick", help="A few shapes per family (a smoke run).")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the run as JSON (after every row).")] = None,
    png: Annotated[
        Path | None, typer.Option("--png", help="Also draw the run, one PNG per family (needs matplotlib).")
    ] = None,
    compile_: Annotated[
        bool | None,
        typer.Option(
            "--compile/--no-compile", help="torch.compile baseline (default: on for a GPU, off in the interpreter)."
        ),
    ] = None,
    max_autotune: Annotated[
        bool, typer.Option("--max-autotune", help="Also torch.compile mode=max-autotune, one child process per shape.")
    ] = False,
    compile_timeout: Annotated[
        float, typer.Option(help="Seconds max-autotune may take per shape before its process is killed.")
    ] = 300.0,
    summary: Annotated[
        Path | None,
        typer.Option("--summary", help="Print the summary (geomeans, targets) of a saved --json run; measure nothing."),
    ] = None,
) -> None:
    """Tuned tunekit vs torch eager, torch.compile (and cuBLASLt for GEMM) vs the roofline measured in the same run.

    Memory-bound families in GB/s against the copy bandwidth, GEMM in TFLOP/s against the bf16 matmul rate;
    problems under 16 MiB are launch-bound: timed with CUDA graphs, in µs against an empty kernel's launch floor.
    Every implementation is checked against the reference before it is timed. In the interpreter: tiny shapes,
    wall-clock only.
    """
    from tunekit.core import backend
    from tunekit.evaluation.report import run_bench
    from tunekit.evaluation.report_tables import print_report, print_saved_summary
    from tunekit.evaluation.results import BenchOptions, BenchRun, read_run
    from tunekit.evaluation.suite import work_list

    if summary is not None:
        if kernel or suite or shape:
            raise TunekitError("--summary reads a saved run: it takes no --kernel, --suite or --shape")
        print_saved_summary(read_run(summary), console)
        return
    if png is not None:
        from tunekit.evaluation.plot import require_matplotlib

        require_matplotlib()  # before the run, not after an hour of it
    shapes = [parse_shape(s) for s in shape or []]
    work = work_list(kernel, suite, shapes, dtype, quick, backend.INTERPRETED)
    if not work:
        raise TunekitError("no problems to measure (does --dtype match the suite's dtypes?)")
    options = BenchOptions(compile=compile_, max_autotune=max_autotune, compile_timeout_s=compile_timeout)

    with console.status(f"measuring {len(work)} problems") as status:

        def after_row(run: BenchRun) -> None:
            if json_out is not None:
                run.save(json_out)  # after every row: a killed run keeps what it has
            last = run.rows[-1]
            status.update(f"measured {len(run.rows)}/{len(work)}: {last.family} {last.label}")

        run = run_bench(work, options, on_row=after_row)
    print_report(run, console)
    if json_out is not None:
        console.print(f"json: {json_out}")
    if png is not None:
        from tunekit.evaluation.plot import plot_run

        for path in plot_run(run, png):
            console.print(f"png: {path}")


@command()
def plot(
    results: Annotated[Path, typer.Argument(help="A `tunekit bench --json` file.")],
    out: Annotated[
        Path,
        typer.Option("--out", help="The PNG to write; with several families, one <stem>-<family>.png each beside it."),
    ] = Path("bench.png"),
) -> None:
    """Draw a benchmark run, one PNG per family (achieved GB/s or TFLOP/s per shape, launch-bound rows in µs, the
    better direction on each axis); no GPU needed."""
    from tunekit.evaluation.plot import plot_file

    for path in plot_file(results, out):
        console.print(f"png: {path}")


@command("record")
def record_cmd(
    kernel: KernelOpt,
    shape: ShapeOpt = None,
    dtype: DtypeOpt = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Tables file (default: timings/<device>/<kernel>.json.gz in the cache directory)."),
    ] = None,
    workers: Annotated[int, typer.Option("--workers", help="Processes compiling configs in parallel.")] = 8,
    cold_cache: Annotated[
        Path | None, typer.Option("--cold-cache", help="An empty directory for Triton's cache: cold compile times.")
    ] = None,
) -> None:
    """Exhaustive sweep: compile, verify and time every valid config on this GPU; save the timing tables."""
    import statistics

    from tunekit.core.device import fingerprint
    from tunekit.core.registry import get_spec
    from tunekit.evaluation.record import cold_triton_cache, merge_tables, record_table
    from tunekit.evaluation.timing_table import load_tables, save_tables
    from tunekit.store.shipped_data import recorded_table_path
    from tunekit.tuning.bench import CudaEventTimer

    if cold_cache is not None:
        cold_triton_cache(str(cold_cache))
    spec = get_spec(kernel)
    path = out or recorded_table_path(fingerprint().label, kernel)
    tables = []
    summary = Table(title=f"{kernel}: timing tables -> {path}")
    for col in ("problem", "configs", "ok", "wrong", "failed", "best ms", "median ms", "compile s (median)"):
        summary.add_column(col)
    for problem in _problems(kernel, shape, dtype):
        table = record_table(spec, problem, CudaEventTimer(), workers=workers)
        tables.append(table)
        ok = table.ok_rows()
        compiles = [r.compile_s for r in table.rows if r.compile_s is not None]
        status = [r.status for r in table.rows]
        summary.add_row(
            spec.describe_problem(problem),
            str(len(table.rows)),
            str(status.count("ok")),
            str(status.count("wrong")),
            str(status.count("failed")),
            f"{ok[0].time_ms:.4f}" if ok else "-",
            f"{ok[len(ok) // 2].time_ms:.4f}" if ok else "-",
            f"{statistics.median(compiles):.2f}" if compiles else "-",
        )
        old = load_tables(path) if path.exists() else []
        save_tables(path, merge_tables(old, [table]))  # after every problem: a killed run keeps what it has
    console.print(summary)


@command()
def explain(
    kernel: KernelOpt,
    shape: Annotated[str, typer.Option("--shape", "-s", help="Problem shape, e.g. 4097x4096x4096.")],
    dtype: DtypeOpt = None,
    table: Annotated[
        str | None,
        typer.Option(
            "--table",
            help="Model the device a timing table was recorded on (default: this GPU): a table file, or a shipped "
            "table's name such as h200-sm90-132sm/gemm.",
        ),
    ] = None,
) -> None:
    """The quantization model per candidate family: tiles, padded waste, occupancy, waves; what it prunes and why."""
    from tunekit.core.device import fingerprint
    from tunekit.core.device_limits import device_limits
    from tunekit.core.registry import get_spec
    from tunekit.evaluation.timing_table import load_tables
    from tunekit.store.shipped_data import resolve_table, shipped_table_files, table_name
    from tunekit.tuning.explain import explain as explain_text

    spec = get_spec(kernel)
    (problem,) = _problems(kernel, [shape], dtype)
    if table is not None:
        path = resolve_table(table)
        recorded = load_tables(path)
        if not recorded:
            raise TunekitError(f"{path} holds no timing tables")
        device, limits = recorded[0].fingerprint, recorded[0].device_limits
    else:
        device, found = fingerprint(), device_limits()
        if found is None:
            names = ", ".join(table_name(p) for p in shipped_table_files()) or "none shipped"
            raise TunekitError(
                "the interpreter has no SMs to model: run on a GPU, or give --table with a recorded device "
                f"(a timing-table file, or a shipped table: {names})"
            )
        limits = found
    print(explain_text(spec, problem, device, limits))


@command()
def efficiency(
    tables: Annotated[
        list[Path] | None,
        typer.Option(
            "--tables",
            help="Timing-table files (default: every shipped table and every one `tunekit record` wrote to the "
            "cache directory).",
        ),
    ] = None,
    strategies: Annotated[
        str, typer.Option("--strategies", help="Comma-separated: random, tpe, gp, exhaustive, model.")
    ] = "random,tpe,gp,exhaustive,model",
    seeds: Annotated[int, typer.Option("--seeds", help="Seeds per strategy and shape.")] = 5,
    gp_cap: Annotated[int, typer.Option("--gp-cap", help="Trial cap for gp (Optuna's GP is slow to ask).")] = 30,
    workers: Annotated[int | None, typer.Option("--workers", help="Processes (default: one per CPU).")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Write every run and the aggregates as JSON.")] = None,
) -> None:
    """Tuning efficiency on a simulated device: trials and simulated seconds until within 2% of the recorded best."""
    from tunekit.evaluation.efficiency import format_table, run_benchmark
    from tunekit.evaluation.timing_table import load_all
    from tunekit.store.shipped_data import default_table_files

    loaded = load_all(default_table_files() if tables is None else tables)
    if not loaded:
        raise TunekitError("no timing tables found (record some with `tunekit record` on a GPU)")
    names = [s.strip() for s in strategies.split(",") if s.strip()]
    result = run_benchmark(loaded, names, seeds, out, gp_trial_cap=gp_cap, workers=workers)
    print(format_table(result))


@command()
def devices(json_out: JsonOpt = False) -> None:
    """The devices tunekit sees, with their fingerprints and cache keys."""
    import json

    from tunekit.cli.views import device_json
    from tunekit.core.device import all_fingerprints

    found = all_fingerprints()
    if json_out:
        print(json.dumps({"devices": [device_json(fp) for fp in found]}, indent=1))
        return
    for fp in found:
        _say(f"{fp.label}  key={fp.key}")
        for name, value in fp.to_json().items():
            _say(f"  {name}: {printable(value)}")


@command("bench-host")
def bench_host(
    rows: Annotated[int, typer.Option("--rows", help="Rows of each op's problem (a decode step's batch).")] = 8,
    width: Annotated[int, typer.Option("--width", help="Hidden size of each op's problem.")] = 1024,
    calls: Annotated[int, typer.Option("--calls", help="Calls per timed loop.")] = 3000,
    json_out: JsonOpt = False,
    out: Annotated[Path | None, typer.Option("--out", help="Also write the JSON to this file.")] = None,
) -> None:
    """Host time per eager call of every op, next to torch's equivalent, its bare launch and its GPU time."""
    import json

    from tunekit.evaluation.host_bench import measure, table

    result = measure(rows=rows, width=width, calls=calls)
    if out is not None:
        out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1) if json_out else table(result))


def main() -> None:
    app(prog_name="tunekit")

