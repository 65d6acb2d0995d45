"""Optuna storages, opened one way for the tuner's studies and the fleet's queues: journal files, RDB URLs (SQLite
with serialised transactions), heartbeats and retried stale trials where a lease is given."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy.exc
from optuna.exceptions import ExperimentalWarning, StorageInternalError
from optuna.storages import BaseStorage, RDBStorage, RetryHeartbeatStaleTrialCallback

from tunekit.core.errors import TunekitError


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
    with quiet_experimental():
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
def quiet_experimental() -> Iterator[None]:
    """Heartbeats and the retry callback are 'experimental' in Optuna 5.0: say nothing about it each time."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        yield
