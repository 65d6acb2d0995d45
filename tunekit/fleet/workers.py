"""Fleet workers: claim a job, tune it on this device (the one orchestration, tunekit.tuning.orchestrate; a user
kernel's job by the kernel itself, imported by the path the job names), complete it with its entry; run several local
workers, one per GPU."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunekit.core.errors import TunekitError
from tunekit.core.problems import check_problem
from tunekit.fleet.claims import Claim
from tunekit.fleet.jobs import Job
from tunekit.fleet.queue import IDLE_POLL_S, JobQueue
from tunekit.store.entry import Entry
from tunekit.store.user_entries import is_user_kernel
from tunekit.tuning.phases import PHASES as PROBLEM_PHASES
from tunekit.tuning.phases import PhaseTimes
from tunekit.tuning.shared_bench import SharedBench
from tunekit.tuning.storage import Lease

if TYPE_CHECKING:
    from tunekit.store.store import Store
    from tunekit.tuning.bench import Timer
    from tunekit.tuning.tune_types import TuneReport

logger = logging.getLogger("tunekit")


# A job's phases: claiming it, the problem's own (tunekit.tuning.phases, as `tune --plan` in one process times them),
# and writing its result to the queue.
PHASES = ("claim", *PROBLEM_PHASES, "queue")


@dataclass
class JobTimes:
    """Where one job's seconds went in the worker that ran it (wall clock, seconds)."""

    job: str = ""
    outcome: str = ""  # done, failed or lost
    claim: float = 0.0  # reaping stale jobs and claiming this one: storage transactions
    problem: PhaseTimes = field(default_factory=PhaseTimes)  # tuning it: startup, compile, ..., store, other
    queue: float = 0.0  # the result (or failure) written to the queue
    bench_pid: int | None = None  # the isolation worker that measured the job; None in this process

    def seconds(self, phase: str) -> float:
        return float(getattr(self, phase)) if phase in ("claim", "queue") else self.problem.seconds[phase]

    def describe(self) -> str:
        return self.problem.describe()


@dataclass
class WorkerReport:
    done: int = 0
    failed: int = 0
    lost: int = 0  # leases that lapsed while this worker tuned: the job went to another worker
    jobs: list[JobTimes] = field(default_factory=list)
    boot_s: float = 0.0  # process start to work(): the interpreter and imports (0 where unknown)
    open_s: float = 0.0  # the queue, the device fingerprint and the cache opened
    idle_s: float = 0.0  # polling while other workers' jobs ran
    wall_s: float = 0.0  # work() from start to end
    bench_started: int = 0  # isolation worker processes started: 1 when one served every job

    def phases(self) -> dict[str, float | int]:
        """Totals per phase over the worker's life, for `tests/gpu/fleet_scaling.sh`."""
        totals: dict[str, float | int] = {"boot": self.boot_s, "open": self.open_s}
        for name in PHASES:
            totals[name] = sum(t.seconds(name) for t in self.jobs)
        totals |= {"idle": self.idle_s, "wall": self.boot_s + self.wall_s}
        totals = {k: round(float(v), 3) for k, v in totals.items()}
        return totals | {"jobs": len(self.jobs), "bench_started": self.bench_started}


def run_job(
    job: Job,
    store: Store,
    tuning_storage: str | None,
    bench: SharedBench | None = None,
    times: JobTimes | None = None,
) -> tuple[Entry, TuneReport]:
    """Tune one job on this process's device; the result is merged into `store` (the device-keyed cache).

    `bench` is the worker's (reused across jobs); without one, a bench is made for this job and closed after it.
    `times` receives the job's phases (tunekit.tuning.phases), as `tune --plan` in one process times them.
    """
    from tunekit.core.device import fingerprint
    from tunekit.core.registry import get_spec
    from tunekit.tuning.orchestrate import TuneOptions

    if is_user_kernel(job.kernel):
        return _run_user_job(job)
    times = times if times is not None else JobTimes()
    benches = bench if bench is not None else SharedBench()
    try:
        spec = get_spec(job.kernel)
        problem = check_problem(spec, job.problem)
        device = fingerprint()
        options = TuneOptions(
            trials=job.trials,
            timeout_s=job.timeout_s,
            sampler=job.sampler,
            seed=job.seed,
            storage=tuning_storage,
            early_stop=job.early_stop,
        )
        restarts = benches.restarts
        # The same per-problem work as `tune --plan` in one process (torch's candidate included).
        entry, report = benches.tune(spec, problem, device, options, store, phases=times.problem)
        times.bench_pid = benches.isolated.pid if benches.isolated is not None else None
        report.isolated = benches.isolated is not None
        report.restarts = benches.restarts - restarts
        return entry, report
    finally:
        if bench is None:
            benches.close()


