"""Isolated benchmarking: candidates run in a worker subprocess, so no candidate can take the tuner down.

A candidate config is untrusted code generation. Besides failing to compile or running out of shared memory
(ordinary `failed` records, in or out of a worker), it can hang (a kernel that never finishes), kill its process
(a segfault in a driver, a compiler or the interpreter), or corrupt the CUDA context (after an illegal memory
access every later CUDA call in that process fails). In the worker each of these becomes one `failed` record:

- hang: the parent waits `timeout_s` for the reply, then kills the worker (`timeout` in the record);
- death: the reply never comes, the exit status and the end of the worker's stderr are recorded;
- corrupted context: after any candidate that is not ok, the worker syncs the device and re-runs a config that
  passed before (a canary); if that fails too, it reports itself unusable and the parent replaces it.

The next candidate starts a fresh worker (`restarts` counts them). One worker can serve many problems in turn
(`retarget`: a fleet worker keeps one for its lifetime): the running worker is sent the new target, frees the
previous inputs and builds the new ones, so torch, Triton, the CUDA context and Triton's compiled kernels are paid
for once; a worker replaced after a fault starts on the current target. A worker can also be started before its
first target is known (`prespawn`: it warms up while the caller gets the target). This module is the parent's
side, what a fault means for the candidate; the worker process as the parent handles it (started, spoken to, its death
explained) is tunekit.tuning.isolation_process; the worker's side, and the protocol between them (JSON lines, nothing
pickled), is tunekit.tuning.isolation_worker.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any

from tunekit.core import backend, registry
from tunekit.core.errors import TunekitError
from tunekit.core.space import Config, Problem
from tunekit.core.spec import KernelSpec
from tunekit.store.entry import TrialRecord
from tunekit.tuning.isolation_process import (
    EXIT_GRACE_S,
    WorkerDied,
    WorkerProcess,
    WorkerTimeout,
    current_cuda_device,
    spawn_worker,
)

logger = logging.getLogger("tunekit")

STARTUP_TIMEOUT_S = 300.0  # importing torch and Triton and building the inputs; not a candidate's time


def kernel_module(spec: KernelSpec) -> str:
    """The module the worker imports to find `spec`."""
    name = registry.KERNELS.get(spec.name)
    if name is not None:
        return name
    module = getattr(spec.launch, "__module__", None)
    if module and module != "__main__":
        return str(module)
    raise TunekitError(
        f"cannot benchmark {spec.name} in a worker process: its spec is not importable by module name "
        "(add it to tunekit.core.registry.KERNELS, or tune with isolate=False)"
    )


class IsolatedBench:
    """The parent's side: measures candidates in a worker, replacing it after a hang, a death or a bad context."""

    def __init__(
        self,
        spec: KernelSpec,
        problem: Problem,
        seed: int,
        timer: dict[str, Any],
        timeout_s: float,
        startup_timeout_s: float = STARTUP_TIMEOUT_S,
        label: str = "",
        spawned: WorkerProcess | None = None,
    ) -> None:
        self.spec = spec
        self.label = label  # the timer's label, recorded in entries' provenance
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.restarts = 0  # workers replaced after a hang, a death, a corrupted context or a failed switch
        self.started = 0  # worker processes spawned (1 when one served every target)
        self._device_index = None if backend.INTERPRETED else current_cuda_device()
        self._init = self._init_request(spec, problem, seed, timer)
        self._loaded: dict[str, Any] | None = None  # the init the running worker holds
        self._worker: WorkerProcess | None = None
        self._busy = False  # a request is in flight (an interrupted caller must not wait for its reply)
        self.last_phases: dict[str, float] = {}  # the last measurement's seconds by phase, as the worker timed them
        if spawned is not None:  # started ahead (prespawn): its first init waits only for what is not done yet
            self._worker = spawned
            self.started += 1

    def _init_request(self, spec: KernelSpec, problem: Problem, seed: int, timer: dict[str, Any]) -> dict[str, Any]:
        return {
            "op": "init",
            "sys_path": list(sys.path),
            "module": kernel_module(spec),
            "kernel": spec.name,
            "source_hash": spec.source_hash,
            "problem": dict(problem),
            "seed": seed,
            "timer": timer,
            "device_index": self._device_index,
        }

    # ------------------------------------------------------------------------------------------- public

    def retarget(
        self,
        spec: KernelSpec,
        problem: Problem,
        seed: int,
        *,
        timer: dict[str, Any] | None = None,
        label: str | None = None,
    ) -> None:
        """Measure `problem` of `spec` (bench inputs seeded `seed`) from now on, in the same worker process.

        Nothing is sent yet: the next request (or `start`) switches the running worker, and any worker started
        from now on, a replacement after a fault included, starts on this target. `timer` (as the worker rebuilds
        it) and its `label` stay as they were unless given.
        """
        request = self._init_request(spec, problem, seed, self._init["timer"] if timer is None else timer)
        self.spec, self._init = spec, request
        if label is not None:
            self.label = label

    def start(self) -> None:
        """Have a worker ready on the current target: start one, or switch the running one (measure does this).

        A running worker that cannot switch (it died, hung or failed to load the new target, perhaps because of
        the previous one) is replaced by a fresh one; TunekitError when a fresh one cannot load the target either.
        """
        if self._busy:
            self._kill()  # an earlier request was cut short: its reply may still come, the worker's state is unknown
        if self._worker is not None and self._worker.running():
            if self._loaded == self._init:
                return
            try:
                self._load("could not switch to " + self._target())
                return
            except TunekitError as exc:
                logger.warning("tunekit: %s; starting a fresh worker", exc)
                self._kill()
                self.restarts += 1
        self._spawn()
        self._load("did not start")

    def measure(self, config: Config, verify_seed: int) -> TrialRecord:
        """Verify then time `config` in the worker (tunekit.tuning.verify.measure); a fatal fault is a failed record."""
        return self._run(config, {"op": "measure", "config": dict(config), "verify_seed": verify_seed})

    def retime(self, config: Config) -> TrialRecord:
        """Time `config` again (the winner's confirmation), no verification."""
        return self._run(config, {"op": "time", "config": dict(config)})

    def precompile(self, configs: list[Config], threads: int) -> None:
        """Compile `configs` in the worker on `threads` threads (tunekit.tuning.precompile). A worker that hangs or
        dies doing it is replaced: the configs are then compiled, or fail, when measured."""
        self.start()
        self._busy = True
        try:
            self._send({"op": "precompile", "configs": [dict(c) for c in configs], "threads": threads})
            reply = self._receive(self.timeout_s)
            self._busy = False
        except (WorkerTimeout, WorkerDied):
            self._kill()
            self.restarts += 1
            return
        self.last_phases = {"compile": float(reply.get("compiled", 0.0))}

    @property
    def pid(self) -> int | None:
        return self._worker.proc.pid if self._worker is not None else None

    def close(self) -> None:
        worker = self._worker
        if worker is None:
            return
        if self._busy:  # interrupted mid-candidate (Ctrl-C, an exception): the worker may be hung; no goodbye
            self._kill()
            return
        try:
            self._send({"op": "exit"})
            worker.proc.wait(timeout=EXIT_GRACE_S)
        except (WorkerDied, subprocess.TimeoutExpired):
            pass
        self._kill()

    def __enter__(self) -> IsolatedBench:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------- internals

    def _run(self, config: Config, request: dict[str, Any]) -> TrialRecord:
        self.last_phases = {}
        self.start()
        self._busy = True
        try:
            self._send(request)
            reply = self._receive(self.timeout_s)
            self._busy = False
        except WorkerTimeout:
            self._kill()
            self.restarts += 1
            return TrialRecord(
                dict(config),
                "failed",
                error=f"timeout: no result within {self.timeout_s:g} s (candidate timeout); the worker was killed",
            )
        except WorkerDied as died:
            self.restarts += 1
            return TrialRecord(dict(config), "failed", error=f"worker died: {died}")
        if "bug" in reply:
            self._kill()
            raise TunekitError(
                f"benchmarking {self.spec.name} config {dict(config)} raised {reply['bug']} in the worker "
                f"(not a known kernel failure, so a bug):\n{reply.get('traceback', '')}"
            )
        record = TrialRecord.from_json(reply["record"])
        self.last_phases = {str(k): float(v) for k, v in reply.get("phases", {}).items()}
        if reply.get("fatal"):
            # The device context is unusable after this candidate: the next one gets a fresh worker.
            self._kill()
            self.restarts += 1
        return record

    def _spawn(self) -> None:
        self._kill()
        self._worker = spawn_worker()
        self.started += 1

    def _load(self, failed: str) -> None:
        """Send the current target to the running worker and wait until it has built the inputs."""
        self._busy = True  # interrupted while the worker loads, close() kills it rather than wait
        try:
            self._send(self._init)
            reply = self._receive(self.startup_timeout_s)
            self._busy = False
        except WorkerTimeout:
            tail = self._worker.stderr_tail() if self._worker is not None else ""
            self._kill()
            raise TunekitError(
                f"the benchmarking worker for {self.spec.name} {failed}: no reply within "
                f"{self.startup_timeout_s:g} s" + (f" ({tail})" if tail else "")
            ) from None
        except WorkerDied as exc:
            raise TunekitError(f"the benchmarking worker for {self.spec.name} {failed}: {exc}") from None
        if "ok" not in reply:
            self._kill()
            raise TunekitError(
                f"the benchmarking worker could not load kernel {self.spec.name}: "
                f"{reply.get('error') or reply.get('bug')}"
            )
        self._loaded = self._init

    def _target(self) -> str:
        return f"{self.spec.name} " + ",".join(f"{k}={v}" for k, v in self._init["problem"].items())

    def _send(self, message: dict[str, Any]) -> None:
        assert self._worker is not None
        try:
            self._worker.send(message)
        except WorkerDied:
            self._kill()  # gone: the next request starts a fresh worker
            raise

    def _receive(self, timeout_s: float) -> dict[str, Any]:
        assert self._worker is not None
        try:
            return self._worker.receive(timeout_s)
        except WorkerDied:
            self._kill()
            raise

    def _kill(self) -> None:
        self._busy = False
        self._loaded = None
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()


if __name__ == "__main__":  # the worker process: `python -m tunekit.tuning.isolation <parent pid>`
    from tunekit.tuning.isolation_worker import serve

    serve(int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid())
