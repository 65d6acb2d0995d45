"""Tuning at fleet scale: a job queue and its workers on Optuna's storages, no protocol of our own.

How the queue maps onto Optuna (one storage holds the queue, every job's tuning study and every result):
- A queue is one study, `tunekit:jobs:<queue>`. A job is a trial enqueued with no parameters and the job
  (kernel, problem, trial budget, sampler, seed) in its user attribute `tunekit:job`.
- Claiming a job is Optuna's own pop of a WAITING trial: `set_trial_state_values(RUNNING)` succeeds for exactly
  one caller (a row lock in PostgreSQL and MySQL, the log order in a journal file, an immediate transaction in
  SQLite: see `_serialise_sqlite`).
- A done job is COMPLETE, its value the best time (ms) and its cache entry (JSON) in `tunekit:result`; a job that
  cannot be tuned is FAIL with the reason in `tunekit:error`.
- Leases (RDB storages: PostgreSQL and SQLite, tested; MySQL likewise) are Optuna's heartbeats. A worker
  records a heartbeat every `heartbeat_s` while it holds a job; before claiming, every worker runs
  `optuna.storages.fail_stale_trials`, which fails a RUNNING job whose last heartbeat is older than `timeout_s`,
  and Optuna's `RetryHeartbeatStaleTrialCallback` enqueues a copy. The stale original can never be completed
  afterwards (its worker, if it was only stalled, gets UpdateFinishedTrialError and keeps its result local), so
  the copy is the only trial of that job that can complete: none is lost, none is completed twice. (Optuna
  ignores a RUNNING trial with no heartbeat at all: the claim records the first one at once, so only a worker
  killed within those milliseconds leaves a job that never comes back. Submit a job list from one process at a
  time: two submitting the same job at once may both queue it.)
- A journal file (Optuna's JournalStorage) claims jobs race-free too, but Optuna 5.0 has no heartbeats for it
  (heartbeats are an RDBStorage feature): no leases, so nothing ever finds a journal job stale. A worker interrupted
  by Ctrl-C or SIGTERM gives its job back. A SIGKILLed one cannot: its job would stay RUNNING for good. So each
  claim also records its owner (`tunekit:owner`: host, boot id, pid and the process's start time), and a job whose
  owner process is known to be gone (same host and boot, no such process, or the pid reused by a newer process)
  is queued again: automatically by every worker before it claims (up to the lease's `max_retries`; on RDB
  storages this comes before the lease lapses), or with `tunekit requeue --stale`. A journal job whose worker ran
  on another machine can only be re-queued by hand, `tunekit requeue --job ID`; its worker, if it was alive after
  all, can never complete the original.
- Results are read defensively: a job or result attribute that is not what a worker writes (a result must pass
  the same checks as an imported database entry) is reported with its job id and skipped; every other job still
  shows and exports.
- Each job's tuning study goes to the same storage (RDB URLs; the tuner takes URLs only), so a job resumed on
  another worker reuses the trials measured before; every worker also writes each result to its own
  device-keyed cache, which (on one machine, shared by the local workers) resumes a killed job too.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
import sqlalchemy.exc
from optuna.exceptions import ExperimentalWarning, StorageInternalError, UpdateFinishedTrialError
from optuna.storages import BaseStorage, RDBStorage, RetryHeartbeatStaleTrialCallback, fail_stale_trials
from optuna.trial import FrozenTrial, TrialState

from tunekit.core.canonical import digest
from tunekit.core.errors import InvalidShapeError, TunekitError
from tunekit.core.render import brief
from tunekit.core.space import Config, Value
from tunekit.core.spec import KernelSpec
from tunekit.fleet.owner import describe_owner, owner_alive, owner_record
from tunekit.runtime.recorder import plan_line
from tunekit.store.entry import Entry, merge_entries

if TYPE_CHECKING:
    from tunekit.store.entry import TrialRecord
    from tunekit.store.store import Store
    from tunekit.tuning.bench import Timer
    from tunekit.tuning.isolation import IsolatedBench, Spawned
    from tunekit.tuning.tuner import Bench, TuneReport

logger = logging.getLogger("tunekit")

QUEUE_PREFIX = "tunekit:jobs:"
JOB_ATTR = "tunekit:job"
RESULT_ATTR = "tunekit:result"
ERROR_ATTR = "tunekit:error"
WORKER_ATTR = "tunekit:worker"
OWNER_ATTR = "tunekit:owner"
STATES = ("queued", "running", "done", "failed")
_IDLE_POLL_S = 1.0


@dataclass(frozen=True)
class Lease:
    """How long a job stays a worker's without a heartbeat. Every worker of a queue should use the same values."""

    heartbeat_s: int = 10
    timeout_s: int = 60
    max_retries: int = 2  # a job whose worker vanished this many times more stays failed

    def __post_init__(self) -> None:
        if self.heartbeat_s < 1 or self.timeout_s <= self.heartbeat_s or self.max_retries < 0:
            raise TunekitError(
                f"a lease needs heartbeat >= 1 s, a timeout longer than the heartbeat and retries >= 0, but got "
                f"heartbeat {self.heartbeat_s} s, timeout {self.timeout_s} s, retries {self.max_retries}"
            )


