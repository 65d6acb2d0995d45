"""RESULTS.md's tables rendered from the recorded JSON, so a table is never typed by hand and cannot drift from
what a run wrote. A folder of results holds `runs.json` (per file: date, commit, GPU, command, note) beside the
JSON files the benchmark wrote; `render(folder)` gives the markdown, and RESULTS.md holds it between
`<!-- generated: <folder> -->` and `<!-- end generated -->` (tests/test_results_tables.py checks they agree):

    python tests/results_tables.py cache/bench/h200-sm90-132sm/compiled_choices   # prints the block
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
END = "<!-- end generated -->"


def begin(folder: str) -> str:
    return f"<!-- generated: {folder} -->"


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}x"


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def _count(value: float | None) -> str:
    return "" if value is None else f"{value:.0f}"


def compiled_choices(document: dict[str, Any]) -> list[str]:
    """A `tests/gpu/compiled_choices_bench.py` document: a row per step, phase and variant (ms, vs compile's
    default mode and vs eager in the same alternation, the first call's seconds, kernels per step)."""
    rows = []
    for step, row in document["steps"].items():
        first, kernels = row.get("first_call_s", {}), row.get("kernels", {})
        for phase in ("before", "after"):
            for variant, timed in row.get(phase, {}).items():
                again = phase == "after" and variant != "tunekit (tuned)"
                rows.append(
                    f"| {document['model']} | {step} | {phase} | {variant} | {timed['ms']:.3f} | "
                    f"{_ratio(timed['vs_compile'])} | {_ratio(timed['vs_eager'] or None)} | "
                    f"{'' if again else _seconds(first.get(variant))} | "
                    f"{_count(kernels.get(variant)) if phase == 'after' else ''} |"
                )
    return rows


def render(folder: str) -> str:
    """The markdown of every run `folder`/runs.json lists, in its order."""
    runs = json.loads((ROOT / folder / "runs.json").read_text())
    lines = [
        "| model | step | phase | variant | ms | vs compile | vs eager | first call s | kernels |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    notes = []
    for i, run in enumerate(runs, 1):
        document = json.loads((ROOT / folder / run["file"]).read_text())
        lines += [line.replace("| ", f"| {i}. ", 1) for line in compiled_choices(document)]
        notes.append(
            f"{i}. {run['date']}, {run['commit']}, {run['gpu']}: `{run['command']}` ({run['note']}; `{run['file']}`)"
        )
    return "\n".join([*notes, "", *lines])


def block(text: str, folder: str) -> str | None:
    """The generated block for `folder` in `text` (RESULTS.md), without its markers; None where there is none."""
    start = text.find(begin(folder))
    if start < 0:
        return None
    end = text.index(END, start)
    return text[start + len(begin(folder)) : end].strip("\n")


if __name__ == "__main__":
    print(render(sys.argv[1]))