def _run_user_job(job: Job) -> tuple[Entry, TuneReport]:
    """A user kernel's job (tunekit.autotune): the worker imports the module the job names, as `tune --plan` does
    here, and the kernel tunes the problem into the working store (its own candidates, timer and checks; the job's
    trials and sampler are tunekit's kernels')."""
    from tunekit.tuning.tune_types import TuneReport
    from tunekit.user_kernels.by_path import load_kernel

    entry, measured = load_kernel(job.kernel).tune(job.problem)
    return entry, TuneReport(entry, benchmarked=measured)


def interleave_kernels(jobs: Iterable[Job]) -> list[Job]:
    """The jobs round-robin over their kernels, each kernel's jobs in their order (the queue's claim order).

    Workers claim in queue order. With one kernel's jobs in a row, workers starting together all compile that
    kernel's configs at once, each for itself; interleaved, they start on different kernels, and a worker's first
    job of a kernel another worker has tuned finds its compiled configs in the shared Triton cache.
    """
    by_kernel: dict[str, list[Job]] = {}
    for job in jobs:
        by_kernel.setdefault(job.kernel, []).append(job)
    rounds = max((len(group) for group in by_kernel.values()), default=0)
    return [group[i] for i in range(rounds) for group in by_kernel.values() if i < len(group)]


def work(
    url: str,
    queue: str = "default",
    lease: Lease | None = None,
    *,
    max_jobs: int | None = None,
    say: Callable[[str], None] = print,
    isolate: bool | None = None,
    timer: Timer | None = None,
    keep_studies: bool = True,
) -> WorkerReport:
    """Claim, tune and complete jobs until none is queued or running (or `max_jobs` were taken).

    With leases, an idle worker keeps polling while other workers' jobs run: a job whose worker dies comes back.
    Candidates run as tune() would run them (isolated on a GPU; `isolate` as TuneOptions.isolate), but one
    isolation worker process serves all the jobs (SharedBench). `timer` defaults to the device's.
    The report (and the last line said) holds each phase's seconds. With `keep_studies` each job's tuning study
    goes to the queue's storage (an RDB: a job resumed on another machine reuses its trials); without, it stays in
    memory, and the cache, written after each trial, resumes a killed job (local workers share it). With RDB
    studies a local worker's unaccounted time was 0.62 s per job (tests/gpu/model_packs.py's 2-GPU run; 0.14 s per
    problem in one process).
    """
    from tunekit.core.device import fingerprint
    from tunekit.store.store import Store

    began = time.perf_counter()
    report = WorkerReport(boot_s=_process_age_s())
    q = JobQueue(url, queue, lease)
    device = fingerprint()
    me = f"{socket.gethostname()}:{os.getpid()} {device.label} ({device.key[:8]})"
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES")
    say(f"worker {me}: queue {queue!r} at {url}" + (f", CUDA_VISIBLE_DEVICES={gpu}" if gpu is not None else ""))
    bench = SharedBench(timer, isolate)
    try:
        with Store() as store:
            report.open_s = time.perf_counter() - began
            while max_jobs is None or report.done + report.failed + report.lost < max_jobs:
                started = time.perf_counter()
                q.reap()
                claim = q.claim(me)
                if claim is None:
                    if q.lease is not None and q.any_running():
                        time.sleep(IDLE_POLL_S)  # short: the last job's end is also when every worker may exit
                        report.idle_s += time.perf_counter() - started
                        continue
                    break
                times = JobTimes(job=claim.job.describe(), claim=time.perf_counter() - started)
                report.jobs.append(times)
                _run_claimed(q, claim, store, bench, times, report, say, q.tuning_storage if keep_studies else None)
    finally:
        report.bench_started = bench.started
        bench.close()  # also on Ctrl-C and SIGTERM (KeyboardInterrupt): the isolation worker never outlives us
    report.wall_s = time.perf_counter() - began
    say(f"worker {me}: {report.done} done, {report.failed} failed, {report.lost} handed on")
    say(f"worker {me}: phases (s) {json.dumps(report.phases())}")
    return report


