"""The model benchmark's PNG: one group of bars per (model, run), one bar per variant, each its speed against eager
of the same model and run (eager itself is the line at 1). Needs matplotlib, like `tunekit plot`."""

from __future__ import annotations

from pathlib import Path

from tunekit.core.errors import TunekitError
from tunekit.evaluation.model_results import Result, speed_vs_eager
from tunekit.evaluation.plot import DPI, MIN_HEIGHT_IN, WIDTH_IN, require_matplotlib

Bars = dict[str, list[float | None]]  # variant -> its speed in each group (None: not measured there)


def speed_bars(results: list[Result]) -> tuple[list[str], Bars]:
    """(group labels "model run", bars per variant but eager) in the order the rows were measured."""
    speeds = speed_vs_eager(results)
    groups = list(dict.fromkeys((model, run) for model, run, _ in speeds))
    variants = [v for v in dict.fromkeys(variant for _, _, variant in speeds) if v != "eager"]
    bars = {v: [speeds.get((model, run, v)) for model, run in groups] for v in variants}
    return [f"{model} {run}" for model, run in groups], bars


def plot_speeds(results: list[Result], out: Path, title: str) -> Path:
    """Draw `speed_bars` of `results` to `out` (a PNG); returns `out`."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    groups, bars = speed_bars(results)
    if not bars:
        raise TunekitError("no variant was measured against eager: nothing to draw")
    fig = Figure(figsize=(WIDTH_IN, MIN_HEIGHT_IN + 1), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    width = 0.8 / len(bars)
    for i, (variant, speeds) in enumerate(bars.items()):
        xs = [g - 0.4 + width * (i + 0.5) for g, s in enumerate(speeds) if s is not None]
        ax.bar(xs, [s for s in speeds if s is not None], width=width, label=variant, color=f"C{i % 10}")
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="eager")
    ax.set_xticks(range(len(groups)), groups, fontsize=9)
    ax.set_ylabel("speed vs eager (×): higher is better ↑")
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=min(4, len(bars) + 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI)
    return out
