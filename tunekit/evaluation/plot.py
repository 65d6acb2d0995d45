"""PNGs of a benchmark run, one per family (and timing kind): achieved GB/s or TFLOP/s per shape against the roofline
(and, for memory-bound rows, a copy of the same bytes), launch-bound rows in µs against the launch floor,
interpreter rows in wall-clock ms (labelled as such). Every value axis says which direction is better.

It reads only the JSON of `tunekit bench --json`, so the PNG can be drawn on any machine with matplotlib (an
optional dependency: `pip install 'tunekit-triton[plot]'`), not only on the GPU box.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tunekit.core.errors import TunekitError
from tunekit.evaluation.names import COPY, EVENTS, GRAPH, WALL
from tunekit.evaluation.results import BenchRun, Row, read_run

if TYPE_CHECKING:
    from matplotlib.axes import Axes

ROW_HEIGHT_IN = 0.3  # inches of figure per problem row
PANEL_EXTRA_IN = 1.9  # title, axis labels and the legend below the bars
MIN_HEIGHT_IN = 3.5
WIDTH_IN = 9.0
DPI = 110  # 990 px wide; a 22-row family about 1,000 px tall
MAX_ROWS = 40  # rows per figure: a larger family (the GEMM suite's 120) is drawn in parts
_KIND_AXIS = {
    EVENTS: "",  # GB/s or TFLOP/s: decided by the family's bound
    GRAPH: "µs per call (CUDA graph replay; launch-bound)",
    WALL: "ms per call: Triton interpreter wall-clock on the CPU, not GPU performance",
}


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise TunekitError("drawing the PNG needs matplotlib: pip install 'tunekit-triton[plot]'") from None


def plot_file(results: Path, out: Path) -> list[Path]:
    return plot_run(read_run(results), out)


def _panels(run: BenchRun) -> list[tuple[str, str, list[Row]]]:
    """(family, timing kind, rows) in the order the rows were measured."""
    grouped: dict[tuple[str, str], list[Row]] = {}
    for row in run.rows:
        grouped.setdefault((row.family, row.timing), []).append(row)
    return [(family, kind, rows) for (family, kind), rows in grouped.items()]


def _value(row: Row, impl: str) -> float | None:
    """The bar of `impl` on this row's axis; None when not timed, or not timed the row's way (an autograd baseline
    timed with events in a launch-bound row is not a graph replay's µs)."""
    m, ms = row.get(impl), row.ms(impl)
    if m is None or ms is None or m.timing != row.timing:
        return None
    if row.timing == EVENTS:
        return row.throughput_at(ms)
    return ms * 1e3 if row.timing == GRAPH else ms


def _draw_panel(ax: Axes, run: BenchRun, family: str, kind: str, rows: list[Row], colours: dict[str, str]) -> None:
    impls = list(dict.fromkeys(m.impl for r in rows for m in r.measurements if m.impl != COPY))  # COPY: a marker
    height = 0.8 / max(1, len(impls))
    for i, impl in enumerate(impls):
        ys, xs = [], []
        for y, row in enumerate(rows):
            value = _value(row, impl)
            if value is not None:
                ys.append(y - 0.4 + height * (i + 0.5))
                xs.append(value)
        if xs:  # an implementation never timed here (wrong, failed, n/a) gets no legend entry; the JSON says why
            ax.barh(ys, xs, height=height, label=impl, color=colours[impl])
    if kind == EVENTS:
        roofs = [(y, row.throughput_at(row.roofline_ms)) for y, row in enumerate(rows) if row.roofline_ms]
        points = [(y, x) for y, x in roofs if x is not None]
        if points:
            ax.scatter(
                [x for _, x in points], [y for y, _ in points], marker="|", s=400, color="black", label="roofline"
            )
        copies = [(y, _value(row, COPY)) for y, row in enumerate(rows)]
        shown = [(y, x) for y, x in copies if x is not None]
        if shown:  # what a problem of this size can reach: the 1 GiB roofline is asymptotic
            cx, cy = [x for _, x in shown], [y for y, _ in shown]
            ax.scatter(cx, cy, marker="D", s=30, color="grey", label="copy of the same bytes", zorder=3)
        unit = "TFLOP/s" if rows[0].bound == "compute" else "GB/s"
        ax.set_xlabel(f"{unit}: higher is better → (roofline measured in this run)")
    else:
        if kind == GRAPH and run.launch_floor_ms is not None:
            ax.axvline(run.launch_floor_ms * 1e3, color="black", linestyle="--", label="launch floor")
        ax.set_xlabel(f"{_KIND_AXIS[kind]}: ← lower is better")
    ax.set_yticks(range(len(rows)), [row.label for row in rows], fontsize=9)
    ax.set_ylabel("problem (in the order measured)")
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first row at the top
    ax.set_title(_title(family, kind), fontsize=12)
    ax.grid(axis="x", alpha=0.3)
    handles = ax.get_legend_handles_labels()[0]
    # Below the bars: they keep the full width. Bar colours are the same implementation in every figure.
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=min(4, max(1, len(handles))))


