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
