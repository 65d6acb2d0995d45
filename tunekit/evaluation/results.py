"""The benchmark report's data: rows, measurements, a run and its JSON file; the implementation and ratio names the
suite's targets and the tables share (tunekit.evaluation.report measures, tunekit.evaluation.report_tables prints)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunekit.evaluation.names import BOUND_RATIO, COPY, COPY_RATIO, EVENTS, GRAPH, HEURISTIC, TUNEKIT, WALL
from tunekit.store.bounded_file import load_json

if TYPE_CHECKING:
    from tunekit.evaluation.suite import Target


FORMAT = "tunekit-bench"
SCHEMA = 1
SMALL_PROBLEM_BYTES = 16 << 20  # below this a kernel runs in a few µs: launch overhead, not bandwidth
GRAPH_LAUNCHES = 20
COPY_BYTES = 1 << 30
MATMUL_SIZE = 8192

AUTOGRAD_NOTE = "autograd backward: not captured in a CUDA graph, timed with events (launch overhead included)"


# ---------------------------------------------------------------------------------------------- pure arithmetic


def timing_method(bytes_moved: int, interpreted: bool, small_bytes: int = SMALL_PROBLEM_BYTES) -> str:
    """CUDA graphs for small problems on a GPU (launch-bound), CUDA events otherwise; wall-clock in the interpreter."""
    if interpreted:
        return WALL
    return GRAPH if bytes_moved < small_bytes else EVENTS


def roofline_ms(
    bound: str, bytes_moved: int, flops: int, copy_gbps: float | None, matmul_tflops: float | None
) -> float | None:
    """The fastest the problem could run: its minimum bytes at copy bandwidth, and for GEMMs also its flops at the
    measured matmul rate (whichever takes longer). None without the measured rates (the interpreter)."""
    if copy_gbps is None or copy_gbps <= 0:
        return None
    memory_ms = bytes_moved / (copy_gbps * 1e9) * 1e3
    if bound != "compute":
        return memory_ms
    if matmul_tflops is None or matmul_tflops <= 0:
        return None
    return max(memory_ms, flops / (matmul_tflops * 1e12) * 1e3)


# ---------------------------------------------------------------------------------------------- results


@dataclass
class Measurement:
    impl: str
    status: str = "ok"  # ok | wrong (failed the check, never timed) | failed | skipped | timeout
    ms: float | None = None
    timing: str = ""
    note: str = ""
    served_by: str | None = None  # tunekit: the dispatch layer that served the config
    config: dict[str, Any] | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Measurement:
        return cls(**data)


@dataclass
class Row:
    family: str
    kernel: str
    label: str
    problem: dict[str, Any]
    bound: str  # memory | compute: the roofline it is held to
    bytes_moved: int
    flops: int
    timing: str  # cuda-events | cuda-graph (launch-bound) | interpreter-wall-clock
    roofline_ms: float | None
    measurements: list[Measurement] = field(default_factory=list)

    @property
    def launch_bound(self) -> bool:
        return self.timing == GRAPH

    def get(self, impl: str) -> Measurement | None:
        return next((m for m in self.measurements if m.impl == impl), None)

    def ms(self, impl: str) -> float | None:
        m = self.get(impl)
        return m.ms if m is not None and m.status == "ok" else None

    def throughput(self, impl: str) -> float | None:
        """GB/s (memory-bound) or TFLOP/s (compute-bound); None for launch-bound and interpreter rows."""
        ms = self.ms(impl)
        return None if ms is None else self.throughput_at(ms)

    def throughput_at(self, ms: float) -> float | None:
        if self.timing != EVENTS or ms <= 0:
            return None
        if self.bound == "compute":
            return self.flops / (ms * 1e-3) / 1e12
        return self.bytes_moved / (ms * 1e-3) / 1e9

    def speedup(self, impl: str, over: str) -> float | None:
        """How many times faster `impl` ran than `over` (both from this row, this run, timed the same way: a CUDA
        graph replay and an events time of a launch-bound problem measure different things)."""
        mine, theirs = self.get(impl), self.get(over)
        if mine is None or theirs is None or mine.timing != theirs.timing:
            return None
        a, b = self.ms(impl), self.ms(over)
        return None if a is None or b is None or a <= 0 else b / a

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Row:
        fields = dict(data)
        fields["measurements"] = [Measurement.from_json(m) for m in data["measurements"]]
        return cls(**fields)


@dataclass
class BenchRun:
    device: str
    timer: str
    interpreted: bool
    torch_version: str
    triton_version: str
    copy_gbps: float | None = None
    matmul_tflops: float | None = None
    launch_floor_ms: float | None = None
    small_problem_bytes: int = SMALL_PROBLEM_BYTES
    graph_launches: int = GRAPH_LAUNCHES
    notes: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The run, and its summary for readers of the JSON (recomputed from the rows on load, never read back)."""
        return {"format": FORMAT, "schema": SCHEMA, **asdict(self), "summary": summarize(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BenchRun:
        if data.get("format") != FORMAT or data.get("schema") != SCHEMA:
            from tunekit.core.errors import TunekitError

            raise TunekitError(f"not a {FORMAT} schema {SCHEMA} file (format={data.get('format')!r})")
        fields = {k: v for k, v in data.items() if k not in ("format", "schema", "summary")}
        fields["rows"] = [Row.from_json(r) for r in data["rows"]]
        return cls(**fields)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1, allow_nan=False))

    @classmethod
    def load(cls, path: Path) -> BenchRun:
        return cls.from_json(load_json(path, "the bench results"))  # the one bounded reader (never blocks)


