"""The dispatch chain: memo -> user cache -> shipped databases -> the bucket of a token count between two tuned
edges, where both beat torch (tunekit.runtime.buckets) -> (untuned) torch's own op, or in the
interpreter (or with TUNEKIT_UNTUNED=triton) the nearest tuned problem -> the model's pick (the learned ranker's
top config, where the device has limits to model) -> heuristic default.

The memo is a plain dict from the op's problem key to a ready config; after the first call for a key, the op
pays one dict lookup. Everything else here runs once per key per process.

Never slower than torch: a problem with no entry of its own is served by torch's own implementation on a GPU
(the op sees the TORCH config and calls torch), because nothing measured says a Triton config beats torch there:
the nearest entry was measured on another problem and the heuristic on none (measured on the H200: untuned GEMMs
at 0.25-0.76x torch forward, 0.11-0.61x forward+backward; untuned norm forward+backward at 0.21-0.46x).
`TUNEKIT_UNTUNED=triton` serves the nearest entry or the heuristic instead. The interpreter keeps the Triton
kernels: its timings mean nothing and the kernels are what runs there to be tested.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace

from tunekit.core import settings
from tunekit.core.device import DeviceFingerprint, fingerprint
from tunekit.core.errors import CacheError, CacheMissError
from tunekit.core.identity import explain_change
from tunekit.core.registry import get_spec
from tunekit.core.space import Config, Problem
from tunekit.core.spec import KernelSpec, ProblemKey
from tunekit.launch import watch as launch_watch
from tunekit.runtime import buckets, compile_policy, compiled_gemm, hotpath, recorder, version_policy
from tunekit.store import database
from tunekit.store.database import shipped_entries, shipped_scope
from tunekit.store.entry import (
    HELD,
    HOST_FLOOR_MARGIN,
    HOST_FLOOR_MS,
    LAUNCH_BOUND_MS,
    TORCH_CANDIDATE,
    Entry,
    demotion,
    model_verified,
    superseded_floor,
    torch_time,
)
from tunekit.store.key import CacheKey
from tunekit.store.nearest import nearest_entry
from tunekit.store.store import Store

logger = logging.getLogger("tunekit")

LAYERS = (
    "cache", "shipped", "torch-measured", "torch-launch-bound", "demoted", "bucket", "torch", "nearest", "model",
    "heuristic", "tuned",
)  # fmt: skip
TORCH: Config = TORCH_CANDIDATE  # served config meaning "run torch's own op" (one object: ops test `is TORCH`)
UNTUNED = ("torch", "nearest", "model", "heuristic")  # layers that serve a problem with no entry of its own


@dataclass(frozen=True)
class Resolution:
    layer: str
    config: Config
    entry: Entry | None = None
    note: str = ""  # the bucket layer's reason, where it served or refused a token count (tunekit.runtime.buckets)
    # An entry that must be checked before it serves could not be checked now (a graph captured or traced): this
    # resolution serves the next layer and is not memoised, so a later call checks it.
    provisional: bool = False


def why_not_served(entry: Entry, device: DeviceFingerprint) -> str:
    """ "" when `entry` can serve on `device` today; otherwise why not (stale identity, Triton, another device)."""
    if entry.key.device_key != device.key:
        try:
            stored = DeviceFingerprint.from_json(dict(entry.device))
        except (KeyError, TypeError):
            return "another device"
        if replace(stored, triton_version=device.triton_version).key == device.key:
            return f"stale: measured with Triton {stored.triton_version} (now {device.triton_version})"
        return "another device"
    current = get_spec(entry.key.kernel).source_hash
    if entry.key.source_hash != current:
        return f"stale: {explain_change(entry.key.source_hash, current)}"
    return ""


def resolve(spec: KernelSpec, problem: Problem, device: DeviceFingerprint, store: Store | None) -> Resolution:
    """Which layer serves this problem, without the memo. Deterministic for a given store and shipped set."""
    unchecked: list[str] = []
    resolution = _resolve(spec, problem, device, store, unchecked)
    return replace(resolution, provisional=True) if unchecked else resolution


def _resolve(
    spec: KernelSpec, problem: Problem, device: DeviceFingerprint, store: Store | None, unchecked: list[str]
) -> Resolution:
    key = CacheKey.make(spec.name, spec.source_hash, device.key, problem)
    shipped = shipped_entries()
    if store is not None:
        entry = store.get(key)
        if entry is not None and spec.space.is_valid(entry.config, problem, device):
            entry = _trusted(spec, problem, device, entry, "cache", unchecked)
            if entry is not None:
                return _tuned(spec, "cache", held_by_key(entry, shipped.get(key)), device)
    entry = shipped.get(key)
    if entry is not None and spec.space.is_valid(entry.config, problem, device):
        entry = _trusted(spec, problem, device, entry, "shipped", unchecked)
        if entry is not None:
            return _tuned(spec, "shipped", entry, device)
    entry = version_policy.checked_entry(spec, problem, device, shipped)  # recorded under another Triton
    if entry is not None:
        return _tuned(spec, "shipped", entry, device)
    bucketed = buckets.bucket_resolution(spec, problem, device, lambda k: _edge(store, shipped, k))
    if bucketed is not None and bucketed.layer:
        return Resolution(bucketed.layer, bucketed.config, bucketed.entry, bucketed.note)
    note = bucketed.note if bucketed is not None else ""
    if spec.torch_fallback and not device.is_interpreter and settings.untuned() == "torch":
        return Resolution("torch", TORCH, note=note)
    local = store.scope_entries(spec.name, device.key) if store is not None else []
    others = [e for e in (*local, *shipped_scope(spec.name, device.key)) if e.key != key]  # this key's: refused above
    entry = nearest_entry(spec, problem, device, others)
    if entry is not None:
        return Resolution("nearest", entry.config, entry, note)
    from tunekit.tuning.untuned import model_pick  # the model: only where Triton serves untuned problems

    pick = model_pick(spec, problem, device)
    if pick is not None:
        return Resolution("model", pick, note=note)
    return Resolution("heuristic", spec.heuristic(problem, device), note=note)


def _own(store: Store | None, key: CacheKey) -> Entry | None:
    return store.get(key) if store is not None else None


def _edge(store: Store | None, shipped: Mapping[CacheKey, Entry], key: CacheKey) -> Entry | None:
    """A bucket edge's entry: the working cache's (holding a shipped demotion of its key), else the shipped one."""
    own = _own(store, key)
    return held_by_key(own, shipped.get(key)) if own is not None else shipped.get(key)


def _trusted(
    spec: KernelSpec, problem: Problem, device: DeviceFingerprint, entry: Entry, layer: str, unchecked: list[str]
) -> Entry | None:
    """The entry where it may serve (tuned here, or its config checked here: version_policy.trusted), else None."""
    try:
        return version_policy.trusted(spec, problem, device, entry, layer)
    except version_policy.Provisional as waiting:
        unchecked.append(str(waiting))
        return None


def held_by_key(entry: Entry, shipped: Entry | None) -> Entry:
    """A working-cache entry, holding the demotion of its problem's shipped entry: a demotion stays with its problem
    until the model verifies the entry that replaced it (tunekit.store.entry.verified_in_model)."""
    if shipped is None or demotion(entry) is not None or model_verified(entry):
        return entry
    why = demotion(shipped)
    return entry if why is None else replace(entry, provenance={**entry.provenance, HELD: why})


def _tuned(spec: KernelSpec, layer: str, entry: Entry, device: DeviceFingerprint) -> Resolution:
    """A tuned entry's config, or torch's op where the tuner measured torch at least as fast (tunekit.tuning.
    torch_candidate: torch is a candidate like any config; by HOST_FLOOR_MARGIN where the times are per-call host
    floors, which noise can order either way), or where the entry is launch-bound and was timed by an earlier
    method (SUPERSEDED_TIMERS) or holds no torch time: its time then says nothing of the host's work per call, which
    decides such a problem (an older entry served an 8x4096x4096 GEMM at 0.49x torch on the H200, timed eagerly;
    another raced it against torch's scaled GEMM and lost to F.linear by 8 us a call). A demoted entry (one that
    made a model step slower when the model was timed with and without it: tunekit.evaluation.tune_model) is served
    torch on every device, the interpreter included, so the demotion path runs in the CPU tests."""
    if spec.torch_fallback and demotion(entry) is not None:
        return Resolution("demoted", TORCH, entry)
    if not spec.torch_fallback or device.is_interpreter:
        return Resolution(layer, entry.config, entry)
    torch_ms = torch_time(entry.provenance)
    if superseded_floor(entry):
        return Resolution("torch-launch-bound", TORCH, entry)
    margin = HOST_FLOOR_MARGIN if entry.time_ms < HOST_FLOOR_MS else 1.0
    if torch_ms is not None and torch_ms <= margin * entry.time_ms:
        return Resolution("torch-measured", TORCH, entry)
    if torch_ms is None and entry.time_ms < LAUNCH_BOUND_MS:
        return Resolution("torch-launch-bound", TORCH, entry)
    return Resolution(layer, entry.config, entry)


def serves_kernel(spec: KernelSpec, entry: Entry, device: DeviceFingerprint) -> bool:
    """Whether dispatch serves `entry`'s kernel config (not torch's op) for its problem on `device`."""
    return _tuned(spec, "cache", entry, device).config is not TORCH


def _open_store() -> Store | None:
    try:
        return Store()
    except CacheError as exc:
        logger.warning("tunekit: cache store unavailable, using shipped databases and defaults: %s", exc)
        return None


class Dispatcher:
    """Per-kernel memo and resolution. `config(key)` is the only call an op makes."""

    def __init__(self, kernel: str) -> None:
        self.kernel = kernel
        self.memo: dict[ProblemKey, Config] = {}
        self.compile_memo: dict[ProblemKey, Config] = {}  # what a compiled graph runs, decided when traced
        self.served_by: dict[ProblemKey, str] = {}
        self.counters: Counter[str] = Counter()  # resolutions by layer (memo misses)
        self.memo_hits = 0
        # Resolved now, not on first use: a first use inside torch.compile would trace the import and break the
        # graph (dynamo does not trace importlib).
        self.spec: KernelSpec = get_spec(kernel)

    def config(self, key: ProblemKey) -> Config:
        config = self.memo.get(key)
        if config is None:
            config = self._miss(key)
        else:
            self.memo_hits += 1
        if config is TORCH and launch_watch.watching():
            launch_watch.note_torch_served()
        return config

    def under_compile(self, key: ProblemKey) -> Config:
        """What a torch.compile graph runs for `key`, decided when it is traced: the config served eagerly where
        its entry beats Inductor's code for the problem (compile_policy.beats_inductor), else TORCH: torch's code,
        which Inductor fuses with its neighbours."""
        config = self.config(key)
        if config is TORCH:
            return config
        chosen = self.compile_memo.get(key)
        if chosen is None:
            entry = None if compile_policy.FORCED is not None else self._entry(key)
            chosen = self.compile_memo[key] = config if compile_policy.beats_inductor(entry) else TORCH
        return chosen

    def _entry(self, key: ProblemKey) -> Entry | None:
        """The problem's own entry (not the nearest problem's: its Inductor time was measured on another problem)."""
        store = _open_store()
        try:
            resolution = resolve(self.spec, self.spec.problem_dict(key), fingerprint(), store)
            return resolution.entry if resolution.layer in ("cache", "shipped") else None
        finally:
            if store is not None:
                store.close()

    def _miss(self, key: ProblemKey) -> Config:
        spec = self.spec
        problem = spec.problem_dict(key)
        if recorder.ACTIVE:
            recorder.note(spec.name, problem)
        device = fingerprint()
        store = _open_store()
        try:
            resolution = resolve(spec, problem, device, store)
            if resolution.layer in UNTUNED and settings.tune_on_miss():
                resolution = self._tune(spec, problem, device, store)
        finally:
            if store is not None:
                store.close()
        if resolution.layer in UNTUNED and settings.strict():
            raise CacheMissError(
                f"strict mode: no tuned {spec.name} config for {spec.describe_problem(problem)} on {device.label}; "
                f"run `tunekit tune --kernel {spec.name}` for this shape or import a database"
            )
        logger.debug("tunekit: %s %s served by %s: %s", spec.name, key, resolution.layer, dict(resolution.config))
        self.counters[resolution.layer] += 1
        self.served_by[key] = resolution.layer
        if not resolution.provisional:
            self.memo[key] = resolution.config
        return resolution.config

    def _tune(self, spec: KernelSpec, problem: Problem, device: DeviceFingerprint, store: Store | None) -> Resolution:
        from tunekit.tuning.orchestrate import TuneOptions, tune_and_store  # optuna: kept off the import path

        def keep(entry: Entry) -> Entry:
            """Store what was tuned; a store that cannot be written (read-only, full) costs the cache, not the call."""
            if store is None:
                return entry
            try:
                return store.put(entry)
            except CacheError as exc:
                logger.warning("tunekit: tuned %s but could not store it: %s", spec.name, exc)
                return entry

        options = TuneOptions(trials=settings.tune_on_miss_trials())
        entry, _ = tune_and_store(spec, problem, device, options, store, put=keep)
        return Resolution("tuned", entry.config, entry)

    def clear(self) -> None:
        self.memo.clear()
        self.compile_memo.clear()
        self.served_by.clear()
        self.counters.clear()
        self.memo_hits = 0


_DISPATCHERS: dict[str, Dispatcher] = {}


def dispatcher(kernel: str) -> Dispatcher:
    """The kernel's dispatcher (one per kernel and process)."""
    d = _DISPATCHERS.get(kernel)
    if d is None:
        d = _DISPATCHERS[kernel] = Dispatcher(kernel)
    return d


