"""The isolation worker: the child process that loads one target at a time and measures candidates on request.

The parent (tunekit.tuning.isolation) starts it as `python -m tunekit.tuning.isolation <parent pid>`. The protocol
is one JSON object per line: requests on the worker's stdin, replies (to every request but the warm-up) on a private
copy of its stdout (the worker points fd 1 at stderr, so stray prints from kernels or libraries cannot break the
protocol). Nothing is pickled. The worker imports the kernel by module name (its registry entry, else the module
defining its launcher) with the parent's sys.path, and refuses a spec whose source hash differs from the parent's.
It exits when the parent dies.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from typing import Any

from tunekit.core import backend, registry
from tunekit.core.space import Config, Problem
from tunekit.core.spec import KernelSpec
from tunekit.store.entry import TrialRecord


def _warm(device_index: int | None) -> None:
    """What every target needs, done ahead: the CUDA context on the device, the measuring modules imported."""
    import torch

    import tunekit.tuning.bench
    import tunekit.tuning.verify  # noqa: F401

    if device_index is not None:
        torch.cuda.set_device(device_index)
        torch.empty(1, device="cuda")  # creates the context


class _LoadError(Exception):
    pass


class _Worker:
    """The worker's side: one kernel and problem, its bench inputs built once, candidates measured on request.

    A new init replaces it (`release` first): the process, its imports and its CUDA context serve the next target.
    """

    def __init__(self, request: dict[str, Any]) -> None:
        import torch

        from tunekit.tuning.bench import timer_from_json

        parent_path = [str(p) for p in request["sys_path"]]
        sys.path[:] = parent_path + [p for p in sys.path if p not in parent_path]
        try:
            module = importlib.import_module(request["module"])
        except Exception as exc:  # any import failure is reported to the parent
            raise _LoadError(f"cannot import {request['module']!r}: {exc.__class__.__name__}: {exc}") from exc
        spec = _find_spec(module, request["kernel"])
        if spec.source_hash != request["source_hash"]:
            raise _LoadError(
                f"{request['module']} defines {spec.name} with source hash {spec.source_hash}, but the tuner has "
                f"{request['source_hash']}: the worker would measure another kernel"
            )
        registry._loaded[spec.name] = spec
        if request.get("device_index") is not None:
            torch.cuda.set_device(int(request["device_index"]))
        self.spec = spec
        self.problem: Problem = request["problem"]
        self.device = backend.torch_device()
        self.device_index = request.get("device_index")
        self.timer = timer_from_json(request["timer"])
        self.inputs = spec.make_inputs(self.problem, self.device, int(request["seed"]))
        self.outputs = spec.alloc_outputs(self.inputs)
        self.canary: Config | None = None  # a config that passed: re-run to tell a broken context from a bad config

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        from tunekit.tuning.verify import measure, retime

        if request["op"] == "precompile":  # tunekit.tuning.precompile: compiled, nothing measured
            from tunekit.tuning.precompile import compile_all

            configs, threads = request["configs"], int(request["threads"])
            return {"compiled": compile_all(self.spec, configs, self.inputs, self.outputs, threads, self.device_index)}
        spec, config = self.spec, request["config"]
        phases: dict[str, float] = {}  # seconds by phase (tunekit.tuning.phases), sent back with the record
        if request["op"] == "measure":
            record = measure(
                spec, config, self.problem, self.device, self.inputs, self.outputs, self.timer, request["verify_seed"],
                phases,
            )  # fmt: skip
        elif request["op"] == "time":
            started = time.perf_counter()
            record = retime(spec, config, self.inputs, self.outputs, self.timer)
            phases["bench"] = time.perf_counter() - started
        else:
            raise ValueError(f"unknown request {request['op']!r}")
        fatal = False
        if record.status == "ok":
            if self.canary is None:
                self.canary = dict(config)
        else:
            fatal = not self._healthy(record)
        return {"record": record.to_json(), "fatal": fatal, "phases": phases}

    def release(self) -> None:
        """Free this target's tensors before the next target's are built (large problems must not coexist)."""
        import torch

        self.inputs = self.outputs = ()
        gc.collect()
        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    def _healthy(self, record: TrialRecord) -> bool:
        """After a candidate that was not ok: can this process still run kernels correctly?"""
        import torch

        try:
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
            if self.canary is None:
                # Nothing has passed yet to re-run: a runtime error may have poisoned the device, so start afresh.
                return not (record.status == "failed" and (record.error or "").startswith("RuntimeError"))
            self.spec.launch(self.canary, self.inputs, self.outputs)
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
        except Exception:  # any failure here means the process cannot be trusted any more
            return False
        return True


def _find_spec(module: Any, name: str) -> KernelSpec:
    candidates = [getattr(module, "SPEC", None), *vars(module).values()]
    for value in candidates:
        if isinstance(value, KernelSpec) and value.name == name:
            return value
    raise _LoadError(f"module {module.__name__} defines no KernelSpec named {name!r}")


def _exit_with_parent(parent: int) -> None:
    """Never outlive the tuner: PR_SET_PDEATHSIG where there is one, and a watchdog thread everywhere."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(1)

    threading.Thread(target=watch, name="tunekit-parent-watch", daemon=True).start()


def serve(parent: int) -> None:
    """The worker's loop: one request per line on stdin, one reply per line on the protocol fd."""
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # stray prints (kernels, libraries) go to stderr, never into the protocol
    sys.stdout = sys.stderr
    _exit_with_parent(parent)
    worker: _Worker | None = None
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("op") == "exit":
            break
        reply: dict[str, Any]
        if request.get("op") == "warm":  # no reply: a failure here shows again, and is reported, at init
            with contextlib.suppress(Exception):
                _warm(request.get("device_index"))
            continue
        try:
            if request.get("op") == "init":
                if worker is not None:  # retargeted: the previous inputs go first
                    worker.release()
                    worker = None
                worker = _Worker(request)
                reply = {"ok": True}
            elif worker is None:
                raise ValueError("the worker got a request before init")
            else:
                reply = worker.handle(request)
        except _LoadError as exc:
            reply = {"error": str(exc)}
        except Exception as exc:  # reported to the parent, which raises it there
            reply = {"bug": f"{exc.__class__.__name__}: {exc}", "traceback": traceback.format_exc()}
        protocol.write(json.dumps(reply) + "\n")
        protocol.flush()