def read_run(path: Path) -> BenchRun:
    """BenchRun.load, any failure one TunekitError naming the file."""
    from tunekit.core.errors import TunekitError

    try:
        return BenchRun.load(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TunekitError(f"cannot read {path} as a `tunekit bench --json` file: {exc}") from None


@dataclass(frozen=True)
class BenchOptions:
    compile: bool | None = None  # torch.compile (default mode): on for a GPU, off in the interpreter
    max_autotune: bool = False  # torch.compile mode="max-autotune", in a child process killed after the limit
    compile_timeout_s: float = 300.0
    heuristic: bool = True  # also time the kernel's heuristic default config
    compile_backend: str = "inductor"  # tests pass "eager" to exercise the plumbing in seconds


# ---------------------------------------------------------------------------------------------- summary


def row_impls(rows: list[Row]) -> list[str]:
    """Implementations in the order measured; the copy last, next to the roofline it stands beside."""
    seen = list(dict.fromkeys(m.impl for r in rows for m in r.measurements))
    return [i for i in seen if i != COPY] + [i for i in seen if i == COPY]


def baseline_names(impls: Iterable[str]) -> list[str]:
    """The implementations tunekit is compared with (vs X): neither tunekit's own nor the copy."""
    return [i for i in impls if i not in (TUNEKIT, HEURISTIC, COPY)]


def rows_by_family(rows: Iterable[Row]) -> dict[str, list[Row]]:
    grouped: dict[str, list[Row]] = {}
    for row in rows:
        grouped.setdefault(row.family, []).append(row)
    return grouped


SUMMARY_OVER = "rows timed with CUDA events (launch-bound rows left out)"


def row_ratio(row: Row, ratio: str) -> float | None:
    """tunekit's ratio on one row: to the copy of its bytes, to the roofline, or over a baseline ("vs X")."""
    if ratio == COPY_RATIO:
        return row.speedup(TUNEKIT, COPY)
    if ratio == BOUND_RATIO:
        ms = row.ms(TUNEKIT)
        return None if ms is None or ms <= 0 or row.roofline_ms is None else row.roofline_ms / ms
    return row.speedup(TUNEKIT, ratio.removeprefix("vs "))


def geomean(values: list[float]) -> float | None:
    import math

    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _why_missing(row: Row, ratio: str) -> str:
    """Why a row has no value for `ratio`: the first of tunekit and the other side that was not measured."""
    other = {COPY_RATIO: COPY, BOUND_RATIO: None}.get(ratio, ratio.removeprefix("vs "))
    for impl in (TUNEKIT, other):
        if impl is None:
            return "no roofline"
        m = row.get(impl)
        if m is None:
            return f"{impl} not measured"
        if m.status != "ok":
            status = "n/a" if m.status == "skipped" else m.status
            return f"{impl} {status}: {m.note}" if m.note else f"{impl} {status}"
    return "timed differently"


def ratio_stats(rows: list[Row], ratio: str) -> dict[str, Any]:
    """The geomean of `ratio` over the rows that have it, how many those are, and why the others do not."""
    values: list[float] = []
    left_out: dict[str, int] = {}
    for row in rows:
        value = row_ratio(row, ratio)
        if value is not None and value > 0:
            values.append(value)
        else:
            why = _why_missing(row, ratio)
            left_out[why] = left_out.get(why, 0) + 1
    return {"geomean": geomean(values), "rows": len(values), "of": len(rows), "left_out": left_out}


def _groups(family: str, rows: list[Row]) -> list[tuple[str, list[Row]]]:
    """(ALL, rows), then each of the family's groups (widths 2^k±1, GEMM size classes) with its rows."""
    from tunekit.evaluation.suite import ALL, families

    known = families().get(family)
    groups = [(ALL, rows)]
    for name, member in known.groups if known is not None else ():
        try:
            chosen = [r for r in rows if member(r.problem)]
        except (KeyError, TypeError, ValueError):  # a problem without the fields (a kernel outside the suite)
            chosen = []
        groups.append((name, chosen))
    return groups


def _summary_ratios(rows: list[Row]) -> list[str]:
    memory = [COPY_RATIO] if any(r.bound == "memory" for r in rows) else []
    return memory + [BOUND_RATIO] + [f"vs {impl}" for impl in baseline_names(row_impls(rows))]


def _judge(target: Target, stats: dict[str, Any], bound: dict[str, Any] | None) -> dict[str, Any]:
    value = stats["geomean"]
    judged: dict[str, Any] = {**asdict(target), "value": value, **{k: stats[k] for k in ("rows", "of", "left_out")}}
    judged["holds"] = value is not None and value >= target.minimum
    if bound is not None:  # "of copy bandwidth": the copy of the same bytes first, the 1 GiB roofline beside it
        judged[BOUND_RATIO] = bound["geomean"]
    return judged


def summarize(run: BenchRun) -> dict[str, Any] | None:
    """Per family and group, the geomean of every ratio over rows timed with CUDA events, and the issue's targets
    judged on them. None for an interpreter run (wall-clock claims no ratio)."""
    if run.interpreted:
        return None
    from tunekit.evaluation.suite import TARGETS  # after the check: it imports torch and Triton

    measured = rows_by_family(r for r in run.rows if r.timing == EVENTS)
    present = {r.family for r in run.rows}
    geomeans, members = [], {}
    for family, rows in measured.items():
        for group, chosen in _groups(family, rows):
            members[family, group] = chosen
            ratios = {ratio: ratio_stats(chosen, ratio) for ratio in _summary_ratios(rows)}
            geomeans.append({"family": family, "group": group, "rows": len(chosen), "ratios": ratios})
    targets = []
    for target in TARGETS:
        if target.family in present:  # a family measured only launch-bound says so: "not measured"
            chosen = members.get((target.family, target.group), [])
            bound = ratio_stats(chosen, BOUND_RATIO) if target.ratio == COPY_RATIO else None
            targets.append(_judge(target, ratio_stats(chosen, target.ratio), bound))
    return {"over": SUMMARY_OVER, "geomeans": geomeans, "targets": targets}
