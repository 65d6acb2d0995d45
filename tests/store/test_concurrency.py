"""Processes against one cache: SIGKILL mid-run and resume, 8 concurrent writers, every rank resolving alike.

Each test runs real processes (python -c) on the toy kernel with the cache in TUNEKIT_CACHE_DIR (the conftest's
per-test directory, inherited by the children).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

from crafting import raw_rows
from helpers import TESTS, make_entry
from toy_kernel import PlantedTimer

from tunekit.core.device import fingerprint
from tunekit.store.entry import Entry
from tunekit.store.key import CacheKey
from tunekit.store.payload import parse_payload
from tunekit.store.store import DB_NAME, Store

PREAMBLE = f"""
import json, os, sys, time
sys.path.insert(0, {str(TESTS)!r})
from tunekit.core import registry
registry.KERNELS["toy"] = "toy_kernel"
from toy_kernel import PlantedTimer
from tunekit.store.key import CacheKey
from tunekit.core.device import fingerprint
from tunekit.store.store import Store
from tunekit.tuning.tune_types import TuneOptions
from tunekit.tuning.tuner import tune
toy = registry.get_spec("toy")
device = fingerprint()
"""


def _script(body: str) -> str:
    return PREAMBLE + textwrap.dedent(body)


def _run_all(scripts: list[str], env: dict[str, str], timeout: float = 120) -> list[dict]:
    """Run the scripts at once, each with its own hash seed; each prints one JSON object last. In order."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", s],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env, "PYTHONHASHSEED": str(i + 1)},
        )
        for i, s in enumerate(scripts)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _key(toy, problem) -> CacheKey:
    return CacheKey.make("toy", toy.source_hash, fingerprint().key, problem)


# ------------------------------------------------------------------------------------------ SIGKILL and resume

CLI_RUN = """
import tunekit.tuning.bench
class LoggedTimer(PlantedTimer):
    label = "logged"
    def __call__(self, fn, config):
        with open(os.environ["TIMINGS_LOG"], "a") as f:
            f.write(json.dumps(config, sort_keys=True) + "\\n")
        time.sleep(0.05)
        return super().__call__(fn, config)
tunekit.tuning.bench.default_timer = LoggedTimer  # the CLI builds its timer from here
from tunekit.cli import app
app(["tune", "--kernel", "toy", "--shape", "8x64", "--dtype", "float32", "--sampler", "exhaustive",
     "--trials", "1000"], standalone_mode=False)
print(json.dumps({"done": True}))
"""


