"""Where one problem's tuning seconds go, by phase: the one phase timer of `tunekit tune --plan`, tune_plan and the
fleet workers (tunekit.tuning.shared_bench times a problem; the fleet adds its queue's phases around it).

- startup: the bench for the problem: an isolation worker started or switched to it, its inputs built;
- compile: a candidate's first launch (Triton's JIT compile of the config, when it is not compiled yet);
- verify: fresh inputs, the reference and the output check;
- bench: timed runs (the search's and the winner's confirmation);
- torch: torch's own op timed as a candidate (tunekit.tuning.torch_candidate);
- store: entries written (the checkpoint after each measurement and the result);
- other: the rest of the problem's wall time (the sampler, the model, store reads, the bench's messages).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

PHASES = ("startup", "compile", "verify", "bench", "torch", "store", "other")


@dataclass
class PhaseTimes:
    """Seconds per phase (PHASES) of one problem, or summed over several."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    def add(self, phase: str, seconds: float) -> None:
        if phase not in self.seconds:
            raise ValueError(f"unknown phase {phase!r} (phases: {', '.join(PHASES)})")
        self.seconds[phase] += max(0.0, seconds)

    def merge(self, other: Mapping[str, float]) -> None:
        for phase, seconds in other.items():
            self.add(phase, seconds)

    @contextlib.contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - start)

    def close(self, wall_s: float) -> None:
        """The problem took `wall_s` in all: what no phase counted is `other`."""
        counted = sum(s for p, s in self.seconds.items() if p != "other")
        self.seconds["other"] = max(self.seconds["other"], wall_s - counted)

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def to_json(self) -> dict[str, float]:
        return {phase: round(self.seconds[phase], 4) for phase in PHASES}

    def describe(self) -> str:
        """`startup 0.10, compile 1.20, ... s`: every phase, in PHASES order."""
        return ", ".join(f"{phase} {self.seconds[phase]:.2f}" for phase in PHASES) + " s"

    @classmethod
    def summed(cls, parts: Iterable[Mapping[str, float]]) -> PhaseTimes:
        total = cls()
        for part in parts:
            total.merge(part)
        return total


class Stopwatch:
    """Splits one candidate's measurement into phases: `lap(phase)` gives the seconds since the last lap to it."""

    def __init__(self, into: dict[str, float] | None) -> None:
        self.into = into
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        if self.into is not None:
            self.into[phase] = self.into.get(phase, 0.0) + now - self._last
        self._last = now
