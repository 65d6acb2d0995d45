"""The benchmark report's tables and summary: rows by family, ratios to the baselines, the suite's targets judged."""

from __future__ import annotations

from io import StringIO
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


from tunekit.evaluation.names import BOUND_RATIO, COPY, COPY_RATIO, GRAPH, TUNEKIT, WALL
from tunekit.evaluation.results import (
    MATMUL_SIZE,
    BenchRun,
    Row,
    baseline_names,
    row_impls,
    row_ratio,
    rows_by_family,
    summarize,
)

# ---------------------------------------------------------------------------------------------- tables


def _cell(row: Row, impl: str) -> str:
    m = row.get(impl)
    if m is None:
        return ""
    if m.status != "ok" or m.ms is None:
        return {"wrong": "WRONG", "skipped": "n/a"}.get(m.status, m.status)
    if m.timing == WALL:
        return f"{m.ms:.2f} ms"
    if m.timing == GRAPH:
        return f"{m.ms * 1e3:.1f} µs"
    if row.launch_bound:  # not captured in a launch-bound row: its µs include the launch overhead
        return f"{m.ms * 1e3:.1f} µs (events)"
    value = row.throughput_at(m.ms)
    return "-" if value is None else f"{value:.0f}" if value >= 10 else f"{value:.2f}"