@dataclass(frozen=True)
class Job:
    kernel: str
    problem: dict[str, Value]
    trials: int = 30
    sampler: str = "tpe"
    seed: int = 0
    timeout_s: float | None = None

    @property
    def id(self) -> str:
        return digest(self._fields())

    def _fields(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "problem": dict(self.problem),
            "trials": self.trials,
            "sampler": self.sampler,
            "seed": self.seed,
            "timeout_s": self.timeout_s,
        }

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, **self._fields()}

    @classmethod
    def from_json(cls, data: Any) -> Job:
        """A job as a queue stores it; TunekitError naming the field when it is not what `submit` writes."""
        if not isinstance(data, dict):
            raise TunekitError(f"a job must be an object, but got {type(data).__name__}")
        problem = data.get("problem")
        if not isinstance(data.get("kernel"), str):
            raise TunekitError(f"a job's kernel must be a string, but got {brief(data.get('kernel'))}")
        if not isinstance(problem, dict) or not all(
            isinstance(k, str) and isinstance(v, (str, bool, int)) for k, v in problem.items()
        ):
            raise TunekitError(f"a job's problem must map names to strings, bools or ints, but got {brief(problem)}")
        for name in ("trials", "seed"):
            value = data.get(name)
            if type(value) is not int or value < (1 if name == "trials" else 0):
                raise TunekitError(f"a job's {name} must be an int >= {int(name == 'trials')}, but got {brief(value)}")
        if not isinstance(data.get("sampler"), str):
            raise TunekitError(f"a job's sampler must be a string, but got {brief(data.get('sampler'))}")
        timeout = data.get("timeout_s")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf")
        ):
            raise TunekitError(f"a job's timeout_s must be null or a positive number, but got {brief(timeout)}")
        return cls(data["kernel"], dict(problem), data["trials"], data["sampler"], data["seed"], timeout)

    def describe(self) -> str:
        return f"{self.kernel} " + ",".join(f"{k}={v}" for k, v in self.problem.items())


@dataclass
class JobStatus:
    """One job as the queue sees it: the state of its latest trial (done if any trial completed)."""

    job: Job
    state: str
    attempts: int
    worker: str = ""
    entry: Entry | None = None
    error: str = ""
    owner_gone: bool = False  # running, but its worker process is known to be gone (tunekit requeue --stale)
    trial_id: int | None = None  # the latest trial's (the one a requeue fails)


# --- storages ---------------------------------------------------------------------------------------------------


def is_journal(url: str) -> bool:
    """A URL names an RDB storage (sqlite:///f.db, postgresql://...); anything else is a journal file's path."""
    return "://" not in url


def open_storage(url: str, lease: Lease | None = None) -> BaseStorage:
    """Optuna's storage for `url`, with heartbeats and retried stale jobs (RDB storages) when `lease` is given."""
    if is_journal(url):
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        path = Path(url).expanduser()
        if not path.parent.is_dir():
            raise TunekitError(f"cannot open the journal storage {url}: {path.parent} is not a directory")
        return JournalStorage(JournalFileBackend(str(path)))
    sqlite = url.startswith("sqlite")
    kwargs: dict[str, Any] = {"engine_kwargs": {"connect_args": {"timeout": 60}}} if sqlite else {}
    with _quiet():
        if lease is not None:
            kwargs["heartbeat_interval"] = lease.heartbeat_s
            kwargs["grace_period"] = lease.timeout_s
            kwargs["heartbeat_stale_trial_callback"] = RetryHeartbeatStaleTrialCallback(max_retry=lease.max_retries)
        try:
            storage = RDBStorage(url, **kwargs)
        except (ImportError, ValueError, StorageInternalError, sqlalchemy.exc.SQLAlchemyError) as exc:
            why = f"{type(exc).__name__}: {exc}".splitlines()[0]
            raise TunekitError(f"cannot open the storage {url} ({why}); give a journal path or an RDB URL") from None
    if sqlite:
        _serialise_sqlite(storage)
    return storage


