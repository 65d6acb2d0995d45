"""Tuning at fleet scale (tunekit.fleet): a job queue in an Optuna storage, worker processes, leases, plans.

Every storage kind runs the same tests: SQLite and a journal file always; PostgreSQL when TUNEKIT_TEST_POSTGRES_URL
names a server (.ci/run starts one), each test in a fresh database. Workers are real processes (`tunekit worker`)
tuning the toy kernel in the interpreter; they find it through TUNEKIT_EXTRA_KERNELS and PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import optuna
import pytest
from helpers import TESTS, cli
from toy_kernel import PlantedTimer

from tunekit.core.errors import TunekitError
from tunekit.fleet.jobs import ERROR_ATTR, JOB_ATTR, OWNER_ATTR, RESULT_ATTR, Job
from tunekit.fleet.owner import owner_record
from tunekit.fleet.plans import read_plan
from tunekit.fleet.queue import QUEUE_PREFIX, JobQueue
from tunekit.fleet.workers import interleave_kernels, run_job, work
from tunekit.runtime.dispatch import dispatcher
from tunekit.runtime.recorder import record_problems
from tunekit.store.store import Store
from tunekit.tuning.storage import Lease, open_storage

POSTGRES = os.environ.get("TUNEKIT_TEST_POSTGRES_URL")
NO_POSTGRES = "TUNEKIT_TEST_POSTGRES_URL is not set (.ci/run starts a PostgreSQL server and sets it)"
LEASE = Lease(heartbeat_s=1, timeout_s=3, max_retries=2)  # short, so a killed worker's job returns in seconds
SHAPES = ["8x32", "4x16", "8x8", "2x64", "8x16", "4x32"]
HANG_FIRST = json.dumps({"1/a/1": "hang"})  # the toy heuristic, which every job measures first


@pytest.fixture(autouse=True)
def worker_environment(toy, monkeypatch):
    """Worker processes inherit this: the toy kernel registered, a wide terminal, this test's cache directory."""
    monkeypatch.setenv("TUNEKIT_EXTRA_KERNELS", "toy=toy_kernel")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("COLUMNS", "250")


@pytest.fixture
def fresh_postgres():
    """A new, empty database on the test server, dropped afterwards."""
    if not POSTGRES:
        pytest.skip(NO_POSTGRES)
    import sqlalchemy

    admin = sqlalchemy.create_engine(POSTGRES, isolation_level="AUTOCOMMIT")
    name = f"tunekit_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {name}")
    yield str(sqlalchemy.engine.make_url(POSTGRES).set(database=name).render_as_string(hide_password=False))
    with admin.connect() as conn:
        conn.exec_driver_sql(f"DROP DATABASE {name} WITH (FORCE)")
    admin.dispose()


def _url(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'fleet.db'}"
    if kind == "journal":
        return str(tmp_path / "fleet.journal")
    return str(request.getfixturevalue("fresh_postgres"))


@pytest.fixture(params=["sqlite", "journal", "postgres"])
def any_storage(request, tmp_path):
    return _url(request.param, tmp_path, request)


@pytest.fixture(params=["sqlite", "postgres"])
def leased_storage(request, tmp_path):
    """Storages with leases (Optuna's heartbeats: RDB storages only)."""
    return _url(request.param, tmp_path, request)


def submit(url: str, shapes=SHAPES) -> None:
    args = ["-k", "toy", "--trials", "4", "--sampler", "random", "--storage", url, "--submit"]
    result = cli("tune", *args, *[a for s in shapes for a in ("-s", s)])
    assert result.exit_code == 0, result.output
    assert f"{len(shapes)} jobs queued" in result.output


def start_worker(url: str, log: Path, faults: str | None = None) -> subprocess.Popen:
    env = dict(os.environ)
    if faults:
        env["TOY_FAULTS"] = faults
    args = ["--storage", url, "--heartbeat", str(LEASE.heartbeat_s), "--lease", str(LEASE.timeout_s)]
    command = [sys.executable, "-m", "tunekit.cli", "worker", *args]
    return subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def wait_all(procs: list[subprocess.Popen], timeout: float = 90) -> list[int]:
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def start_victim(url: str, tmp_path: Path) -> tuple[subprocess.Popen, JobQueue]:
    """The jobs submitted and a worker that took one and hangs in its first measurement (heartbeats going)."""
    submit(url)
    victim = start_worker(url, tmp_path / "victim.log", faults=HANG_FIRST)
    queue = JobQueue(url)
    wait_until(lambda: queue.counts()["running"] == 1, what="the victim to take a job")
    time.sleep(1.0)
    return victim, queue


