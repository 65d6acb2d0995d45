"""Which of the memory suite's targets can hold against these baselines at all: a CPU-only reading of the H200 run.

A row's fraction of copy for an implementation is the copy's time / the implementation's (the report's
tunekit/copy), and tunekit's speedup over a baseline X is X's time / tunekit's = (tunekit's fraction of copy) /
(X's fraction of copy). So "vs X >= T" over a group needs geomean(tunekit/copy) >= T * geomean(X/copy). For every
target of tunekit.evaluation.suite.TARGETS, over the same rows as the report's summary (the report's groups, rows timed
with CUDA events), this prints the measured geomean and the geomean tunekit would reach if it ran
  - exactly at the speed of the copy of the same bytes on every row ("at copy"),
  - at the best fraction of copy any implementation measured on that row (tunekit, its heuristic, torch,
    torch.compile: "at row best"), and
  - at the 1 GiB copy's rate (the roofline, which no problem of these sizes reaches, not even as a copy).
For "vs X" targets it also prints the tunekit/copy geomean the target needs and on how many rows it would take
tunekit faster than a copy. Then one table per family: each implementation's fraction of copy per row and, for
each "vs X" target, the fraction of copy tunekit needs on that row (T * X/copy; above 1: faster than a copy; the
target is a geomean, so rows can trade, but a row marked * cannot hold on its own).

Run: python3 tests/gpu/memory_ceiling.py [cache/bench/h200-sm90-132sm/memory.json]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tunekit.evaluation.names import COPY, COPY_RATIO, EVENTS, HEURISTIC, TUNEKIT
from tunekit.evaluation.results import Row, _groups, geomean, read_run
from tunekit.evaluation.suite import TARGETS, Target

DEFAULT_RUN = Path(__file__).resolve().parents[2] / "cache" / "bench" / "h200-sm90-132sm" / "memory.json"
IMPLS = (TUNEKIT, HEURISTIC, "torch", "torch.compile")


def of_copy(row: Row, impl: str) -> float | None:
    """The copy's time / the implementation's on this row (None when either was not timed with events)."""
    return row.speedup(impl, COPY)


def row_best(row: Row) -> float | None:
    """The best fraction of copy any implementation measured on this row."""
    found = [f for f in (of_copy(row, impl) for impl in IMPLS) if f is not None]
    return max(found) if found else None


def over_roofline(row: Row, impl: str) -> float | None:
    """The implementation's time / the roofline's (1 GiB copy rate): what tunekit at the roofline would be 'vs' it."""
    ms = row.ms(impl)
    return None if ms is None or not row.roofline_ms else ms / row.roofline_ms


def members(target: Target, rows: list[Row]) -> list[Row]:
    """The rows the report's summary judges this target on (same family, group and timing)."""
    mine = [r for r in rows if r.family == target.family and r.timing == EVENTS]
    return dict(_groups(target.family, mine)).get(target.group, [])


def _gm(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None and v > 0]
    return geomean(kept) if len(kept) == len(values) else None


def _fmt(value: float | None, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{suffix}"


def target_line(target: Target, rows: list[Row]) -> str:
    what = f"{target.family} [{target.group}] {target.ratio} >= {target.minimum:.2f} ({len(rows)} rows)"
    tk = [of_copy(r, TUNEKIT) for r in rows]
    best = [row_best(r) for r in rows]
    roof = [over_roofline(r, COPY) for r in rows]
    if target.ratio == COPY_RATIO:
        return (
            f"{what}: measured {_fmt(_gm(tk))}; at row best {_fmt(_gm(best))}; at the 1 GiB roofline {_fmt(_gm(roof))}"
        )
    x = target.ratio.removeprefix("vs ")
    x_frac = [of_copy(r, x) for r in rows]
    if _gm(x_frac) is None:
        return f"{what}: {x} not timed on every row"
    measured = _gm([r.speedup(TUNEKIT, x) for r in rows])
    need = target.minimum * _gm(x_frac)
    at_copy = _gm([1.0 / f for f in x_frac])
    at_best = _gm([b / f for b, f in zip(best, x_frac)] if None not in best else [None])
    at_roof = _gm([over_roofline(r, x) for r in rows])
    past_copy = sum(target.minimum * f > 1.0 for f in x_frac)
    verdict = "reachable at copy speed" if at_copy >= target.minimum else "NOT reachable even at copy speed"
    return (
        f"{what}: measured {_fmt(measured, 'x')}; {x} runs at {_fmt(_gm(x_frac))} of copy, so tunekit needs "
        f"{target.minimum:.2f} x {_fmt(_gm(x_frac))} = {need:.2f} of copy (now {_fmt(_gm(tk))}); "
        f"at copy {at_copy:.2f}x, at row best {_fmt(at_best, 'x')}, at the 1 GiB roofline {_fmt(at_roof, 'x')}; "
        f"{past_copy} of {len(rows)} rows need tunekit faster than a copy -> {verdict}"
    )


def family_table(family: str, rows: list[Row]) -> list[str]:
    """Per row: fractions of copy, and what each 'vs X' target of the family needs tunekit at."""
    vs = [t for t in TARGETS if t.family == family and t.ratio != COPY_RATIO]
    head = ["problem", *IMPLS, "row best"] + [f"needs for {t.ratio} >= {t.minimum:.1f}" for t in vs]
    lines = [f"{family} (fractions of copy: the copy's time / the implementation's)"]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in rows:
        cells = [row.label] + [_fmt(of_copy(row, impl)) for impl in IMPLS] + [_fmt(row_best(row))]
        for t in vs:
            f = of_copy(row, t.ratio.removeprefix("vs "))
            cells.append("-" if f is None else f"{t.minimum * f:.2f}" + (" *" if t.minimum * f > 1.0 else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", type=Path, default=DEFAULT_RUN, help="a `tunekit bench --json` file")
    args = parser.parse_args()
    run = read_run(args.run)
    print(f"{args.run.name}: {run.device}, torch {run.torch_version}, triton {run.triton_version}")
    targeted = [t for t in TARGETS if any(r.family == t.family for r in run.rows)]
    for target in targeted:
        print(target_line(target, members(target, run.rows)))
    for family in dict.fromkeys(t.family for t in targeted):
        rows = [r for r in run.rows if r.family == family and r.timing == EVENTS]
        print()
        print("\n".join(family_table(family, rows)))
    print("\n*: the target needs tunekit faster than the copy of the same bytes on that row")


if __name__ == "__main__":
    main()