def _run_claimed(
    q: JobQueue,
    claim: Claim,
    store: Store,
    bench: SharedBench,
    times: JobTimes,
    report: WorkerReport,
    say: Callable[[str], None],
    studies: str | None,
) -> None:
    """Tune a claimed job (its tuning study in `studies`, None: in memory) and record its outcome in the queue (and
    its phases in `times`)."""
    start = time.monotonic()
    try:
        entry, tuned = run_job(claim.job, store, studies, bench, times)
    except Exception as exc:  # the job's failure, not the worker's: recorded, and on to the next
        reason = str(exc) if isinstance(exc, TunekitError) else f"{type(exc).__name__}: {exc}"
        if not isinstance(exc, TunekitError):
            logger.exception("tunekit: job %s raised", claim.job.describe())
        written = time.perf_counter()
        q.fail(claim, reason)
        times.queue, times.outcome = time.perf_counter() - written, "failed"
        report.failed += 1
        say(f"  {claim.job.describe()}: failed: {reason}")
        return
    except BaseException:  # KeyboardInterrupt (Ctrl-C, SIGTERM), SystemExit: hand the job on, then stop
        q.release(claim)
        raise
    elapsed = time.monotonic() - start
    written = time.perf_counter()
    completed = q.complete(claim, entry)
    times.queue = time.perf_counter() - written
    if completed:
        times.outcome = "done"
        report.done += 1
        say(
            f"  {claim.job.describe()}: done in {elapsed:.1f} s, best {entry.time_ms:.4f} ms "
            f"({tuned.benchmarked} new, {tuned.reused} reused; {times.describe()})"
        )
    else:
        times.outcome = "lost"
        report.lost += 1
        say(f"  {claim.job.describe()}: lease lapsed while tuning; another worker has the job")


def _process_age_s() -> float:
    """Seconds since this process started (Linux; 0 elsewhere): its interpreter and imports before work()."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return max(0.0, uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return 0.0


def gpu_slots() -> list[str]:
    """The GPUs local workers are pinned to, one each (CUDA_VISIBLE_DEVICES values); none in the interpreter."""
    from tunekit.core import backend

    if backend.INTERPRETED:
        return []
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [v.strip() for v in visible.split(",") if v.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def cpu_share(workers: int) -> int:
    """Host cores per local worker (at least one)."""
    return max(1, (os.cpu_count() or 1) // max(1, workers))


def run_workers(
    n: int, url: str, queue: str = "default", lease: Lease | None = None, keep_studies: bool = True
) -> list[int]:
    """Run `n` worker processes here (worker i on GPU i, round robin), wait for all; their exit statuses.
    `keep_studies`: as `work`'s.

    Interrupted (Ctrl-C), the workers still running are sent SIGTERM: each gives its job back to the queue.
    """
    lease = lease or Lease()
    slots = gpu_slots()
    command = [sys.executable, "-m", "tunekit.cli", "worker", "--storage", url, "--queue", queue]
    command += ["--heartbeat", str(lease.heartbeat_s), "--lease", str(lease.timeout_s)]
    command += ["--max-retries", str(lease.max_retries)] + ([] if keep_studies else ["--no-keep-studies"])
    procs: list[subprocess.Popen[bytes]] = []
    previous = signal.getsignal(signal.SIGTERM)
    with suppress(ValueError):  # not the main thread: Ctrl-C alone stops the workers
        signal.signal(signal.SIGTERM, stop_as_interrupted)  # terminated, the workers are stopped as for Ctrl-C
    try:
        for i in range(n):
            env = dict(os.environ)
            if slots:
                env["CUDA_VISIBLE_DEVICES"] = slots[i % len(slots)]
            # Each worker's CPU work (torch ops on the host, Triton's compiler) gets its share of the cores rather
            # than every worker starting one thread per core and all of them contending.
            env.setdefault("OMP_NUM_THREADS", str(cpu_share(n)))
            procs.append(subprocess.Popen(command, env=env))
        return [p.wait() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        with suppress(ValueError):
            signal.signal(signal.SIGTERM, previous)


def stop_as_interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