def wait_until(condition, timeout: float = 60, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def completions(url: str) -> Counter:
    """COMPLETE trials per job id, read straight from Optuna (not through tunekit.fleet's own bookkeeping)."""
    study = optuna.load_study(study_name=QUEUE_PREFIX + "default", storage=open_storage(url))
    return Counter(
        t.user_attrs[JOB_ATTR]["id"] for t in study.get_trials() if t.state == optuna.trial.TrialState.COMPLETE
    )


def check_export(url: str, tmp_path: Path, expected: int, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "fleet-db.json"
    result = cli("export", "--storage", url, "--out", str(out))
    assert result.exit_code == 0 and f"exported {expected} entries" in result.output, result.output
    entries = json.loads(out.read_text())["entries"]
    assert sorted(e["key"]["problem"]["cols"] for e in entries) == sorted(int(s.split("x")[1]) for s in SHAPES)
    # the export is a valid database: it imports (into a fresh cache)
    monkeypatch.setenv("TUNEKIT_CACHE_DIR", str(tmp_path / "imported"))
    result = cli("import", str(out))
    assert result.exit_code == 0 and f"{expected} entries read" in result.output, result.output


def done_lines(log: Path) -> int:
    return len(re.findall(r": done in ", log.read_text()))


def test_workers_do_every_job_exactly_once(any_storage, tmp_path, monkeypatch):
    url = any_storage
    submit(any_storage)
    logs = [tmp_path / f"worker{i}.log" for i in range(3)]
    exits = wait_all([start_worker(any_storage, log) for log in logs])
    assert exits == [0, 0, 0], "\n".join(log.read_text() for log in logs)
    assert sum(done_lines(log) for log in logs) == len(SHAPES)  # each job tuned by exactly one worker
    done = completions(any_storage)
    assert len(done) == len(SHAPES) and set(done.values()) == {1}
    status = cli("status", "--storage", any_storage, "--jobs")
    assert status.exit_code == 0
    assert re.search(r"default\s*│\s*0\s*│\s*0\s*│\s*6\s*│\s*0", status.output), status.output
    with Store() as store:  # each result also went to the worker's device-keyed cache
        assert len(store) == len(SHAPES)
    check_export(any_storage, tmp_path, len(SHAPES), monkeypatch)
    again = cli("tune", "-k", "toy", "-s", "8x32", "--trials", "4", "--sampler", "random", "--submit", "--storage", url)
    assert "0 jobs queued, 1 already queued, running or done" in again.output


def test_a_killed_workers_job_is_finished_by_another(leased_storage, tmp_path, monkeypatch):
    victim, queue = start_victim(leased_storage, tmp_path)
    victim.kill()
    victim.wait()
    helper = start_worker(leased_storage, tmp_path / "helper.log")
    assert wait_all([helper]) == [0], (tmp_path / "helper.log").read_text()
    statuses = queue.jobs()
    assert [s.state for s in statuses] == ["done"] * len(SHAPES)
    assert sorted(s.attempts for s in statuses) == [1] * (len(SHAPES) - 1) + [2]  # the killed job, retried once
    assert done_lines(tmp_path / "helper.log") == len(SHAPES)
    done = completions(leased_storage)
    assert len(done) == len(SHAPES) and set(done.values()) == {1}
    check_export(leased_storage, tmp_path, len(SHAPES), monkeypatch)


def test_an_interrupted_worker_gives_its_job_back(tmp_path):
    """SIGTERM (and Ctrl-C) hand the job back at once; the journal, which has no leases, relies on it."""
    url = str(tmp_path / "fleet.journal")
    victim, queue = start_victim(url, tmp_path)
    victim.send_signal(signal.SIGTERM)
    assert victim.wait(timeout=30) == 130
    assert queue.counts() == {"queued": len(SHAPES), "running": 0, "done": 0, "failed": 0}
    assert wait_all([start_worker(url, tmp_path / "helper.log")]) == [0]
    done = completions(url)
    assert len(done) == len(SHAPES) and set(done.values()) == {1}


def test_a_stalled_worker_cannot_complete_a_job_handed_on(leased_storage, toy):
    """The lease lapses while worker A stalls: its job is queued again and B does it; A's late result is refused."""
    queue_a, queue_b = JobQueue(leased_storage, lease=LEASE), JobQueue(leased_storage, lease=LEASE)
    job = Job("toy", {"rows": 8, "cols": 32, "dtype": "float32"}, trials=3, sampler="random")
    assert queue_a.submit([job, job]) == (1, 1)
    a = queue_a.claim("A")
    assert a is not None and a.job == job
    a.stop()  # A stalls: no more heartbeats
    queue_b.reap()
    assert queue_b.counts()["running"] == 1  # not stale yet
    time.sleep(LEASE.timeout_s + 1.5)
    queue_b.reap()
    assert queue_b.counts() == {"queued": 1, "running": 0, "done": 0, "failed": 0}
    b = queue_b.claim("B")
    assert b is not None and b.job == job
    with Store() as store:
        entry, _ = run_job(b.job, store, queue_b.tuning_storage)
    assert queue_a.complete(a, entry) is False  # the original can never complete now
    assert queue_b.complete(b, entry) is True
    assert queue_b.claim("C") is None
    (status,) = queue_b.jobs()
    assert (status.state, status.attempts, status.worker, status.entry) == ("done", 2, "B", entry)
    assert completions(leased_storage) == Counter({job.id: 1})


def test_tune_workers_runs_local_workers(tmp_path):
    shapes = [a for s in SHAPES[:4] for a in ("-s", s)]
    result = cli("tune", "-k", "toy", *shapes, "--trials", "3", "--sampler", "random", "--workers", "2")
    assert result.exit_code == 0, result.output
    assert "4 jobs queued" in result.output and "4 jobs on 2 workers" in result.output
    assert len(re.findall(r"│ done\s*│", result.output)) == 4
    with Store() as store:
        assert len(store) == 4
    rerun = cli("tune", "-k", "toy", *shapes, "--trials", "3", "--sampler", "random", "--workers", "1")
    assert rerun.exit_code == 0 and "0 jobs queued, 4 already" in rerun.output
    # the default local queue keeps no tuning study per job (the shared cache resumes a job); a --storage does
    from tunekit.cli.fleet import default_queue_url

    assert optuna.get_all_study_names(default_queue_url()) == [QUEUE_PREFIX + "default"]
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    shared = cli("tune", "-k", "toy", "-s", SHAPES[4], "--trials", "2", "--workers", "1", "--storage", url)
    assert shared.exit_code == 0, shared.output
    assert len(optuna.get_all_study_names(url)) == 2  # the queue and the job's tuning study


def test_a_job_that_cannot_be_tuned_fails_with_its_reason(tmp_path):
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    queue = JobQueue(url)
    queue.submit([Job("toy", {"rows": 8, "cols": 32}, trials=2)])  # a problem without its dtype field
    assert wait_all([start_worker(url, tmp_path / "w.log")]) == [0]
    (status,) = queue.jobs()
    assert status.state == "failed" and "exactly the fields ['cols', 'dtype', 'rows']" in status.error
    result = cli("status", "--storage", url, "--jobs")
    assert "failed" in result.output and "exactly the fields" in result.output


def _toy_jobs(n: int) -> list[Job]:
    return [
        Job("toy", {"rows": int(r), "cols": int(c), "dtype": "float32"}, trials=4, sampler="random")
        for r, c in (s.split("x") for s in SHAPES[:n])
    ]


def test_a_worker_measures_every_job_in_one_isolation_process(tmp_path, monkeypatch):
    """work(isolate=True), here in the interpreter as on a GPU: one isolation worker process (one pid, started
    once) serves every job, switched to each problem; the results are those of the in-process path."""
    jobs = _toy_jobs(3)
    runs = {}
    for isolate in (True, False):
        url = f"sqlite:///{tmp_path / f'fleet-{isolate}.db'}"
        monkeypatch.setenv("TUNEKIT_CACHE_DIR", str(tmp_path / f"cache-{isolate}"))  # nothing reused across runs
        JobQueue(url).submit(jobs)
        said: list[str] = []
        report = work(url, isolate=isolate, timer=PlantedTimer(), say=said.append)
        entries = {json.dumps(e.key.to_json(), sort_keys=True): e for e in JobQueue(url).entries()}
        runs[isolate] = report, said, entries
    (reused, said, got), (plain, _, want) = runs[True], runs[False]
    assert reused.done == plain.done == len(jobs)
    (pid,) = {t.bench_pid for t in reused.jobs}
    assert pid is not None and pid != os.getpid() and reused.bench_started == 1
    with pytest.raises(ProcessLookupError):  # closed with the worker
        os.kill(pid, 0)
    assert {t.bench_pid for t in plain.jobs} == {None} and plain.bench_started == 0
    assert got.keys() == want.keys()
    for key, entry in got.items():
        assert entry.config == want[key].config and entry.time_ms == want[key].time_ms
        assert [r.to_json() for r in entry.trials] == [r.to_json() for r in want[key].trials]
    startup = [t.problem.seconds["startup"] for t in reused.jobs]
    assert startup[0] > max(startup[1:])  # started once, then only switched
    phases = json.loads(next(line for line in said if ": phases (s) " in line).split(": phases (s) ", 1)[1])
    assert (phases["jobs"], phases["bench_started"]) == (3, 1) and phases["bench"] > 0 and phases["compile"] > 0
    assert all(": done in " in line and "startup " in line for line in said if "rows=" in line)


def test_a_worker_with_no_job_stops_the_isolation_process_it_started_ahead(tmp_path):
    """The isolation process is started when the worker starts (its start-up overlaps the first claim); with
    nothing to claim it is stopped again."""
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    JobQueue(url)
    report = work(url, isolate=True, timer=PlantedTimer(), say=lambda line: None)
    assert (report.done, report.bench_started) == (0, 1)
    assert _children(os.getpid()) == []


def test_jobs_are_queued_round_robin_over_kernels():
    """Workers claim in queue order: interleaved, workers that start together start on different kernels."""
    jobs = [Job(k, {"rows": r, "cols": 8, "dtype": "float32"}) for k, r in [("a", 1), ("a", 2), ("a", 3), ("b", 1)]]
    jobs += [Job("c", {"rows": 1, "cols": 8, "dtype": "float32"}), Job("b", {"rows": 2, "cols": 8, "dtype": "float32"})]
    got = [(j.kernel, j.problem["rows"]) for j in interleave_kernels(jobs)]
    assert got == [("a", 1), ("b", 1), ("c", 1), ("a", 2), ("b", 2), ("a", 3)]
    assert interleave_kernels([]) == []


def test_an_interrupted_worker_closes_its_isolation_process(tmp_path, monkeypatch):
    """Ctrl-C (SIGTERM is made the same) mid-candidate: the job goes back to the queue, the process is killed."""
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    queue = JobQueue(url)
    queue.submit(_toy_jobs(2))
    children: list[int] = []

    def interrupt(signum, frame):
        children.extend(_children(os.getpid()))
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 5.0)  # the worker has started and hangs in the first candidate
    monkeypatch.setenv("TOY_FAULTS", HANG_FIRST)  # the isolation worker inherits it
    try:
        with pytest.raises(KeyboardInterrupt):
            work(url, isolate=True, timer=PlantedTimer(), say=lambda line: None)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert children, "no isolation worker was running"
    for pid in children:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert queue.counts() == {"queued": 2, "running": 0, "done": 0, "failed": 0}


def _children(pid: int) -> list[int]:
    """Live isolation workers started by `pid` (other children, e.g. multiprocessing's resource tracker left by
    earlier tests in the same session, are not this test's business)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z" and b"tunekit.tuning.isolation" in cmdline:
            found.append(int(stat.parent.name))
    return found


# --- plans and the recorder -------------------------------------------------------------------------------------


def test_plan_is_written_listed_and_read(tmp_path):
    path = tmp_path / "plan.jsonl"
    result = cli("plan", str(path), "-k", "toy", "-s", "8x32", "-s", "3x16", "--dtype", "float32", "--dtype", "float16")
    assert result.exit_code == 0 and "wrote 4 problems" in result.output, result.output
    listed = cli("plan", str(path))
    assert listed.exit_code == 0 and "4 problems in" in listed.output
    assert "toy rows=4 cols=16 dtype=float16" in listed.output
    hand = tmp_path / "hand.jsonl"
    hand.write_text(
        "# by hand\n"
        '{"kernel": "toy", "shape": [8, 32], "dtype": "float32"}\n'
        "\n"
        '{"kernel": "toy", "shape": "8x32", "dtype": "float32"}\n'
        '{"kernel": "toy", "problem": {"rows": 2, "cols": 5, "dtype": "float32"}}\n'
    )
    assert read_plan(hand) == [
        ("toy", {"rows": 8, "cols": 32, "dtype": "float32"}),
        ("toy", {"rows": 2, "cols": 5, "dtype": "float32"}),
    ]
    as_list = tmp_path / "plan.json"
    as_list.write_text(json.dumps([{"kernel": "toy", "shape": [3, 16], "dtype": "float16"}]))
    assert read_plan(as_list) == [("toy", {"rows": 4, "cols": 16, "dtype": "float16"})]
    local = cli("tune", "--plan", str(hand), "--trials", "2", "--sampler", "random")
    assert local.exit_code == 0 and "rows=2 cols=5 dtype=float32" in local.output, local.output


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"kernel": "nope", "shape": [8, 8], "dtype": "float32"}', "line 2: unknown kernel 'nope'. Available:"),
        ('{"kernel": "toy", "shape": [8, 0], "dtype": "float32"}', "line 2: 'shape' must be positive integers"),
        ('{"kernel": "toy", "shape": "8x", "dtype": "float32"}', "line 2: 'shape' must be positive integers"),
        ('{"kernel": "toy", "shape": [8, 4, 2], "dtype": "float32"}', "line 2: toy shapes are MxN"),
        ('{"kernel": "toy", "shape": [8, 8]}', 'line 2: give "problem", or "shape" (MxN) and a "dtype" string'),
        ('{"kernel": "toy", "problem": {"rows": 8}}', "line 2: a toy problem has exactly the fields"),
        ('{"kernel": "toy", "problem": {"rows": 8, "cols": 8, "dtype": 1.5}}', "field 'dtype' must be a string"),
        ('{"kernel": "toy", "shapes": [8, 8]}', "line 2: unknown fields ['shapes']"),
        ('{"kernel": "toy", "shape": [8, 8]', "line 2: not valid JSON"),
        ("[1, 2]", 'line 2: each item must be an object with a "kernel" name'),
    ],
)
def test_bad_plan_is_one_line_and_exit_1(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"kernel": "toy", "shape": [8, 8], "dtype": "float32"}\n' + line + "\n")
    for args in (["plan", str(path)], ["tune", "--plan", str(path)], ["tune", "--plan", str(path), "--workers", "1"]):
        result = cli(*args)
        assert result.exit_code == 1 and message in result.output, (args, result.output)
        assert len([x for x in result.output.splitlines() if x.startswith("error:")]) == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["tune", "--trials", "3"], "tune needs --kernel (with --shape/--dtype) or --plan FILE"),
        (["tune", "-k", "toy", "--plan", "p.jsonl"], "give --plan, or --kernel with --shape/--dtype, not both"),
        (["tune", "-k", "toy", "--submit"], "--submit needs --storage URL"),
        (["tune", "-k", "toy", "--submit", "--workers", "2", "--storage", "x.log"], "give one of them"),
        (["tune", "-k", "toy", "--workers", "0"], "--workers must be >= 1"),
        (["tune", "-k", "toy", "--submit", "--storage", "nodb://x/y"], "cannot open the storage nodb://x/y"),
        (["tune", "-k", "toy", "--submit", "--storage", "/no/such/dir/q.log"], "/no/such/dir is not a directory"),
        (["worker", "--storage", "sqlite:///x.db", "--heartbeat", "5", "--lease", "5"], "a timeout longer than"),
        (["plan", "p.jsonl", "-s", "8x8"], "--shape and --dtype go with --kernel"),
        (["plan", "missing.jsonl"], "cannot read the plan missing.jsonl"),
        (["export", "--out", "x.json", "--storage", "sqlite:///empty.db", "--kernel", "nope"], "unknown kernel 'nope'"),
    ],
)
def test_bad_fleet_input_is_one_line_and_exit_1(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    result = cli(*args)
    assert result.exit_code == 1 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_status_of_a_missing_queue(tmp_path):
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    assert "no queues in" in cli("status", "--storage", url).output
    JobQueue(url, "h200")
    result = cli("status", "--storage", url, "--queue", "h100")
    assert result.exit_code == 1 and "no queue 'h100'" in result.output and "['h200']" in result.output


def test_recorder_logs_each_problem_the_ops_resolved(toy, tmp_path, monkeypatch):
    from tunekit.runtime import recorder

    d = dispatcher("toy")
    k1, k2 = (8, 32, "float32"), (4, 16, "float16")
    d.config(k1)  # memoised before the recording: the recording must still see it
    notes = []
    note = recorder.note
    monkeypatch.setattr(recorder, "note", lambda kernel, problem: notes.append(kernel) or note(kernel, problem))
    with record_problems(tmp_path / "plan.jsonl") as seen:
        for key in (k1, k2, k1, k2, k1):
            d.config(key)
    assert notes == ["toy", "toy"]  # one miss per key; the memo-hit path never calls the recorder
    assert seen.problems == [("toy", toy.problem_dict(k1)), ("toy", toy.problem_dict(k2))]
    assert read_plan(tmp_path / "plan.jsonl") == seen.problems
    assert not recorder.ACTIVE
    d.config((2, 8, "float32"))  # after the recording: nothing is noted
    assert len(seen.problems) == 2


def test_lease_and_job_values_are_checked():
    with pytest.raises(TunekitError, match="timeout longer than the heartbeat"):
        Lease(heartbeat_s=10, timeout_s=10)
    job = Job("toy", {"rows": 8, "cols": 32, "dtype": "float32"})
    assert Job.from_json(json.loads(json.dumps(job.to_json()))) == job
    assert job.id != Job("toy", {"rows": 8, "cols": 32, "dtype": "float32"}, trials=31).id
    assert "early_stop" not in job.to_json()  # a job without it keeps the id it had before the field existed
    stopping = Job("toy", {"rows": 8, "cols": 32, "dtype": "float32"}, early_stop=0.03)
    assert Job.from_json(json.loads(json.dumps(stopping.to_json()))) == stopping and stopping.id != job.id
    with pytest.raises(TunekitError, match="early_stop must be null or a number in"):
        Job.from_json({**job.to_json(), "early_stop": 1.5})


def test_a_job_carries_the_early_stop_to_its_worker(tmp_path, monkeypatch):
    """`tune --workers N --early-stop X`: each job's search stops as `tune --plan` in one process would."""
    from tunekit.tuning.shared_bench import SharedBench

    seen = []
    real = SharedBench.tune

    def spy(self, spec, problem, device, options, store, **kw):
        seen.append(options.early_stop)
        return real(self, spec, problem, device, options, store, **kw)

    monkeypatch.setattr(SharedBench, "tune", spy)
    run_job(Job("toy", {"rows": 8, "cols": 32, "dtype": "float32"}, trials=2, early_stop=0.05), Store(), None)
    assert seen == [0.05]
    result = cli("tune", "-k", "toy", "-s", SHAPES[0], "--trials", "2", "--workers", "1", "--early-stop", "0.03")
    assert result.exit_code == 0 and "1 jobs on 1 workers" in result.output, result.output


CLAIMER = """
import json, sys
from tunekit.fleet.queue import JobQueue
queue, taken = JobQueue(sys.argv[1]), []
while (claim := queue.claim("racer")) is not None:
    claim.stop()
    taken.append(claim.job.id)
print(json.dumps(taken))
"""


def test_racing_workers_never_claim_one_job_twice(any_storage):
    """Claims are Optuna's atomic pop: processes racing over one queue take each job exactly once."""
    jobs = [Job("toy", {"rows": 8, "cols": c, "dtype": "float32"}) for c in range(1, 61)]
    assert JobQueue(any_storage).submit(jobs) == (60, 0)
    racers = [
        subprocess.Popen([sys.executable, "-c", CLAIMER, any_storage], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    taken = [job for racer in racers for job in json.loads(racer.communicate(timeout=90)[0])]
    assert sorted(taken) == sorted(job.id for job in jobs)


def test_help_on_every_fleet_command():
    for cmd in (["plan"], ["worker"], ["status"], ["tune"], ["export"]):
        result = cli(*cmd, "--help")
        assert result.exit_code == 0 and "Usage" in result.output, result.output
    assert "--workers" in cli("tune", "--help").output and "--storage" in cli("export", "--help").output


# --- defensive results and stuck jobs ----------------------------------------------------------------------------


def _complete_with(queue: JobQueue, result: object) -> str:
    """Claim the next job and complete it with `result` as its result attribute, as a broken worker could."""
    claim = queue.claim("tester")
    assert claim is not None
    claim.stop()
    queue.storage.set_trial_user_attr(claim.trial_id, RESULT_ATTR, result)
    queue.storage.set_trial_state_values(claim.trial_id, optuna.trial.TrialState.COMPLETE, [1.0])
    return claim.job.id


def test_a_malformed_result_is_reported_with_its_job_id_and_skipped(any_storage, toy, tmp_path, caplog):
    """status, export --storage and --submit go on past one unreadable job or result; the rest still exports."""
    from helpers import toy_entry

    from tunekit.core.device import fingerprint

    url = any_storage
    queue = JobQueue(url)
    jobs = _toy_jobs(4)
    queue.submit(jobs)
    good = [toy_entry(toy, fingerprint(), 1.0, rows=int(j.problem["rows"]), cols=int(j.problem["cols"])) for j in jobs]
    _complete_with(queue, good[0].to_json())
    bad_result = _complete_with(queue, {"key": 3})  # not an entry
    rule_breaking = good[2].to_json()
    rule_breaking["best"]["config"]["BLOCK"] = 64  # in the space, but wider than the row: breaks the rules
    breaks_rules = _complete_with(queue, rule_breaking)
    _complete_with(queue, good[3].to_json())
    queue.study.enqueue_trial({}, user_attrs={JOB_ATTR: {"id": "not-a-job", "kernel": 5}})  # a job that is no job

    result = cli("status", "--storage", url, "--jobs")
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    warned = caplog.text  # the CLI shows tunekit's warnings on stderr (pytest captures them here)
    assert f"job {bad_result}: unreadable result: result: field 'key' must be an object" in warned
    assert f"job {breaks_rules}: unreadable result: result.best: config" in warned and "'block_fits_row'" in warned
    assert "job not-a-job: its job is unreadable (a job's kernel must be a string, but got 5)" in warned
    assert "unreadable result: result: field 'key'" in result.output  # the job's row says why too
    assert re.search(r"default\s*│\s*0\s*│\s*0\s*│\s*4\s*│\s*0", result.output), result.output
    assert "3 jobs with an unreadable job or result" in result.output

    out = tmp_path / "fleet-db.json"
    result = cli("export", "--storage", url, "--out", str(out))
    assert result.exit_code == 0 and "exported 2 entries" in result.output, result.output
    assert "3 jobs left out: their job or result is unreadable" in result.output
    assert {json.dumps(e["key"], sort_keys=True) for e in json.loads(out.read_text())["entries"]} == {
        json.dumps(e.key.to_json(), sort_keys=True) for e in (good[0], good[3])
    }

    args = ["-k", "toy", "--trials", "4", "--sampler", "random", "--storage", url, "--submit", "-s", "9x9"]
    result = cli("tune", *args)
    assert result.exit_code == 0 and "1 jobs queued" in result.output, result.output
    # a worker fails the job that is no job, with its reason, and tunes the real one
    report = work(url, timer=PlantedTimer(), say=lambda line: None)
    assert report.done == 1
    (failed,) = [t for t in queue.study.get_trials() if t.state == optuna.trial.TrialState.FAIL]
    assert failed.user_attrs[ERROR_ATTR].startswith("malformed job: a job's kernel must be a string")


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _orphan(queue: JobQueue, pid: int | None = None, host: str | None = None):
    """Claim a job as a worker that then vanished: its owner record names a process that is gone."""
    claim = queue.claim("vanished")
    assert claim is not None
    claim.stop()
    owner = owner_record(claim.trial_id) | {"pid": pid or _dead_pid(), "start": None}
    if host is not None:
        owner["host"] = host
    queue.storage.set_trial_user_attr(claim.trial_id, OWNER_ATTR, owner)
    return claim


def test_a_journal_job_whose_worker_is_gone_is_reclaimed_by_the_next_worker(tmp_path):
    """No heartbeats on a journal: before claiming, a worker re-queues the jobs whose owner process is gone."""
    url = str(tmp_path / "fleet.journal")
    queue = JobQueue(url)
    queue.submit(_toy_jobs(2))
    _orphan(queue)
    assert queue.counts() == {"queued": 1, "running": 1, "done": 0, "failed": 0}
    status = cli("status", "--storage", url, "--jobs")
    assert "running (worker gone)" in status.output and "tunekit requeue --storage" in status.output, status.output
    report = work(url, timer=PlantedTimer(), say=lambda line: None)
    assert report.done == 2
    assert queue.counts() == {"queued": 0, "running": 0, "done": 2, "failed": 0}
    assert sorted(s.attempts for s in queue.jobs()) == [1, 2]
    assert set(completions(url).values()) == {1}


def test_reclaiming_stops_after_max_retries(tmp_path):
    """A job whose workers keep dying is re-queued max_retries times, then stays failed with the reason."""
    url = str(tmp_path / "fleet.journal")
    queue = JobQueue(url, lease=Lease(max_retries=2))
    queue.submit(_toy_jobs(1))
    for _ in range(3):
        _orphan(queue)
        queue.reap()
    (status,) = queue.jobs()
    assert (status.state, status.attempts) == ("failed", 3)
    assert status.error.startswith("its worker process (") and status.error.endswith(") is gone")
    assert queue.claim("nobody") is None


def test_a_live_worker_is_never_reclaimed(tmp_path):
    url = str(tmp_path / "fleet.journal")
    queue = JobQueue(url)
    queue.submit(_toy_jobs(1))
    claim = queue.claim("me")  # this process: alive
    assert claim is not None
    assert queue.reap() == [] and queue.counts()["running"] == 1
    result = cli("requeue", "--storage", url, "--stale")
    assert result.exit_code == 0 and "0 jobs re-queued; 1 running jobs have a live worker here" in result.output
    result = cli("requeue", "--storage", url, "--job", claim.job.id[:8])
    assert result.exit_code == 1 and "still runs" in result.output and "Traceback" not in result.output
    _orphan_reused = owner_record(claim.trial_id) | {"start": -5}  # the pid is ours, but a newer process's
    queue.storage.set_trial_user_attr(claim.trial_id, OWNER_ATTR, _orphan_reused)
    assert [job.id for job in queue.reap()] == [claim.job.id]


def test_requeue_by_hand(tmp_path):
    """--stale for workers of this machine that are gone; --job for one whose worker ran elsewhere. The original
    can never complete afterwards, so a worker that was alive after all cannot complete the job twice."""
    url = str(tmp_path / "fleet.journal")
    queue = JobQueue(url)
    queue.submit(_toy_jobs(3))
    here = _orphan(queue)
    elsewhere = _orphan(queue, host="another-machine")
    result = cli("requeue", "--storage", url, "--stale")
    assert result.exit_code == 0, result.output
    assert f"re-queued job {here.job.id[:12]}" in result.output
    assert "1 jobs re-queued; 1 running jobs have a live worker here or one this machine cannot check" in result.output
    result = cli("requeue", "--storage", url, "--job", elsewhere.job.id[:10])
    assert result.exit_code == 0 and f"re-queued job {elsewhere.job.id[:12]}" in result.output, result.output
    assert queue.counts() == {"queued": 3, "running": 0, "done": 0, "failed": 0}
    from helpers import toy_entry

    from tunekit.core.device import fingerprint

    problem = elsewhere.job.problem
    late = toy_entry(toy_spec(), fingerprint(), 1.0, rows=int(problem["rows"]), cols=int(problem["cols"]))
    assert queue.complete(elsewhere, late) is False  # its worker came back: too late
    for args, message in [
        (["requeue", "--storage", url], "requeue needs --job ID or --stale"),
        (["requeue", "--storage", url, "--stale", "--job", "ab"], "requeue needs --job ID or --stale"),
        (["requeue", "--storage", url, "--job", "zzzz"], "no queue of"),
        (["requeue", "--storage", url, "--job", here.job.id], "is queued, not running"),
    ]:
        result = cli(*args)
        assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output, result.output


def test_a_sigkilled_journal_worker_s_job_is_requeued_and_done_once(tmp_path):
    """The issue's case: a worker killed on a journal storage left its job running for good."""
    url = str(tmp_path / "fleet.journal")
    victim, queue = start_victim(url, tmp_path)
    victim.kill()
    victim.wait()
    assert queue.counts()["running"] == 1  # nothing else would ever move it
    result = cli("requeue", "--storage", url, "--stale")
    assert result.exit_code == 0 and "1 jobs re-queued" in result.output, result.output
    assert wait_all([start_worker(url, tmp_path / "helper.log")]) == [0]
    done = completions(url)
    assert len(done) == len(SHAPES) and set(done.values()) == {1}
    assert sorted(s.attempts for s in queue.jobs()) == [1] * (len(SHAPES) - 1) + [2]


def toy_spec():
    from tunekit.core.registry import get_spec

    return get_spec("toy")