def kernel_served_problems(*dispatchers: Dispatcher) -> list[Problem] | None:
    """The problems of these kernels that dispatch may serve a kernel config for (not torch's op) on this device,
    where it serves torch for every other problem: the entries of this device in the user's cache and the shipped
    databases that serve a kernel, and the shipped entries of its hardware under another Triton version (dispatch
    may check and serve those). None where any problem may be served a kernel: the interpreter, untuned problems
    on Triton, tune on miss, strict mode, or a kernel without torch's fallback."""
    device = fingerprint()
    if device.is_interpreter or settings.untuned() != "torch" or settings.tune_on_miss() or settings.strict():
        return None
    if not all(d.spec.torch_fallback for d in dispatchers):
        return None
    other_tritons = version_policy.other_triton_device_keys(device, shipped_entries())
    problems: list[Problem] = []
    store = _open_store()
    try:
        for d in dispatchers:
            local = store.scope_entries(d.kernel, device.key) if store is not None else []
            for entry in (*local, *shipped_scope(d.kernel, device.key)):
                if entry.key.source_hash == d.spec.source_hash and serves_kernel(d.spec, entry, device):
                    problems.append(dict(entry.key.problem))
            for device_key in other_tritons:  # their times are measured here when checked: any may serve
                problems += [dict(e.key.problem) for e in shipped_scope(d.kernel, device_key)]
    finally:
        if store is not None:
            store.close()
    return problems


