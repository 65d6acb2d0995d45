"""Which tunekit op call ran which problems in a model step, for the profiler to say what each call cost on the GPU.

While `attributing()` is on, every op call (a public op, and the inner steps its eager autograd Function runs
forward and backward) runs inside a profiler range named for it, and each problem dispatch serves inside it is
noted against it. A step calls each op in the same order whatever serves its problems (torch's op or a Triton
config), so the k-th call of an op is the same call in every run and serving: that is what lets
tunekit.evaluation.in_step compare servings call by call. (A serving may leave a call out: a patched loss that calls
torch directly where torch serves it; in_step does not compare that serving for it.)

Off (always, outside an attribution), nothing here runs: the two hooks are put on the classes for the attribution's
duration only, so an ordinary call pays nothing for them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from tunekit.core.spec import ProblemKey
from tunekit.runtime.dispatch import Dispatcher
from tunekit.runtime.hotpath import HotPath

RANGE = "tunekit.call#"  # a top-level call's range: RANGE + "<run>.<position>"
INNER = "tunekit.inner#"  # any other call's range: INNER + "<run>.<index>"
Problem = tuple[str, ProblemKey]  # (kernel, the op's problem key)
Inner = tuple[int, int]  # (run, index) of a call that is not top-level


def range_name(run: int, position: int, prefix: str = RANGE) -> str:
    return f"{prefix}{run}.{position}"


def parse_range(name: str, prefix: str = RANGE) -> tuple[int, int] | None:
    """(run, position or index) of a range named by `range_name` with `prefix`, else None."""
    if not name.startswith(prefix):
        return None
    run, _, position = name[len(prefix) :].partition(".")
    return (int(run), int(position)) if run.isdigit() and position.isdigit() else None


@dataclass
class Attribution:
    """What one attribution saw. A top-level call (a public op called by the step's own thread, not from inside
    another op) is named by its position: a number for (its op, k-th call of that op in the run), the same call in
    every run and serving. Any other call (nested in one, or run by autograd's backward) is named by its run and its
    index in that run; tunekit.evaluation.in_step finds which top-level call it belongs to from the profile. `notes`
    holds, per name, the problems dispatch served directly inside the call (not in calls nested in it)."""

    notes: dict[int | Inner, set[Problem]] = field(default_factory=dict)
    top: set[int] = field(default_factory=set)
    run: int = 0
    _calls: dict[str, int] = field(default_factory=dict)  # per op: its top-level calls so far in this run
    _positions: dict[tuple[str, int], int] = field(default_factory=dict)  # (op, k) -> position
    _inner: int = 0
    _thread: int = field(default_factory=threading.get_ident)
    _stacks: threading.local = field(default_factory=threading.local)
    _host_ns: dict[int, int] | None = None  # while timing_host: per top-level position, its host ns this run

    @contextmanager
    def timing_host(self) -> Iterator[dict[int, int]]:
        """Time each top-level call on the host (perf_counter, no profiler range) until the block ends; the dict
        yielded fills with each position's ns."""
        self._host_ns = {}
        try:
            yield self._host_ns
        finally:
            self._host_ns = None

    def begin_run(self, run: int) -> None:
        """The next step run starts: calls count from 0 again, ranges carry `run`."""
        self.run, self._inner = run, 0
        self._calls.clear()

    def _stack(self) -> list[int | Inner]:
        stack: list[int | Inner] | None = getattr(self._stacks, "stack", None)
        if stack is None:
            stack = self._stacks.stack = []
        return stack

    def call(self, hot: HotPath, run: Callable[[], Any]) -> Any:
        stack = self._stack()
        name: int | Inner
        if not stack and hot.public and threading.get_ident() == self._thread:
            k = self._calls.get(hot.name, 0)
            self._calls[hot.name] = k + 1
            name = self._positions.setdefault((hot.name, k), len(self._positions))
            self.top.add(name)
            label = range_name(self.run, name)
        else:
            name, self._inner = (self.run, self._inner), self._inner + 1
            label = range_name(*name, prefix=INNER)
        stack.append(name)
        host_ns = self._host_ns
        try:
            if host_ns is None:
                with torch.profiler.record_function(label):
                    return run()
            start = time.perf_counter_ns()
            try:
                return run()
            finally:
                if len(stack) == 1 and isinstance(name, int):
                    host_ns[name] = host_ns.get(name, 0) + time.perf_counter_ns() - start
        finally:
            stack.pop()

    def note(self, kernel: str, key: ProblemKey) -> None:
        stack = self._stack()
        if stack:
            self.notes.setdefault(stack[-1], set()).add((kernel, key))


_ACTIVE: list[Attribution] = []


@contextmanager
def attributing() -> Iterator[Attribution]:
    """Range every op call and note the problems dispatch serves in it, until the block ends. Not reentrant."""
    if _ACTIVE:
        raise RuntimeError("tunekit: an attribution is already running")
    attribution = Attribution()
    call, config = HotPath.__call__, Dispatcher.config

    def attributed_call(hot: HotPath, *args: Any, **kwargs: Any) -> Any:
        return attribution.call(hot, lambda: call(hot, *args, **kwargs))

    def noted_config(dispatcher: Dispatcher, key: ProblemKey) -> Any:
        attribution.note(dispatcher.kernel, key)
        return config(dispatcher, key)

    _ACTIVE.append(attribution)
    HotPath.__call__ = attributed_call  # type: ignore[method-assign]
    Dispatcher.config = noted_config  # type: ignore[method-assign]
    try:
        yield attribution
    finally:
        HotPath.__call__ = call  # type: ignore[method-assign]
        Dispatcher.config = config  # type: ignore[method-assign]
        _ACTIVE.clear()
