"""A tuning job as a queue holds it: the job (what a trial's `tunekit:job` attribute stores), the attributes a worker
writes on its trial, and the job's status read back from its trials (tunekit.fleet.queue keeps the trials)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tunekit.core.canonical import digest
from tunekit.core.errors import TunekitError
from tunekit.core.render import brief
from tunekit.core.space import Value
from tunekit.fleet.owner import owner_alive
from tunekit.store.entry import Entry

JOB_ATTR = "tunekit:job"
RESULT_ATTR = "tunekit:result"
ERROR_ATTR = "tunekit:error"
WORKER_ATTR = "tunekit:worker"
OWNER_ATTR = "tunekit:owner"
STATES = ("queued", "running", "done", "failed")
UNREADABLE_RESULT = "unreadable result: "  # how a job's status error starts when its result is not an entry


@dataclass(frozen=True)
class Job:
    kernel: str
    problem: dict[str, Value]
    trials: int = 30
    sampler: str = "tpe"
    seed: int = 0
    timeout_s: float | None = None
    early_stop: float | None = None  # TuneOptions.early_stop: the model's stopping rule at this relative noise

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
        } | ({"early_stop": self.early_stop} if self.early_stop is not None else {})  # ids of older jobs unchanged

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
        stop = data.get("early_stop")
        if stop is not None and (isinstance(stop, bool) or not isinstance(stop, (int, float)) or not 0 <= stop < 1):
            raise TunekitError(f"a job's early_stop must be null or a number in [0, 1), but got {brief(stop)}")
        return cls(data["kernel"], dict(problem), data["trials"], data["sampler"], data["seed"], timeout, stop)

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


def job_status(trials: list[FrozenTrial]) -> JobStatus:
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
            error = UNREADABLE_RESULT + str(exc)
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