def _suptitle(run: BenchRun) -> str:
    parts = [run.device, f"torch {run.torch_version}", f"triton {run.triton_version}"]
    if run.copy_gbps is not None:
        parts.append(f"copy {run.copy_gbps:.0f} GB/s")
    if run.matmul_tflops is not None:
        parts.append(f"bf16 matmul {run.matmul_tflops:.0f} TFLOP/s")
    return ", ".join(parts)


def _title(family: str, kind: str) -> str:
    return family if kind == EVENTS else f"{family}: {'launch-bound' if kind == GRAPH else 'interpreter'}"


def _figures(panels: list[tuple[str, str, list[Row]]]) -> list[tuple[str, str, list[Row], str, str]]:
    """(family, kind, rows, file name part, title) per figure: a panel of more than MAX_ROWS rows in parts."""
    figures = []
    for family, kind, rows in panels:
        name = family + ("-launch-bound" if kind == GRAPH else "")
        parts = [rows[i : i + MAX_ROWS] for i in range(0, len(rows), MAX_ROWS)]
        for n, part in enumerate(parts, 1):
            if len(parts) == 1:
                figures.append((family, kind, part, name, _title(family, kind)))
            else:
                title = f"{_title(family, kind)} (part {n} of {len(parts)})"
                figures.append((family, kind, part, f"{name}-part{n}", title))
    return figures


def plot_run(run: BenchRun, out: Path) -> list[Path]:
    """One PNG per family (and timing kind; a family of more than MAX_ROWS rows in parts), horizontal bars of every
    implementation per problem. Returns the files written: `out` itself when the run makes one figure, else
    `<out stem>-<family>[-launch-bound][-partN].png` beside it."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = _panels(run)
    if not panels:
        raise TunekitError("the run has no rows to draw")
    # One colour per implementation across every figure.
    impls = dict.fromkeys(m.impl for row in run.rows for m in row.measurements)
    colours = {impl: f"C{i % 10}" for i, impl in enumerate(impls)}
    figures = _figures(panels)
    out.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for family, kind, rows, name, title in figures:
        height = max(MIN_HEIGHT_IN, ROW_HEIGHT_IN * len(rows) + PANEL_EXTRA_IN)
        fig = Figure(figsize=(WIDTH_IN, height), layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.subplots()
        _draw_panel(ax, run, family, kind, rows, colours)
        ax.set_title(title, fontsize=12)
        fig.suptitle(_suptitle(run), fontsize=9)
        # `out` itself for a run of one figure; else `<out stem>-<figure name>.png` beside it.
        path = out if len(figures) == 1 else out.with_name(f"{out.stem}-{name}{out.suffix or '.png'}")
        fig.savefig(path, dpi=DPI)
        written.append(path)
    return written
