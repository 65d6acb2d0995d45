"""A job a worker holds (`Claim`): its RUNNING trial, and where the storage has leases the thread keeping its
heartbeat."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from optuna.storages import RDBStorage

from tunekit.fleet.jobs import Job

logger = logging.getLogger("tunekit")


class Heartbeat:
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
    heartbeat: Heartbeat | None = field(default=None, repr=False)

    def stop(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None
