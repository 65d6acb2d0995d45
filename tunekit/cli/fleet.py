"""The job-queue commands (worker, status, requeue, plan) and `tunekit tune`'s path through a queue."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tunekit.cli.app import (
    FleetStorageOpt,
    JsonOpt,
    QueueOpt,
    ShapeOpt,
    console,
    err_console,
    error_line,
    interpreter_note,
    say,
)
from tunekit.cli.problems import kernel_problems
from tunekit.cli.views import config_text, counted
from tunekit.cli.width import rows
from tunekit.core import settings
from tunekit.core.errors import TunekitError
from tunekit.core.render import markup, plain

if TYPE_CHECKING:
    from tunekit.core.space import Problem
    from tunekit.core.spec import KernelSpec
    from tunekit.fleet.jobs import JobStatus
    from tunekit.tuning.tune_types import TuneOptions


def tune_through_queue(
    work_list: list[tuple[KernelSpec, Problem]],
    options: TuneOptions,
    submit: bool,
    workers: int | None,
    queue: str,
    user_problems: Sequence[tuple[str, Problem]] = (),
) -> None:
    """`tune --submit`: queue the problems as jobs; `tune --workers N`: also run N local workers, wait, print.
    `user_problems` are a plan's problems of user kernels (tunekit.autotune), by import path: a worker imports the
    kernel's module to tune one; this process never does."""
    from tunekit.fleet.jobs import Job
    from tunekit.fleet.queue import JobQueue
    from tunekit.fleet.workers import interleave_kernels, run_workers

    if submit and workers is not None:
        raise TunekitError("--submit only queues the jobs and --workers also runs them here: give one of them")
    if workers is not None and workers < 1:
        raise TunekitError(f"--workers must be >= 1, but got {workers}")
    url = _queue_url(options.storage, submit)
    jobs = interleave_kernels(
        Job(
            name,
            dict(problem),
            options.trials,
            options.sampler,
            options.seed,
            options.timeout_s,
            options.early_stop,
        )
        for name, problem in [*((spec.name, p) for spec, p in work_list), *user_problems]
    )
    q = JobQueue(url, queue)
    added, skipped = q.submit(jobs)
    console.print(markup(f"queue {queue!r} at {url}: {added} jobs queued, {skipped} already queued, running or done"))
    if workers is None:
        return
    try:
        # Local workers of the default queue share this machine's cache, which resumes a killed job: their tuning
        # studies stay in memory (tunekit.fleet.workers.work)
        exits = run_workers(workers, url, queue, keep_studies=options.storage is not None)
    except KeyboardInterrupt:
        err_console.print("interrupted: the workers gave their jobs back to the queue")
        raise typer.Exit(130) from None
    wanted = {job.id for job in jobs}
    statuses = [s for s in q.jobs() if s.job.id in wanted]
    _print_job_results(work_list, statuses, f"{len(statuses)} jobs on {workers} workers (queue {queue!r}, ms)")
    crashed = [f"worker {i} (exit status {code})" for i, code in enumerate(exits) if code != 0]
    unfinished = [s for s in statuses if s.state != "done"]
    if unfinished or crashed:
        what = f"{len(unfinished)} of {len(statuses)} jobs not done"
        raise TunekitError(what + (f"; {', '.join(crashed)} ended abnormally" if crashed else "") + " (see above)")


def _queue_url(storage: str | None, submit: bool) -> str:
    """--storage; without it, for local workers only, a sqlite file in the cache directory."""
    if storage is not None:
        return storage
    if submit:
        raise TunekitError("--submit needs --storage URL: the shared store the workers read")
    settings.cache_dir().mkdir(parents=True, exist_ok=True)
    return default_queue_url()


def default_queue_url() -> str:
    """The storage `tune --workers` uses without --storage (and `status` reads without one)."""
    return f"sqlite:///{settings.cache_dir() / 'fleet.db'}"


def _storage_file(url: str) -> Path | None:
    """The file a journal path or a sqlite URL names (None for a server's URL): `status` reads it only if it
    exists, since opening a storage creates it."""
    if url.startswith("sqlite:///"):
        return Path(url[len("sqlite:///") :])
    return None if "://" in url else Path(url)


