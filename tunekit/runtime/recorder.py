"""Record the problems a model run meets, as a plan for `tunekit tune --plan` and the fleet.

    with tunekit.record_problems("plan.jsonl") as seen:
        model(batch)
    # plan.jsonl: one {"kernel": ..., "problem": {...}} per distinct (kernel, problem), in first-seen order

Dispatch tells the active recorders about a problem on its memo miss path only (once per key per process), so
the memo-hit hot path pays nothing; entering a recorder clears the dispatch memos so that every problem the run
meets passes the miss path once more (dispatch registers that reset in ON_ENTER: this module imports nothing of
dispatch's). Kept free of heavy imports: dispatch imports it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Mapping
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


def write_plan(path: Path | str, plan: Iterable[tuple[str, Mapping[str, Any]]]) -> int:
    """Write a plan file (JSON lines, duplicates dropped); returns the number of problems. A problem its kernel's
    declaration refuses is a TunekitError, and nothing is written."""
    from tunekit.core.problems import checked_items

    lines = list(dict.fromkeys(plan_line(kernel, problem) for kernel, problem in checked_items(plan)))
    try:
        Path(path).write_text("".join(line + "\n" for line in lines))
    except OSError as exc:
        raise TunekitError(f"cannot write the plan {path}: {exc}") from None
    return len(lines)


class ProblemRecorder:
    """The distinct (kernel, problem) pairs dispatch resolved while active, in first-seen order."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._seen: dict[str, tuple[str, dict[str, Any]]] = {}

    @property
    def problems(self) -> list[tuple[str, dict[str, Any]]]:
        return [(kernel, dict(problem)) for kernel, problem in self._seen.values()]

    def note(self, kernel: str, problem: dict[str, Any]) -> None:
        line = plan_line(kernel, problem)
        with _LOCK:
            self._seen.setdefault(line, (kernel, dict(problem)))

    def write(self, path: Path | str) -> int:
        """Write the plan (JSON lines); returns the number of problems."""
        return write_plan(path, self.problems)

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


def record_problems(path: Path | str | None = None) -> ProblemRecorder:
    """A context manager recording every (kernel, problem) the ops resolve; writes a plan to `path` on exit."""
    return ProblemRecorder(path)


def note(kernel: str, problem: dict[str, Any]) -> None:
    """Called by dispatch on a memo miss while a recording is on."""
    for recorder in list(ACTIVE):
        recorder.note(kernel, problem)