def _serialise_sqlite(storage: RDBStorage) -> None:
    """Make every transaction of this storage BEGIN IMMEDIATE (SQLAlchemy's recipe for pysqlite).

    Python's sqlite3 starts a transaction only at the first write, so Optuna's read-check-write pop of a WAITING
    trial is not atomic in SQLite (SELECT ... FOR UPDATE is a no-op there): two workers can both claim one job.
    Taking the write lock at BEGIN serialises the pops, as the row lock does in PostgreSQL.
    """

    def on_connect(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None  # the driver emits no BEGIN of its own

    def on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    sqlalchemy.event.listen(storage.engine, "connect", on_connect)
    sqlalchemy.event.listen(storage.engine, "begin", on_begin)
    storage.engine.dispose()  # connections opened before the listeners are dropped


@contextmanager
def _quiet() -> Iterator[None]:
    """Heartbeats and the retry callback are 'experimental' in Optuna 5.0: say nothing about it each time."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        yield


def queue_names(url: str) -> list[str]:
    """The queues in a storage."""
    storage = open_storage(url)
    return sorted(s.study_name[len(QUEUE_PREFIX) :] for s in storage.get_all_studies() if _is_queue(s.study_name))


def _is_queue(study_name: str) -> bool:
    return study_name.startswith(QUEUE_PREFIX)


# --- the queue --------------------------------------------------------------------------------------------------


class _Heartbeat:
    """Records the heartbeat of a claimed job every interval until stopped (Optuna's lease, kept by us)."""

    def __init__(self, storage: RDBStorage, trial_id: int, interval_s: int) -> None:
        self._storage, self._trial_id, self._interval = storage, trial_id, interval_s
        self._stop = threading.Event()
        storage.record_heartbeat(trial_id)  # at once: a job with no heartbeat at all is never found stale
        self._thread = threading.Thread(target=self._run, name=f"tunekit-heartbeat-{trial_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._storage.record_heartbeat(self._trial_id)
            except Exception as exc:  # the storage is unreachable for a moment: the lease may lapse, nothing else
                logger.warning("tunekit: heartbeat of job trial %s failed: %s", self._trial_id, exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Claim:
    """A job this worker holds: a RUNNING trial of the queue (with its heartbeat where the storage has leases)."""

    job: Job
    trial_id: int
    heartbeat: _Heartbeat | None = field(default=None, repr=False)

    def stop(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None


class JobQueue:
    """One queue of tuning jobs in an Optuna storage. Every method is safe to call from many processes."""

    def __init__(self, url: str, name: str = "default", lease: Lease | None = None, *, create: bool = True) -> None:
        if not name or any(c.isspace() for c in name):
            raise TunekitError(f"a queue name must be a non-empty word, but got {name!r}")
        self.url, self.name = url, name
        self.lease = None if is_journal(url) else (lease or Lease())
        self.max_retries = (lease or Lease()).max_retries  # also for jobs whose owner process is gone (journal)
        self.skipped: dict[str, str] = {}  # job id (or trial) -> why its job or result was unreadable (jobs())
        self.storage = open_storage(url, self.lease)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        if create:
            self.study = optuna.create_study(
                study_name=QUEUE_PREFIX + name, storage=self.storage, direction="minimize", load_if_exists=True
            )
        else:
            try:
                self.study = optuna.load_study(study_name=QUEUE_PREFIX + name, storage=self.storage)
            except KeyError:
                raise TunekitError(f"no queue {name!r} in {url}. Queues there: {queue_names(url)}") from None
        self.study_id = self.storage.get_study_id_from_name(QUEUE_PREFIX + name)

    @property
    def tuning_storage(self) -> str | None:
        """Where each job's tuning study goes: this storage (RDB), or nowhere for a journal (see module doc)."""
        return None if is_journal(self.url) else self.url

    def submit(self, jobs: Iterable[Job]) -> tuple[int, int]:
        """Enqueue the jobs not already queued, running or done (a failed job is queued again).

        Returns (added, skipped). Submit from one process at a time: two submitting the same job at once may
        both enqueue it.
        """
        busy = {s.job.id for s in self.jobs() if s.state != "failed"}
        added = skipped = 0
        for job in jobs:
            if job.id in busy:
                skipped += 1
                continue
            self.study.enqueue_trial({}, user_attrs={JOB_ATTR: job.to_json()})
            busy.add(job.id)
            added += 1
        return added, skipped

    def reap(self) -> list[Job]:
        """Queue again the jobs whose worker is gone; returns those re-queued here.

        RDB storages: a RUNNING job whose heartbeats stopped is failed and Optuna's retry callback enqueues a copy.
        Every storage (the journal's only way): a RUNNING job whose owner process is known to be gone
        (`owner_alive`), up to `max_retries` times per job.
        """
        if self.lease is not None:
            with _quiet():
                fail_stale_trials(self.study)
        return self.reclaim(max_retry=self.max_retries)

    def reclaim(self, max_retry: int | None) -> list[Job]:
        """Queue again every RUNNING job whose owner process is known to be gone (see `owner_alive`)."""
        requeued = []
        for trial in self.storage.get_all_trials(self.study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            trial_id = trial._trial_id
            owner = trial.user_attrs.get(OWNER_ATTR)
            if owner_alive(owner, trial_id) is not False:
                continue
            why = f"its worker process ({describe_owner(owner)}) is gone"
            if self._requeue(trial_id, why, max_retry):
                with suppress(TunekitError):
                    requeued.append(Job.from_json(trial.user_attrs.get(JOB_ATTR)))
        return requeued

    def requeue(self, job_id: str) -> Job:
        """Queue one running job again by (a prefix of) its id, as when its worker is gone.

        Refused when its worker is known to be alive on this machine (stop it first); otherwise safe even if the
        worker lives on elsewhere: the original trial is failed first, so it can never complete.
        """
        matches = [s for s in self.jobs() if s.job.id.startswith(job_id)]
        if len({s.job.id for s in matches}) != 1:
            known = [s.job.id[:12] for s in self.jobs() if s.state == "running"]
            what = "no job" if not matches else f"{len(matches)} jobs"
            raise TunekitError(f"{what} in queue {self.name!r} with an id starting {job_id!r}; running jobs: {known}")
        (status,) = matches
        if status.state != "running" or status.trial_id is None:
            hint = "; `tunekit tune --submit` queues a failed job again" if status.state == "failed" else ""
            raise TunekitError(
                f"job {status.job.id[:12]} ({status.job.describe()}) is {status.state}, not running{hint}"
            )
        trial = self.storage.get_trial(status.trial_id)
        owner = trial.user_attrs.get(OWNER_ATTR)
        if owner_alive(owner, status.trial_id):
            raise TunekitError(
                f"job {status.job.id[:12]} is held by a worker process that still runs ({describe_owner(owner)}): "
                "stop it (SIGTERM gives the job back) rather than re-queue the job"
            )
        if not self._requeue(status.trial_id, "re-queued by hand (tunekit requeue)", None):
            raise TunekitError(f"job {status.job.id[:12]} finished while being re-queued: nothing to do")
        return status.job

    def _requeue(self, trial_id: int, why: str, max_retry: int | None) -> bool:
        """Fail a RUNNING trial and enqueue a copy of its job (unless it was retried `max_retry` times already).

        Failing it is the atomic step: of several processes re-queueing one trial, one succeeds; the others, and
        the trial's own worker if it still runs, get UpdateFinishedTrialError. False when this call did not fail it.
        """
        with suppress(UpdateFinishedTrialError):
            self.storage.set_trial_user_attr(trial_id, ERROR_ATTR, why)
        try:
            if not self.storage.set_trial_state_values(trial_id, TrialState.FAIL):
                return False
        except UpdateFinishedTrialError:
            return False
        self._enqueue_copy(self.storage.get_trial(trial_id), max_retry)
        return True

    def _enqueue_copy(self, trial: FrozenTrial, max_retry: int | None) -> None:
        """What Optuna's RetryHeartbeatStaleTrialCallback does, keeping only the job: the failed attempt's worker,
        owner and error stay with it."""
        history = [*trial.system_attrs.get("retry_history", []), trial.number]
        if max_retry is not None and len(history) > max_retry:
            return
        system_attrs = {"failed_trial": trial.system_attrs.get("failed_trial", trial.number), "retry_history": history}
        self.study.add_trial(
            optuna.trial.create_trial(
                state=TrialState.WAITING, user_attrs={JOB_ATTR: trial.user_attrs[JOB_ATTR]}, system_attrs=system_attrs
            )
        )

    def claim(self, worker: str = "") -> Claim | None:
        """Take the oldest queued job (RUNNING from now on), or None when none is queued.

        A job attribute that is not a job (a hand-edited or foreign storage) fails that trial with the reason.
        """
        for trial in self.storage.get_all_trials(self.study_id, deepcopy=False, states=(TrialState.WAITING,)):
            if JOB_ATTR not in trial.user_attrs:
                continue
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, trial.number)
            try:
                if not self.storage.set_trial_state_values(trial_id, TrialState.RUNNING):
                    continue  # another worker took it first
            except UpdateFinishedTrialError:
                continue
            try:
                job = Job.from_json(trial.user_attrs[JOB_ATTR])
            except TunekitError as exc:
                logger.warning("tunekit: queue %s: trial %s holds no valid job (%s); failed", self.name, trial_id, exc)
                with suppress(UpdateFinishedTrialError):
                    self.storage.set_trial_user_attr(trial_id, ERROR_ATTR, f"malformed job: {exc}")
                    self.storage.set_trial_state_values(trial_id, TrialState.FAIL)
                continue
            claim = Claim(job, trial_id)
            if self.lease is not None:
                assert isinstance(self.storage, RDBStorage)
                claim.heartbeat = _Heartbeat(self.storage, trial_id, self.lease.heartbeat_s)
            self._set_attr(claim, OWNER_ATTR, owner_record(trial_id))
            if worker:
                self._set_attr(claim, WORKER_ATTR, worker)
            return claim
        return None

    def complete(self, claim: Claim, entry: Entry) -> bool:
        """Mark the job done with its result. False when its lease had lapsed (another worker has the job)."""
        try:
            self.storage.set_trial_user_attr(claim.trial_id, RESULT_ATTR, entry.to_json())
            self.storage.set_trial_state_values(claim.trial_id, TrialState.COMPLETE, [entry.time_ms])
            return True
        except UpdateFinishedTrialError:
            return False
        finally:
            claim.stop()

    def fail(self, claim: Claim, reason: str) -> bool:
        """Mark the job failed (it is not retried; submitting it again queues it again)."""
        try:
            self.storage.set_trial_user_attr(claim.trial_id, ERROR_ATTR, reason)
            self.storage.set_trial_state_values(claim.trial_id, TrialState.FAIL)
            return True
        except UpdateFinishedTrialError:
            return False
        finally:
            claim.stop()

    def release(self, claim: Claim) -> None:
        """Give the job back (the worker was interrupted): failed, and a copy queued as for a lapsed lease."""
        claim.stop()
        self._requeue(claim.trial_id, "its worker was interrupted and gave the job back", None)

    def _set_attr(self, claim: Claim, key: str, value: Any) -> None:
        with suppress(UpdateFinishedTrialError):
            self.storage.set_trial_user_attr(claim.trial_id, key, value)

    def jobs(self) -> list[JobStatus]:
        """Every job of the queue, in submission order.

        A job whose attribute is not a job, or whose result is not a valid entry, is reported (a warning naming
        the job id, and in `skipped`); the first is left out, the second shows without its result.
        """
        trials: dict[str, list[FrozenTrial]] = {}
        for trial in self.storage.get_all_trials(self.study_id, deepcopy=False):
            if JOB_ATTR in trial.user_attrs:
                data = trial.user_attrs[JOB_ATTR]
                job_id = data.get("id") if isinstance(data, dict) else None
                trials.setdefault(str(job_id) if isinstance(job_id, str) else f"(trial {trial.number})", []).append(
                    trial
                )
        statuses = []
        for job_id, group in trials.items():
            try:
                status = _status(group)
            except TunekitError as exc:
                self._skip(job_id, f"its job is unreadable ({exc}); left out")
                continue
            if status.error.startswith(_UNREADABLE_RESULT):
                self._skip(status.job.id, status.error + "; its result is left out")
            statuses.append(status)
        return statuses

    def _skip(self, job_id: str, why: str) -> None:
        if self.skipped.get(job_id) != why:
            self.skipped[job_id] = why
            logger.warning("tunekit: queue %s: job %s: %s", self.name, job_id, why)

    def any_running(self) -> bool:
        return bool(self.storage.get_all_trials(self.study_id, deepcopy=False, states=(TrialState.RUNNING,)))

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(STATES, 0)
        for status in self.jobs():
            counts[status.state] += 1
        return counts

    def entries(self) -> list[Entry]:
        return [s.entry for s in self.jobs() if s.entry is not None]


_UNREADABLE_RESULT = "unreadable result: "


def _status(trials: list[FrozenTrial]) -> JobStatus:
    """The job's status from its trials; TunekitError when its job attribute is not a job."""
    trials = sorted(trials, key=lambda t: t.number)
    done = next((t for t in trials if t.state == TrialState.COMPLETE), None)
    latest = done or trials[-1]
    job = Job.from_json(latest.user_attrs[JOB_ATTR])
    state = {
        TrialState.WAITING: "queued",
        TrialState.RUNNING: "running",
        TrialState.COMPLETE: "done",
    }.get(latest.state, "failed")
    entry, error = None, ""
    if done is not None:
        try:
            entry = result_entry(done.user_attrs.get(RESULT_ATTR))
        except TunekitError as exc:
            error = _UNREADABLE_RESULT + str(exc)
    elif state == "failed":
        error = str(latest.user_attrs.get(ERROR_ATTR, "its worker stopped sending heartbeats, too many times"))
    return JobStatus(
        job=job,
        state=state,
        attempts=sum(t.state != TrialState.WAITING for t in trials),
        worker=str(latest.user_attrs.get(WORKER_ATTR, "")) if state != "queued" else "",
        entry=entry,
        error=error,
        owner_gone=state == "running" and owner_alive(latest.user_attrs.get(OWNER_ATTR), latest._trial_id) is False,
        trial_id=latest._trial_id,
    )


def result_entry(result: Any) -> Entry:
    """A job's result attribute as a cache entry, checked as an imported database entry is (TunekitError if not)."""
    from tunekit.store.database import validate_entry

    if not isinstance(result, dict):
        raise TunekitError(f"a result must be a cache entry (an object), but got {brief(result)}")
    return validate_entry(result, where="result")


def export_entries(
    url: str, kernel: str | None = None, device_key: str | None = None, skipped: dict[str, str] | None = None
) -> list[Entry]:
    """Every result in the storage (all queues), one entry per cache key (merged: the faster best is kept).

    A job whose job or result attribute is unreadable is left out with a warning naming its id (and added to
    `skipped`: job id -> why); every other result is exported.
    """
    merged: dict[Any, Entry] = {}
    for name in queue_names(url):
        queue = JobQueue(url, name, create=False)
        entries = queue.entries()
        if skipped is not None:
            skipped.update(queue.skipped)
        for entry in entries:
            if kernel not in (None, entry.key.kernel) or device_key not in (None, entry.key.device_key):
                continue
            old = merged.get(entry.key)
            merged[entry.key] = entry if old is None else merge_entries(old, entry)
    return list(merged.values())


# --- plans ------------------------------------------------------------------------------------------------------


def check_problem(spec: KernelSpec, problem: Any) -> dict[str, Value]:
    """A problem dict with exactly the spec's fields, each a string, bool or int."""
    if not isinstance(problem, dict) or sorted(problem) != sorted(spec.problem_fields):
        got = sorted(problem) if isinstance(problem, dict) else type(problem).__name__
        raise TunekitError(f"a {spec.name} problem has exactly the fields {sorted(spec.problem_fields)}, but got {got}")
    for name, value in problem.items():
        if not isinstance(value, (str, bool, int)):
            raise TunekitError(f"{spec.name} problem field {name!r} must be a string, bool or int, but got {value!r}")
    return dict(problem)


def _shape(value: Any) -> tuple[int, ...]:
    if isinstance(value, str):
        parts: list[Any] = value.lower().replace("*", "x").split("x")
        try:
            parts = [int(p) for p in parts]
        except ValueError:
            parts = []
    else:
        parts = value if isinstance(value, list) else []
    if not parts or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in parts):
        raise InvalidShapeError(f"'shape' must be positive integers, as a list or joined by 'x', but got {value!r}")
    return tuple(parts)


def plan_item(data: Any) -> tuple[str, dict[str, Value]]:
    """(kernel, problem) from one plan item: {"kernel", "problem": {...}} or {"kernel", "shape", "dtype"}."""
    from tunekit.core.registry import get_spec

    if not isinstance(data, dict) or not isinstance(data.get("kernel"), str):
        raise TunekitError('each item must be an object with a "kernel" name')
    spec = get_spec(data["kernel"])
    extra = sorted(set(data) - {"kernel", "problem", "shape", "dtype"})
    if extra:
        raise TunekitError(f'unknown fields {extra}: an item has "kernel" and "problem", or "shape" and "dtype"')
    if "problem" in data:
        if "shape" in data or "dtype" in data:
            raise TunekitError('give "problem", or "shape" and "dtype", not both')
        return spec.name, check_problem(spec, data["problem"])
    if "shape" not in data or not isinstance(data.get("dtype"), str):
        raise TunekitError(f'give "problem", or "shape" ({spec.shape_help or "see tunekit show"}) and a "dtype" string')
    return spec.name, check_problem(spec, spec.problem_from_shape(_shape(data["shape"]), data["dtype"]))


def read_plan(path: Path) -> list[tuple[str, dict[str, Value]]]:
    """A plan file: JSON lines (blank and '#' lines skipped) or one JSON list. Duplicates are dropped."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TunekitError(f"cannot read the plan {path}: {exc}") from None
    items: list[tuple[int, Any]] = []
    if text.lstrip().startswith("["):
        try:
            items = list(enumerate(json.loads(text), 1))
        except ValueError as exc:
            raise TunekitError(f"{path} is not valid JSON: {exc}") from None
        where = "item"
    else:
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip() and not line.lstrip().startswith("#"):
                try:
                    items.append((number, json.loads(line)))
                except ValueError as exc:
                    raise TunekitError(f"{path} line {number}: not valid JSON: {exc}") from None
        where = "line"
    plan: dict[str, tuple[str, dict[str, Value]]] = {}
    for number, data in items:
        try:
            kernel, problem = plan_item(data)
        except TunekitError as exc:
            raise type(exc)(f"{path} {where} {number}: {exc}") from None
        plan.setdefault(plan_line(kernel, problem), (kernel, problem))
    if not plan:
        raise TunekitError(f"{path} holds no problems")
    return list(plan.values())


# --- the worker -------------------------------------------------------------------------------------------------


PHASES = ("claim", "setup", "measure", "search", "cache", "queue")


@dataclass
class JobTimes:
    """Where one job's seconds went in the worker that ran it (wall clock, seconds)."""

    job: str = ""
    outcome: str = ""  # done, failed or lost
    claim: float = 0.0  # reaping stale jobs and claiming this one: storage transactions
    setup: float = 0.0  # the bench for this problem: an isolation worker started or switched, inputs built
    measure: float = 0.0  # candidates compiled, verified and timed (the bench's own time)
    search: float = 0.0  # the rest of tune(): the sampler and the job's tuning study in the storage
    cache: float = 0.0  # this machine's device-keyed cache, written after every measurement and at the end
    queue: float = 0.0  # the result (or failure) written to the queue
    bench_pid: int | None = None  # the isolation worker that measured the job; None in this process

    def describe(self) -> str:
        return ", ".join(f"{name} {getattr(self, name):.2f}" for name in PHASES[1:]) + " s"


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
            totals[name] = sum(getattr(t, name) for t in self.jobs)
        totals |= {"idle": self.idle_s, "wall": self.boot_s + self.wall_s}
        totals = {k: round(float(v), 3) for k, v in totals.items()}
        return totals | {"jobs": len(self.jobs), "bench_started": self.bench_started}


class WorkerBench:
    """Where a worker's jobs are measured, for the worker's lifetime.

    Isolated (on a GPU, as tune() decides, or forced with `isolate=True`): one isolation worker process serves every
    job, switched to each job's problem, so torch, Triton, the CUDA context and Triton's compiled kernels cost once
    per worker rather than once per job. Otherwise candidates run in this process, as tune() would run them.
    """

    def __init__(self, timer: Timer | None = None, isolate: bool | None = None) -> None:
        from tunekit.tuning.bench import default_timer
        from tunekit.tuning.tuner import TuneOptions, _isolation

        self.timer = timer or default_timer()
        options = TuneOptions(isolate=isolate)
        self.candidate_timeout_s = options.candidate_timeout_s
        self._described = _isolation(options, self.timer)  # the timer as the worker rebuilds it; None: in-process
        self.isolated: IsolatedBench | None = None
        self._spawned: Spawned | None = None
        if self._described is not None:
            from tunekit.tuning.isolation import prespawn

            # Started now, the isolation worker's interpreter, imports and CUDA context (seconds) overlap the
            # queue, the cache and the first claim instead of following them.
            self._spawned = prespawn()

    def open(self, spec: KernelSpec, problem: dict[str, Value], seed: int) -> Bench:
        """The bench for one job, ready to measure (a load failure raises TunekitError: the job's failure)."""
        from tunekit.tuning.tuner import InProcessBench

        if self._described is None:
            return InProcessBench(spec, problem, seed, self.timer)
        if self.isolated is None:
            from tunekit.tuning.isolation import IsolatedBench

            self.isolated = IsolatedBench(
                spec,
                problem,
                seed,
                self._described,
                self.candidate_timeout_s,
                label=self.timer.label,
                spawned=self._spawned,
            )
            self._spawned = None
        else:
            self.isolated.retarget(spec, problem, seed, timer=self._described, label=self.timer.label)
        self.isolated.start()
        return self.isolated

    @property
    def started(self) -> int:
        return self.isolated.started if self.isolated is not None else int(self._spawned is not None)

    @property
    def restarts(self) -> int:
        return self.isolated.restarts if self.isolated is not None else 0

    def close(self) -> None:
        if self._spawned is not None:  # no job came
            self._spawned.close()
            self._spawned = None
        if self.isolated is not None:
            self.isolated.close()


class _TimedBench:
    """A bench that adds up the seconds spent in it: a job's `measure` phase."""

    def __init__(self, inner: Bench) -> None:
        self.inner = inner
        self.label = inner.label
        self.seconds = 0.0

    def measure(self, config: Config, verify_seed: int) -> TrialRecord:
        start = time.perf_counter()
        try:
            return self.inner.measure(config, verify_seed)
        finally:
            self.seconds += time.perf_counter() - start

    def retime(self, config: Config) -> TrialRecord:
        start = time.perf_counter()
        try:
            return self.inner.retime(config)
        finally:
            self.seconds += time.perf_counter() - start


def run_job(
    job: Job,
    store: Store,
    tuning_storage: str | None,
    bench: WorkerBench | None = None,
    times: JobTimes | None = None,
) -> tuple[Entry, TuneReport]:
    """Tune one job on this process's device; the result is merged into `store` (the device-keyed cache).

    `bench` is the worker's (reused across jobs); without one, a bench is made for this job and closed after it.
    `times` receives the job's setup, measure, search and cache phases.
    """
    from tunekit.core.device import fingerprint
    from tunekit.core.registry import get_spec
    from tunekit.store.key import CacheKey
    from tunekit.tuning.tuner import TuneOptions, tune

    times = times if times is not None else JobTimes()
    benches = bench if bench is not None else WorkerBench()
    try:
        spec = get_spec(job.kernel)
        problem = check_problem(spec, job.problem)
        device = fingerprint()
        options = TuneOptions(
            trials=job.trials, timeout_s=job.timeout_s, sampler=job.sampler, seed=job.seed, storage=tuning_storage
        )
        key = CacheKey.make(spec.name, spec.source_hash, device.key, problem)
        cache_s = 0.0

        def put(entry: Entry) -> Entry:
            nonlocal cache_s
            start = time.perf_counter()
            try:
                return store.put(entry)
            finally:
                cache_s += time.perf_counter() - start

        started = time.perf_counter()
        measured = _TimedBench(benches.open(spec, problem, job.seed))
        times.setup = time.perf_counter() - started
        times.bench_pid = benches.isolated.pid if benches.isolated is not None else None
        restarts = benches.restarts
        started = time.perf_counter()
        try:
            report = tune(
                spec,
                problem,
                device,
                options,
                timer=benches.timer,
                previous=store.get(key),
                warm_start=store.related(key),
                tuned=[e for e in store.entries() if e.key.scope == key.scope],
                checkpoint=put,
                bench=measured,
            )
        finally:
            times.measure, times.cache = measured.seconds, cache_s
            times.search = time.perf_counter() - started - measured.seconds - cache_s
        report.isolated = benches.isolated is not None
        report.restarts = benches.restarts - restarts
        entry = put(report.entry)
        times.cache = cache_s
        return entry, report
    finally:
        if bench is None:
            benches.close()


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
) -> WorkerReport:
    """Claim, tune and complete jobs until none is queued or running (or `max_jobs` were taken).

    With leases, an idle worker keeps polling while other workers' jobs run: a job whose worker dies comes back.
    Candidates run as tune() would run them (isolated on a GPU; `isolate` as TuneOptions.isolate), but one
    isolation worker process serves all the jobs (WorkerBench). `timer` defaults to the device's.
    The report (and the last line said) holds each phase's seconds.
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
    bench = WorkerBench(timer, isolate)
    try:
        with Store() as store:
            report.open_s = time.perf_counter() - began
            while max_jobs is None or report.done + report.failed + report.lost < max_jobs:
                started = time.perf_counter()
                q.reap()
                claim = q.claim(me)
                if claim is None:
                    if q.lease is not None and q.any_running():
                        time.sleep(_IDLE_POLL_S)  # short: the last job's end is also when every worker may exit
                        report.idle_s += time.perf_counter() - started
                        continue
                    break
                times = JobTimes(job=claim.job.describe(), claim=time.perf_counter() - started)
                report.jobs.append(times)
                _run_claimed(q, claim, store, bench, times, report, say)
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
    bench: WorkerBench,
    times: JobTimes,
    report: WorkerReport,
    say: Callable[[str], None],
) -> None:
    """Tune a claimed job and record its outcome in the queue (and its phases in `times`)."""
    start = time.monotonic()
    try:
        entry, tuned = run_job(claim.job, store, q.tuning_storage, bench, times)
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


def run_workers(n: int, url: str, queue: str = "default", lease: Lease | None = None) -> list[int]:
    """Run `n` worker processes here (worker i on GPU i, round robin), wait for all; their exit statuses.

    Interrupted (Ctrl-C), the workers still running are sent SIGTERM: each gives its job back to the queue.
    """
    lease = lease or Lease()
    slots = gpu_slots()
    command = [sys.executable, "-m", "tunekit.cli", "worker", "--storage", url, "--queue", queue]
    command += ["--heartbeat", str(lease.heartbeat_s), "--lease", str(lease.timeout_s)]
    command += ["--max-retries", str(lease.max_retries)]
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