def _print_job_results(work_list: list[tuple[KernelSpec, Problem]], statuses: list[JobStatus], title: str) -> None:
    from tunekit.store.user_entries import user_problem_text

    specs = {spec.name: spec for spec, _ in work_list}
    cells = []
    for s in statuses:
        spec = specs.get(s.job.kernel)  # None: a user kernel's job, printed as data (its code is not imported here)
        problem = spec.describe_problem(s.job.problem) if spec else user_problem_text(s.job.problem)
        config = "-"
        if s.entry:
            config = config_text(spec, s.entry.config) if spec else user_problem_text(s.entry.config)
        cells.append(
            [
                plain(s.job.kernel),
                plain(problem),  # name=value joined by ",": a cell holds no space
                plain(f"{s.state}: {s.error}" if s.error else s.state),
                f"{s.entry.time_ms:.4f}" if s.entry else "-",
                plain(config.replace(" ", ",")),
                plain(s.worker),
            ]
        )
    rows(title, ("kernel", "problem", "state", "best", "best config", "worker"), cells)


def worker(
    storage: FleetStorageOpt,
    queue: QueueOpt = "default",
    heartbeat: Annotated[int, typer.Option(help="Seconds between heartbeats while a job runs (RDB storages).")] = 10,
    lease: Annotated[
        int, typer.Option(help="Seconds without a heartbeat after which a job goes back to the queue.")
    ] = 60,
    max_retries: Annotated[int, typer.Option(help="Times a job whose worker vanished is queued again.")] = 2,
    max_jobs: Annotated[int | None, typer.Option(help="Stop after this many jobs.")] = None,
    keep_studies: Annotated[
        bool,
        typer.Option(
            "--keep-studies/--no-keep-studies",
            help="Each job's tuning study in --storage (RDB), so a job resumed on another machine reuses its trials; "
            "--no-keep-studies keeps it in memory (the local cache resumes a job: `tune --workers` without --storage).",
        ),
    ] = True,
) -> None:
    """Take jobs from the queue in --storage and tune them on this process's GPU, until none is queued or running.

    Run one per GPU (CUDA_VISIBLE_DEVICES=i), on as many machines as you like; results go to this machine's
    cache and back into the shared store. Every worker of a queue should use the same --heartbeat and --lease.
    """
    import signal

    from tunekit.fleet.workers import stop_as_interrupted, work
    from tunekit.tuning.storage import Lease

    if max_jobs is not None and max_jobs < 1:
        raise TunekitError(f"--max-jobs must be >= 1, but got {max_jobs}")
    terms = Lease(heartbeat, lease, max_retries)
    from tunekit.fleet.queue import queue_names

    queue_names(storage)  # a storage that cannot be opened fails here, before the note
    interpreter_note()
    signal.signal(signal.SIGTERM, stop_as_interrupted)  # terminated, the worker gives its job back as for Ctrl-C
    try:
        work(
            storage,
            queue,
            terms,
            max_jobs=max_jobs,
            say=lambda line: print(plain(line), flush=True),
            keep_studies=keep_studies,
        )
    except KeyboardInterrupt:
        err_console.print("worker interrupted: its job went back to the queue")
        raise typer.Exit(130) from None


