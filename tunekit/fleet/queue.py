"""The job queue: jobs as trials of one Optuna study per queue, claimed, leased, completed with their entries and
exported (the design: tunekit.fleet's docstring). A job and its status: tunekit.fleet.jobs; a held job:
tunekit.fleet.claims."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import suppress
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import RDBStorage, fail_stale_trials
from optuna.trial import FrozenTrial, TrialState

from tunekit.core.errors import TunekitError
from tunekit.fleet.claims import Claim, Heartbeat
from tunekit.fleet.jobs import (
    ERROR_ATTR,
    JOB_ATTR,
    OWNER_ATTR,
    RESULT_ATTR,
    STATES,
    UNREADABLE_RESULT,
    WORKER_ATTR,
    Job,
    JobStatus,
    job_status,
)
from tunekit.fleet.owner import describe_owner, owner_alive, owner_record
from tunekit.store.entry import Entry, merge_entries
from tunekit.tuning.storage import Lease, is_journal, open_storage, quiet_experimental

logger = logging.getLogger("tunekit")

QUEUE_PREFIX = "tunekit:jobs:"
IDLE_POLL_S = 1.0


# --- storages ---------------------------------------------------------------------------------------------------


def queue_names(url: str) -> list[str]:
    """The queues in a storage."""
    storage = open_storage(url)
    return sorted(s.study_name[len(QUEUE_PREFIX) :] for s in storage.get_all_studies() if _is_queue(s.study_name))


def _is_queue(study_name: str) -> bool:
    return study_name.startswith(QUEUE_PREFIX)


# --- the queue --------------------------------------------------------------------------------------------------


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
            with quiet_experimental():
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
                claim.heartbeat = Heartbeat(self.storage, trial_id, self.lease.heartbeat_s)
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
                status = job_status(group)
            except TunekitError as exc:
                self._skip(job_id, f"its job is unreadable ({exc}); left out")
                continue
            if status.error.startswith(UNREADABLE_RESULT):
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