def test_sigkill_mid_run_loses_at_most_the_trial_in_flight_and_the_rerun_resumes(toy, tmp_path):
    """`tunekit tune` is killed (SIGKILL) mid-run; the same command again measures only what was not stored."""
    log = tmp_path / "timings.log"
    env = {**os.environ, "TIMINGS_LOG": str(log), "COLUMNS": "250"}
    first = subprocess.Popen([sys.executable, "-c", _script(CLI_RUN)], env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while (not log.exists() or len(log.read_text().splitlines()) < 8) and time.monotonic() < deadline:
        assert first.poll() is None, "the first run ended before it could be killed"
        time.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL
    timed_first = [json.loads(line) for line in log.read_text().splitlines()]
    problem = {"rows": 8, "cols": 64, "dtype": "float32"}
    valid = toy.space.valid_configs(problem, fingerprint())
    with Store() as store:
        saved = store.get(_key(toy, problem))
    assert saved is not None
    saved_ok = [t.config for t in saved.trials if t.status == "ok"]
    lost = [c for c in timed_first if c not in saved_ok]
    assert len(lost) <= 1 and all(c == timed_first[-1] for c in lost)  # only the one in flight

    log.unlink()
    subprocess.run([sys.executable, "-c", _script(CLI_RUN)], env=env, check=True, capture_output=True)
    timed_second = [json.loads(line) for line in log.read_text().splitlines()]
    search, confirm = timed_second[:-3], timed_second[-3:]  # the CLI re-measures the 3 fastest at the end
    assert not [c for c in search if c in saved_ok]  # nothing stored was benchmarked again
    assert len(search) == len({json.dumps(c, sort_keys=True) for c in search})
    with Store() as store:
        final = store.get(_key(toy, problem))
    assert {json.dumps(t.config, sort_keys=True) for t in final.trials} == {
        json.dumps(c, sort_keys=True) for c in valid
    }
    n_ok = sum(t.status == "ok" for t in final.trials)
    assert len(saved_ok) + len(search) == n_ok  # every ok config timed once in the search, across both runs
    assert final.config == PlantedTimer().best and final.config in confirm


# ------------------------------------------------------------------------------------------ SIGKILL inside writes

PUTTER = """
import sys
from tunekit.store.key import CacheKey
from tunekit.store.entry import Entry, TrialRecord
from tunekit.store.store import Store
log = open(sys.argv[1], "a", buffering=1)
start = int(sys.argv[2])
with Store() as store:
    print("ready", flush=True)
    for n in range(start, start + 10**6):
        key = CacheKey.make("toy", "srchash", "dev", {"rows": n % 5, "cols": 32, "dtype": "float32"})
        trials = tuple(TrialRecord({"BLOCK": 8, "n": n, "i": i, "pad": "x" * 40}, "ok", 1.0 + i) for i in range(20))
        store.put(Entry(key, {"BLOCK": 8, "n": n}, 1.0 + n % 7, {"name": "cpu"}, {"n": n}, trials))
        log.write(f"{n}\\n")  # after put returned: committed
"""


def test_sigkill_at_random_points_inside_store_writes_loses_nothing(tmp_path, isolated_cache):
    """A process looping read-merge-write puts is SIGKILLed after a random delay, again and again: every put that
    returned before the kill is there and readable, nothing is stored twice or half, and the journal a kill inside
    a write leaves behind is rolled back by the next reader. At least 10 kills, until 3 landed inside a write (every
    other kill waits for an open write transaction, so the random delays alone need not land there)."""
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    log = tmp_path / "committed.log"
    journal = isolated_cache / f"{DB_NAME}-journal"
    kills = inside = hot = 0
    while kills < 10 or (inside < 3 and kills < 30):
        done = [int(n) for n in log.read_text().split()] if log.exists() else []
        child = subprocess.Popen(
            [sys.executable, "-c", PUTTER, str(log), str(max(done, default=-1) + 1)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "ready", child.stderr
        time.sleep(rng.uniform(0.05, 1.0))
        if kills % 2:  # every other kill waits for a write transaction to be open (its journal exists), then kills
            deadline = time.monotonic() + 2.0
            while not journal.exists() and time.monotonic() < deadline:
                pass
        child.send_signal(signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL
        child.stdout.close()
        child.stderr.close()
        kills += 1
        inside += journal.exists()  # the kill came inside a write transaction
        hot += journal.exists() and journal.read_bytes()[:1] not in (b"", b"\0")  # mid-write: must be rolled back
        committed = [int(n) for n in log.read_text().split()]
        with Store() as store:  # reads first: the killed writer's journal is rolled back here
            stored = {e.key.digest: e for e in store.entries()}
            assert len(store) == len(stored) == min(5, max(committed, default=-1) + 2), (seed, kills)
        assert not journal.exists() or journal.read_bytes()[:1] in (b"", b"\0")  # rolled back (or never hot)
        trials: dict[int, list[int]] = {}
        for e in stored.values():
            ids = [json.dumps(t.config, sort_keys=True) for t in e.trials]
            assert len(ids) == len(set(ids)), (seed, kills)  # nothing stored twice
            for t in e.trials:
                trials.setdefault(int(t.config["n"]), []).append(int(t.config["i"]))
        for n in committed:  # every put that returned before the kill
            assert sorted(trials.get(n, [])) == list(range(20)), (seed, kills, n)
        assert all(sorted(v) == list(range(20)) for v in trials.values()), (seed, kills)  # no put half-stored
    print(f"{kills} kills (seed {seed}): {inside} inside a write transaction, {hot} left a hot journal")
    assert inside >= 3, f"only {inside} of {kills} kills landed inside a write (seed {seed})"


# ------------------------------------------------------------------------------------------ 8 concurrent writers

WRITER = """
i = int(sys.argv[1]) if len(sys.argv) > 1 else int(os.environ["WRITER"])
class OffsetTimer(PlantedTimer):
    label = "planted+offset"
    def planted(self, config):
        return super().planted(config) + 1e-4 * (7 * i % 8)  # distinct per writer, below the planted grid
go = os.environ["GO_FILE"]
while not os.path.exists(go):
    time.sleep(0.005)
out = {"tuned": [], "stress": []}
with Store() as store:
    for rows in (8, 16, 32):
        problem = {"rows": rows, "cols": 32, "dtype": "float32"}
        report = tune(toy, problem, device, TuneOptions(trials=6, sampler="random", seed=i, remeasure_top=1),
                      timer=OffsetTimer(), checkpoint=store.put)
        store.put(report.entry)
        e = report.entry
        out["tuned"].append({"digest": e.key.digest, "time_ms": e.time_ms, "config": e.config,
                             "trials": sorted(json.dumps(t.config, sort_keys=True) for t in e.trials)})
    # a stress of bare read-merge-writes on one shared key: every one adds a trial no other writer has
    from tunekit.store.entry import Entry, TrialRecord
    key = CacheKey.make("toy", toy.source_hash, device.key, {"rows": 64, "cols": 32, "dtype": "float32"})
    for n in range(25):
        t = 1.0 + (37 * i + 11 * n) % 200 / 100
        trial = TrialRecord({"BLOCK": 8, "variant": "a", "num_warps": 1, "writer": i, "n": n}, "ok", t)
        store.put(Entry(key, PlantedTimer().best, t, device.to_json(), {"writer": i}, (trial,)))
        out["stress"].append(t)
print(json.dumps(out))
"""


def test_eight_writers_at_once_lose_nothing_and_keep_the_fastest(toy, tmp_path):
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _script(WRITER), str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "GO_FILE": str(go)},
        )
        for i in range(8)
    ]
    time.sleep(0.5)
    go.touch()  # writers wait for this after their imports, so their writes overlap
    results = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))

    with Store() as store:
        raw = raw_rows()
        entries = {e.key.digest: e for e in store.entries()}
    assert len(raw) == 4 and all(parse_payload(d, payload)[0] is not None for d, payload in raw.items())  # none corrupt
    for k in range(3):
        per_writer = [r["tuned"][k] for r in results]
        digest = per_writer[0]["digest"]
        fastest = min(per_writer, key=lambda t: t["time_ms"])
        stored = entries[digest]
        assert stored.time_ms == fastest["time_ms"] and stored.config == fastest["config"]
        measured = set().union(*(t["trials"] for t in per_writer))
        assert {json.dumps(t.config, sort_keys=True) for t in stored.trials} == measured
    stress = entries[_key(toy, {"rows": 64, "cols": 32, "dtype": "float32"}).digest]
    assert len(stress.trials) == 8 * 25  # no read-merge-write lost another writer's trial
    assert stress.time_ms == min(t for r in results for t in r["stress"])


