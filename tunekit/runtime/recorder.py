"""Record the problems a model run meets, as a plan for `tunekit tune --plan` and the fleet.

    with tunekit.record_problems("plan.jsonl") as seen:
        model(batch)
    # plan.jsonl: one {"kernel": ..., "problem": {...}} per distinct (kernel, problem), in first-seen order

A kernel that declares token buckets (tunekit/core/buckets.py: GEMM's m) is recorded by the bucket edges around each
token count met, not the count itself, so a plan over many batch sizes stays bounded (at most ~2 edges per octave
per layer shape) and dispatch serves the counts between tuned edges from them (layer "bucket"). Such a line also
says which counts it stands for: {"kernel", "problem": {... "m": 1024 ...}, "serves": {"m": [1000, 1010]}}.
`record_problems(path, buckets=False)` records every count as its own problem.

Dispatch tells the active recorders about a problem on its memo miss path only (once per key per process), so
the memo-hit hot path pays nothing; entering a recorder clears the dispatch memos so that every problem the run
meets passes the miss path once more (dispatch registers that reset in ON_ENTER: this module imports nothing of
dispatch's). Kept free of heavy imports: dispatch imports it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any

from tunekit.core.errors import TunekitError

ACTIVE: list[ProblemRecorder] = []  # dispatch reads this on a memo miss: empty unless a recording is on
_LOCK = threading.Lock()
ON_ENTER: list[Callable[[], None]] = []  # run on entering a recording (dispatch: forget its memos)


def plan_line(kernel: str, problem: Mapping[str, Any]) -> str:
    """One line of a plan file (the format `tunekit.fleet.plans.read_plan` reads)."""
    return json.dumps({"kernel": kernel, "problem": dict(problem)}, sort_keys=True)


def write_plan(
    path: Path | str,
    plan: Iterable[tuple[str, Mapping[str, Any]]],
    serves: Mapping[str, Mapping[str, Any]] | None = None,
) -> int:
    """Write a plan file (JSON lines, duplicates dropped); returns the number of problems. A problem its kernel's
    declaration refuses is a TunekitError, and nothing is written. `serves`: by plan line, the token counts that
    line's bucket edge stands for (`bucket_representatives`), written with it."""
    from tunekit.core.problems import checked_items

    lines = list(dict.fromkeys(plan_line(kernel, problem) for kernel, problem in checked_items(plan)))
    if serves:
        lines = [json.dumps({**json.loads(line), "serves": serves[line]}, sort_keys=True) if line in serves else line
                 for line in lines]  # fmt: skip
    try:
        Path(path).write_text("".join(line + "\n" for line in lines))
    except OSError as exc:
        raise TunekitError(f"cannot write the plan {path}: {exc}") from None
    return len(lines)


def bucket_representatives(
    plan: Iterable[tuple[str, Mapping[str, Any]]],
) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, dict[str, list[int]]]]:
    """The plan with each token count between two bucket edges replaced by those edges (kernels that declare token
    buckets; first-seen order, duplicates dropped), and by plan line the counts each edge stands for."""
    from tunekit.core.registry import get_spec

    out: dict[str, tuple[str, dict[str, Any]]] = {}
    serves: dict[str, dict[str, list[int]]] = {}
    for kernel, problem in plan:
        buckets = None if ":" in kernel else get_spec(kernel).token_buckets  # a user kernel (module:name): none
        edges = [dict(problem)] if buckets is None else buckets.representatives(problem)
        for edge in edges:
            line = plan_line(kernel, edge)
            out.setdefault(line, (kernel, edge))
            if buckets is not None and edge != dict(problem):
                counts = serves.setdefault(line, {buckets.field: []})[buckets.field]
                counts.append(int(problem[buckets.field]))
    return list(out.values()), {line: {f: sorted(set(v)) for f, v in s.items()} for line, s in serves.items()}


class ProblemRecorder:
    """The distinct (kernel, problem) pairs dispatch resolved while active, in first-seen order."""

    def __init__(self, path: Path | str | None = None, buckets: bool = True) -> None:
        self.path = Path(path) if path is not None else None
        self.buckets = buckets
        self._seen: dict[str, tuple[str, dict[str, Any]]] = {}

    @property
    def problems(self) -> list[tuple[str, dict[str, Any]]]:
        return [(kernel, dict(problem)) for kernel, problem in self._seen.values()]

    def note(self, kernel: str, problem: dict[str, Any]) -> None:
        line = plan_line(kernel, problem)
        with _LOCK:
            self._seen.setdefault(line, (kernel, dict(problem)))

    @property
    def plan(self) -> list[tuple[str, dict[str, Any]]]:
        """What `write` writes: the problems met, token counts between bucket edges replaced by the edges."""
        return bucket_representatives(self.problems)[0] if self.buckets else self.problems

    def write(self, path: Path | str) -> int:
        """Write the plan (JSON lines); returns the number of problems."""
        if not self.buckets:
            return write_plan(path, self.problems)
        return write_plan(path, *bucket_representatives(self.problems))

    def __enter__(self) -> ProblemRecorder:
        for reset in ON_ENTER:
            reset()
        with _LOCK:
            ACTIVE.append(self)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with _LOCK:
            ACTIVE.remove(self)
        if self.path is not None and exc_type is None:
            self.write(self.path)


def record_problems(path: Path | str | None = None, buckets: bool = True) -> ProblemRecorder:
    """A context manager recording every (kernel, problem) the ops resolve; writes a plan to `path` on exit (with
    `buckets`, token counts between bucket edges as the edges: the module's docstring)."""
    return ProblemRecorder(path, buckets)


@contextmanager
def paused() -> Iterator[None]:
    """No recording inside: for work that is no step of the model (a patch guard's check on a slice of the inputs),
    whose problems a plan must not hold."""
    with _LOCK:
        held = list(ACTIVE)
        ACTIVE.clear()
    try:
        yield
    finally:
        with _LOCK:
            ACTIVE[:0] = held


def note(kernel: str, problem: dict[str, Any]) -> None:
    """Called by dispatch on a memo miss while a recording is on."""
    for recorder in list(ACTIVE):
        recorder.note(kernel, problem)
