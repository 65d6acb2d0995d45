"""Where a user kernel's tuned configs live: tunekit's working store (the same sqlite file, the same entries as
tunekit's own kernels), then the read-only databases a package ships beside its kernels.

A user kernel's entries are keyed like tunekit's: its name (the import path `package.module:kernel`), its identity
(tunekit.core.identity's digest of its jit function and jit callees, and a digest of its candidates), the device
fingerprint (which holds Triton's version) and the problem (the key arguments' values and the tensor dtypes).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from tunekit import __version__
from tunekit.core.device import DeviceFingerprint, fingerprint
from tunekit.core.errors import CacheError, DatabaseError
from tunekit.core.identity import explain_change, make_identity, walk_jit
from tunekit.core.space import Value
from tunekit.core.triton_adapter import innermost_jit
from tunekit.runtime import version_policy
from tunekit.store.entry import IMPORTED, Entry, TrialRecord, bad_record
from tunekit.store.key import CacheKey
from tunekit.store.store import Store
from tunekit.user_kernels.configs import Candidates

logger = logging.getLogger("tunekit")

# Bumped when what a user kernel's entry means changes (how its key or configs are stored).
VERSION = 1

Check = Callable[[dict[str, Value]], "str | None"]  # a config checked on a launch's inputs: None, or why it fails


def kernel_identity(jit_fn: Any, candidates: Candidates) -> str:
    """tunekit's identity of a kernel: its jit code and callees (comments and formatting aside) and its candidates.
    Under wrappers (triton.heuristics), the jit function they wrap; the wrappers' host functions are not part of it."""
    return make_identity(VERSION, walk_jit([innermost_jit(jit_fn)]).digest(), candidates.digest())


@dataclass
class StoredKernel:
    """One user kernel's view of the store: look up, record, and say why an entry is not served."""

    name: str
    jit_fn: Any
    candidates: Candidates
    databases: Sequence[Path] = ()
    _warned: set[str] = field(default_factory=set)

    @cached_property
    def identity(self) -> str:
        return kernel_identity(self.jit_fn, self.candidates)

    @cached_property
    def device(self) -> DeviceFingerprint:
        return fingerprint()

    def key(self, problem: dict[str, Value]) -> CacheKey:
        return CacheKey.make(self.name, self.identity, self.device.key, problem)

    def lookup(self, problem: dict[str, Value], check: Check | None = None) -> Entry | None:
        """The entry for `problem` on this device under this code: the working store's, else a shipped one's.

        With `check` (a launch's own check of a config: None when it passes, else why not), an entry that was not
        measured here (imported, or from a package's database) is returned only once its config passed it, once per
        config (recorded: tunekit.runtime.version_policy.check_once); a refused imported config is recorded wrong
        in the store, so no later merge makes it the best again."""
        key = self.key(problem)
        try:
            entry = Store().get(key)
        except CacheError as exc:
            self._warn("open", f"tunekit: {self.name}: {exc}; measuring instead")
            entry = None
        if entry is not None and IMPORTED in entry.provenance:
            entry = self._checked(entry, "imported", problem, check)
        if entry is not None:
            return entry
        shipped = self._shipped().get(key)
        return None if shipped is None else self._checked(shipped, "shipped", problem, check)

    def _checked(self, entry: Entry, what: str, problem: dict[str, Value], check: Check | None) -> Entry | None:
        if check is None or self.candidates.find(entry.config, problem, self.device) is None:
            return entry  # not for serving, or not a candidate (never served: the kernel says so)
        verdict = version_policy.check_once(entry, self.device, what, lambda: check(entry.config))
        if verdict is not None and verdict.served:
            return entry
        if verdict is not None and what == "imported" and bad_record(entry) is None:
            self.record(replace(entry, trials=(TrialRecord(dict(entry.config), "wrong", error=verdict.reason),)))
        return None

    def stale(self, problem: dict[str, Value]) -> list[Entry]:
        """Entries of this problem and device tuned for other code or candidates: never served, said once."""
        key = self.key(problem)
        try:
            related = Store().related(key)
        except CacheError:
            return []
        found = [e for e in related if e.key.device_key == key.device_key and e.key.source_hash != key.source_hash]
        if found:
            why = explain_change(found[0].key.source_hash, key.source_hash)
            self._warn(
                f"stale:{key.digest}",
                f"tunekit: {self.name}: the stored config for {describe(problem)} is stale ({why}); measuring again",
            )
        return found

    def record(self, entry: Entry) -> Entry:
        """Store an entry (merged with what is there). A store that cannot be written is a warning, not an error:
        the launch goes on with the measured best."""
        try:
            return Store().put(entry)
        except CacheError as exc:
            self._warn("write", f"tunekit: {self.name}: the tuned config is not stored: {exc}")
            return entry

    def entry(self, problem: dict[str, Value], best: TrialRecord, trials: Iterable[TrialRecord], how: str) -> Entry:
        return Entry(
            key=self.key(problem),
            config=dict(best.config),
            time_ms=float(best.time_ms or 0.0),
            device=self.device.to_json(),
            provenance={
                "tunekit_version": __version__,
                "strategy": how,
                "timer": how,
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "origin": "local",
            },
            trials=tuple(trials),
        )

    @cached_property
    def _shipped_entries(self) -> dict[CacheKey, Entry]:
        from tunekit.store.database import read_document

        found: dict[CacheKey, Entry] = {}
        for path in self.databases:
            try:
                entries = read_document(Path(path))
            except DatabaseError as exc:
                self._warn(f"db:{path}", f"tunekit: {self.name}: skipping the database {path}: {exc}")
                continue
            for entry in entries:
                old = found.get(entry.key)
                if entry.key.kernel == self.name and (old is None or entry.time_ms < old.time_ms):
                    found[entry.key] = entry
        return found

    def _shipped(self) -> dict[CacheKey, Entry]:
        return self._shipped_entries if self.databases else {}

    def _warn(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            logger.warning("%s", message)


def describe(problem: dict[str, Value]) -> str:
    return ",".join(f"{k}={v}" for k, v in problem.items())