def status(
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage",
            help="The shared store: an Optuna RDB URL or a journal file path (default: the one `tune --workers` "
            "uses, sqlite in the cache directory). Read only: nothing is created.",
        ),
    ] = None,
    queue: Annotated[str | None, typer.Option("--queue", help="Only this queue.")] = None,
    jobs: Annotated[bool, typer.Option("--jobs", help="Also list every job.")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Jobs queued, running, done and failed in each queue of --storage."""
    import json

    from tunekit.fleet.jobs import STATES
    from tunekit.fleet.queue import JobQueue, queue_names

    storage = storage or default_queue_url()
    path = _storage_file(storage)
    if path is not None and not path.exists():
        names: list[str] = []
    else:
        names = [queue] if queue is not None else queue_names(storage)
    if not names:
        if json_out:
            print(json.dumps({"storage": storage, "queues": {}}, indent=1))
        else:
            say(
                f"no queues in {plain(storage)}"
                + (" (no such file: nothing queued yet)" if path and not path.exists() else "")
            )
        return
    queues = [JobQueue(storage, name, create=False) for name in names]
    statuses = {q.name: q.jobs() for q in queues}  # an unreadable job or result: warned about, never a traceback
    if json_out:
        document = {
            "storage": storage,
            "queues": {
                name: {
                    "counts": dict(dict.fromkeys(STATES, 0) | Counter(s.state for s in group)),
                    "jobs": [_job_json(s) for s in group] if jobs else None,
                }
                for name, group in statuses.items()
            },
        }
        print(json.dumps(document, indent=1, default=str))
        return
    counts = [dict.fromkeys(STATES, 0) | Counter(s.state for s in statuses[q.name]) for q in queues]
    rows(
        f"jobs in {plain(storage)}",
        ("queue", *STATES),
        [[plain(q.name), *(str(c[state]) for state in STATES)] for q, c in zip(queues, counts)],
    )
    if jobs:
        _job_rows(statuses)
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


def _job_rows(statuses: dict[str, list[Any]]) -> None:
    """`status --jobs`: one row (or record) per job."""
    cells = [
        [
            plain(name),
            s.job.id[:12],
            plain(s.job.kernel),
            plain(",".join(f"{k}={v}" for k, v in s.job.problem.items())),  # a cell holds no space
            s.state + (" (worker gone)" if s.owner_gone else ""),
            str(s.attempts),
            f"{s.entry.time_ms:.4f}" if s.entry else "-",
            plain(s.worker),
            plain(s.error),
        ]
        for name, group in statuses.items()
        for s in group
    ]
    rows("jobs", ("queue", "id", "kernel", "problem", "state", "attempts", "best ms", "worker", "error"), cells)


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


def plan(
    file: Annotated[Path, typer.Argument(help="The plan file: JSON lines, one problem per line.")],
    kernel: Annotated[
        list[str] | None, typer.Option("--kernel", "-k", help="Write FILE for these kernels (repeatable).")
    ] = None,
    shape: ShapeOpt = None,
    dtype: Annotated[
        list[str] | None,
        typer.Option("--dtype", metavar="DTYPE", help="float16, bfloat16 or float32 (repeatable)."),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace FILE where it exists (refused otherwise).")] = False,
    json_out: JsonOpt = False,
) -> None:
    """Write a plan (kernels x shapes x dtypes) to FILE; without --kernel, check FILE and list its problems.

    A plan line is {"kernel": "layernorm", "shape": [4096, 1024], "dtype": "float16"} or
    {"kernel": "layernorm", "problem": {...}} (what tunekit.record_problems writes). Without --shape, each
    kernel's default problems on this machine's device.
    """
    import json

    from tunekit.cli.views import problem_text
    from tunekit.core.registry import get_spec
    from tunekit.fleet.plans import read_plan_lines
    from tunekit.runtime.recorder import write_plan
    from tunekit.store.user_entries import is_user_kernel, user_problem_text

    if not kernel:
        if shape or dtype:
            raise TunekitError("--shape and --dtype go with --kernel (to write a plan)")
        lines = read_plan_lines(file)  # a bad line is named (one `error:` line each, exit 1); the rest listed
        problems = lines.pairs()
        if json_out:
            listed = [{"kernel": name, "problem": dict(problem)} for name, problem in problems]
            print(json.dumps({"plan": str(file), "problems": listed, "refused": lines.refused}, indent=1))
        elif problems:
            for name, problem in problems:
                user = is_user_kernel(name)
                described = user_problem_text(problem) if user else problem_text(get_spec(name), problem)
                say(f"{plain(name)} {described}")
            say(f"{counted(len(problems), 'problem')} in {plain(file)}")
        for refusal in lines.refused:
            error_line(refusal)
        if lines.refused:
            raise typer.Exit(1)
        return
    dtypes: list[str | None] = list(dtype) if dtype else [None]
    pairs = [(k, p) for k in kernel for d in dtypes for p in kernel_problems(k, shape, d)]
    held = sum(1 for line in file.read_bytes().splitlines() if line.strip()) if file.is_file() else 0
    if file.is_file() and not force:  # a recorded plan is not easily made again
        raise TunekitError(f"{plain(file)} exists ({counted(held, 'problem')}): --force replaces it")
    written = write_plan(file, pairs)
    if json_out:
        print(json.dumps({"plan": str(file), "written": written}, indent=1))
        return
    replaced = f" (replaced the {counted(held, 'problem')} it held)" if held else ""
    say(f"wrote {counted(written, 'problem')} to {plain(file)}{replaced}")


def _job_json(s: JobStatus) -> dict[str, object]:
    return {
        "id": s.job.id,
        "kernel": s.job.kernel,
        "problem": dict(s.job.problem),
        "state": s.state,
        "worker_gone": s.owner_gone,
        "attempts": s.attempts,
        "best_ms": s.entry.time_ms if s.entry else None,
        "worker": s.worker,
        "error": s.error,
    }