def _ratio_cell(value: float | None, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{suffix}"


def _bound_cell(row: Row, run: BenchRun) -> tuple[str, str]:
    """(the bound, tunekit as a fraction of it): roofline for throughput rows, launch floor for launch-bound rows."""
    ms = row.ms(TUNEKIT)
    if row.launch_bound:
        floor = run.launch_floor_ms
        if floor is None:
            return "-", "-"
        return f"floor {floor * 1e3:.1f} µs", f"{floor / ms:.2f}" if ms else "-"
    if row.roofline_ms is None:
        return "-", "-"
    best = row.throughput_at(row.roofline_ms)
    return (f"{best:.0f}" if best is not None else "-"), _ratio_cell(row_ratio(row, BOUND_RATIO))


def _check_cell(row: Row) -> str:
    bad = [f"{m.impl} {m.status}" for m in row.measurements if m.status in ("wrong", "failed", "timeout")]
    return "ok" if not bad else ", ".join(bad)


def tables(run: BenchRun) -> list[Table]:
    from rich.table import Table

    result = []
    for family, rows in rows_by_family(run.rows).items():
        impls = row_impls(rows)
        baselines = baseline_names(impls)
        with_copy = COPY in impls
        if run.interpreted:
            unit = "interpreter wall-clock, not GPU performance"
        else:
            unit = "TFLOP/s" if rows[0].bound == "compute" else "GB/s"
            unit += "; launch-bound rows (CUDA graphs): µs per call"
        table = Table(title=f"{family}: {unit}", title_justify="left")
        table.add_column("problem")
        table.add_column("served by")
        for impl in impls:
            table.add_column(impl, justify="right")
        if not run.interpreted:
            table.add_column("roofline", justify="right")
            if with_copy:
                table.add_column(COPY_RATIO, justify="right")
            table.add_column(BOUND_RATIO, justify="right")
            for impl in baselines:
                table.add_column(f"vs {impl}", justify="right")
        table.add_column("check")
        for row in rows:
            tunekit = row.get(TUNEKIT)
            cells = [row.label, (tunekit.served_by or "-") if tunekit else "-"]
            cells += [_cell(row, impl) for impl in impls]
            if not run.interpreted:
                roof, bound = _bound_cell(row, run)
                cells += [roof, _ratio_cell(row_ratio(row, COPY_RATIO)), bound] if with_copy else [roof, bound]
                cells += [_ratio_cell(row.speedup(TUNEKIT, impl), "x") for impl in baselines]
            cells.append(_check_cell(row))
            table.add_row(*cells)
        result.append(table)
    return result


def header(run: BenchRun) -> str:
    """Where and how the run was measured, and the rates and floor its ratios are against (one item a line)."""
    lines = [f"{run.device}, torch {run.torch_version}, triton {run.triton_version}, timer {run.timer}"]
    if run.copy_gbps is not None:
        lines.append(f"copy bandwidth {run.copy_gbps:.0f} GB/s (1 GiB device-to-device, read + write)")
    if run.matmul_tflops is not None:
        lines.append(f"bf16 matmul {run.matmul_tflops:.0f} TFLOP/s (torch.matmul {MATMUL_SIZE}³)")
    if run.launch_floor_ms is not None:
        what = "ms wall-clock" if run.interpreted else "µs (empty Triton kernel, CUDA graph)"
        scale = 1.0 if run.interpreted else 1e3
        lines.append(f"launch floor {run.launch_floor_ms * scale:.2f} {what}")
    if not run.interpreted:
        lines.append(
            "vs X: X's time / tunekit's (above 1: tunekit faster); tunekit/bound: the roofline's time (launch-bound "
            "rows: the launch floor's) / tunekit's"
        )
    if not run.interpreted and any(r.get(COPY) is not None for r in run.rows):
        lines.append(
            "copy: one device-to-device copy of the row's bytes, timed like the row (what a problem of this size "
            "can reach); tunekit/copy: its time / tunekit's"
        )
    return "\n".join(lines)


def notes(run: BenchRun) -> list[str]:
    """Run notes, then each distinct reason an implementation was not timed (with how many rows it hit)."""
    counted: dict[str, int] = {}
    for row in run.rows:
        for m in row.measurements:
            if m.note:
                key = f"{row.family} {m.impl} {m.status}: {m.note}"
                counted[key] = counted.get(key, 0) + 1
    return run.notes + [f"{k} ({n} rows)" if n > 1 else k for k, n in counted.items()]


def _format_ratio(ratio: str, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" if ratio.startswith("vs ") else f"{value:.2f}"


def _left_out_text(left_out: dict[str, int]) -> str:
    return "; ".join(f"{n} {why}" for why, n in left_out.items())


def _rows_text(judged: dict[str, Any]) -> str:
    n, of = judged["rows"], judged["of"]
    text = f"{n} row{'s' if n != 1 else ''}" if n == of else f"{n} of {of} rows"
    return text + (f"; left out: {_left_out_text(judged['left_out'])}" if judged["left_out"] else "")


def target_line(judged: dict[str, Any]) -> str:
    """One target: what, the measured geomean, holds or missed by how much, and over which rows."""
    ratio, minimum, value = judged["ratio"], judged["minimum"], judged["value"]
    what = f"{judged['family']} [{judged['group']}] {ratio} >= {_format_ratio(ratio, minimum)}"
    if not judged["of"]:
        return f"{what}: not measured (no such rows timed with CUDA events in this run)"
    extra = [_rows_text(judged)]
    if judged.get(BOUND_RATIO) is not None:
        extra.insert(0, f"1 GiB roofline: {_format_ratio(BOUND_RATIO, judged[BOUND_RATIO])}")
    if value is None:
        return f"{what}: not measured ({'; '.join(extra)})"
    verdict = "holds" if judged["holds"] else f"missed by {_format_ratio(ratio, minimum - value)}"
    return f"{what}: {_format_ratio(ratio, value)} {verdict} ({'; '.join(extra)})"


def summary_table(summary: dict[str, Any]) -> Table:
    from rich.table import Table

    ratios = list(dict.fromkeys(r for g in summary["geomeans"] for r in g["ratios"]))
    table = Table(title=f"summary: geomeans over {summary['over']}", title_justify="left")
    for name in ("family", "rows", "n"):
        table.add_column(name)
    for ratio in ratios:
        table.add_column(ratio, justify="right")
    for g in summary["geomeans"]:
        cells = [g["family"], g["group"], str(g["rows"])]
        for ratio in ratios:
            s = g["ratios"].get(ratio)
            cell = "" if s is None else _format_ratio(ratio, s["geomean"])
            if s is not None and s["rows"] != s["of"]:
                cell += f" ({s['rows']}/{s['of']})"  # the others: n/a or not timed, said in the targets and notes
            cells.append(cell)
        table.add_row(*cells)
    return table


def print_summary(run: BenchRun, console: Console) -> None:
    summary = summarize(run)
    if summary is None:
        console.print("summary: none in the interpreter (wall-clock claims no ratio)", markup=False, highlight=False)
        return
    console.print(summary_table(summary))
    console.print(
        "targets (H200, fp16 and bf16; geomeans as above; 'of copy bandwidth' is tunekit/copy, the copy of the "
        "same bytes, with the 1 GiB roofline's tunekit/bound beside it):",
        markup=False,
        highlight=False,
    )
    for judged in summary["targets"]:
        console.print(f"  {target_line(judged)}", markup=False, highlight=False)


def print_report(run: BenchRun, console: Console) -> None:
    console.print(header(run), markup=False, highlight=False)
    for table in tables(run):
        console.print(table)
    for note in notes(run):
        console.print(f"note: {note}", markup=False, highlight=False)
    print_summary(run, console)


def print_saved_summary(run: BenchRun, console: Console) -> None:
    """`tunekit bench --summary F.json`: where the run was measured, then its summary, recomputed from the rows."""
    console.print(header(run), markup=False, highlight=False)
    print_summary(run, console)


def render(run: BenchRun, width: int = 200, summary_only: bool = False) -> str:
    """The whole report as plain text (what `tunekit bench` prints); `summary_only`: what `--summary` prints."""
    from rich.console import Console

    buffer = StringIO()
    console = Console(file=buffer, width=width, no_color=True, highlight=False)
    (print_saved_summary if summary_only else print_report)(run, console)
    return buffer.getvalue()