def chosen_under_compile(*dispatchers: Dispatcher) -> bool:
    """Whether a kernel of these serves some problem under torch.compile on this device: an entry in the user's
    cache or a shipped database that dispatch serves eagerly and that beats Inductor's code for its problem. Where
    none does, an op of these kernels traces as torch's code (compile_policy)."""
    device = fingerprint()
    store = _open_store()
    try:
        for d in dispatchers:
            local = store.scope_entries(d.kernel, device.key) if store is not None else []
            for entry in (*local, *shipped_scope(d.kernel, device.key)):
                current = entry.key.source_hash == d.spec.source_hash
                if current and serves_kernel(d.spec, entry, device) and compile_policy.beats_inductor(entry):
                    return True
        return False
    finally:
        if store is not None:
            store.close()


def served_configs() -> dict[str, dict[ProblemKey, Config]]:
    """What each kernel's memo serves now, by problem key: after a run, every problem it met and its config."""
    return {kernel: dict(d.memo) for kernel, d in _DISPATCHERS.items() if d.memo}


@contextmanager
def serving(pins: Mapping[str, Mapping[ProblemKey, Config]]) -> Iterator[None]:
    """Inside, each pinned problem key is served its pinned config (the memo holds it, so dispatch never resolves
    it); every other key resolves as usual. Memos and hot-path plans are forgotten on the way in and out, so no
    plan built under one serving replays under another."""
    forget_memos()
    for kernel, configs in pins.items():
        dispatcher(kernel).memo.update(configs)
    try:
        yield
    finally:
        forget_memos()


def forget_memos() -> None:
    """Empty every memo (not the counters): the next call for each key resolves again (tunekit.record_problems)."""
    for d in _DISPATCHERS.values():
        d.memo.clear()
        d.compile_memo.clear()
    hotpath.forget_plans()


recorder.ON_ENTER.append(forget_memos)


def reset_all() -> None:
    """Forget every memoised resolution (tests, or after importing a database into a running process)."""
    for d in _DISPATCHERS.values():
        d.clear()
    hotpath.forget_plans()
    compiled_gemm.forget()
    database.shipped_entries.cache_clear()