# ------------------------------------------------------------------------------------------ ranks resolve alike

RANK = """
from tunekit.runtime.dispatch import dispatcher
from tunekit.core.errors import CacheMissError
keys = [tuple(k) for k in json.loads(os.environ["KEYS"])]
got = []
for key in keys:
    try:
        got.append([dispatcher("toy").config(key), dispatcher("toy").served_by[key]])
    except CacheMissError as exc:
        got.append(["miss", str(exc)[:40]])
print(json.dumps(got))
"""


def _toy_entry(toy, block, problem, time_ms=1.0) -> Entry:
    e = make_entry(fingerprint(), time_ms, block, problem)
    return Entry(_key(toy, problem), e.config, e.time_ms, e.device, e.provenance, e.trials)


def test_every_rank_resolves_the_same_config_and_strict_ranks_all_raise(toy):
    """Four processes (each its own hash seed) share a cache: the same config for every key, ties included."""
    with Store() as store:
        store.put(_toy_entry(toy, 8, {"rows": 8, "cols": 32, "dtype": "float32"}))
        # equidistant from rows=32 (log2 distance 1 each): the tie is broken by digest, the same in every rank
        store.put(_toy_entry(toy, 4, {"rows": 16, "cols": 32, "dtype": "float32"}))
        store.put(_toy_entry(toy, 16, {"rows": 64, "cols": 32, "dtype": "float32"}))
    keys = [(8, 32, "float32"), (32, 32, "float32"), (4, 32, "float32"), (8, 32, "float16")]
    env = {"KEYS": json.dumps(keys)}
    ranks = _run_all([_script(RANK)] * 4, env=env)
    assert all(r == ranks[0] for r in ranks)
    layers = [layer for _, layer in ranks[0]]
    assert layers == ["cache", "nearest", "nearest", "heuristic"]
    strict = _run_all([_script(RANK)] * 2, env={**env, "TUNEKIT_STRICT": "1"})
    assert all(r == strict[0] for r in strict)
    assert strict[0][0] == ranks[0][0] and [r[0] for r in strict[0][1:]] == ["miss"] * 3
