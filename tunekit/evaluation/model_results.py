"""What the model benchmark measures and reports, the parts that need no GPU (nor torch): the workload, a result
row, speed against eager, the printed table and the JSON document. The CLI builds its options from it; the
measuring itself is tunekit.evaluation.model_bench's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from tunekit.core.errors import TunekitError

MODELS = ("llama", "gpt2", "mistral", "qwen2", "gemma")  # tunekit.evaluation.model_families builds each
# "-ro": torch.compile(mode="reduce-overhead"), CUDA graphs; the others compile in the default mode
VARIANTS = ("eager", "tunekit", "compile", "tunekit+compile", "compile-ro", "tunekit+compile-ro", "liger")
# Opt-in (--variants): the unpatched model compiled with tunekit's tuned tiles as Inductor's GEMM choices, untuned
# GEMMs searched by Inductor (tunekit.integrations.inductor_choices); a first call as long as that search.
CHOICES_VARIANTS = ("tiles+compile", "tiles+compile-ro")
ALL_VARIANTS = (*VARIANTS[:-1], *CHOICES_VARIANTS, VARIANTS[-1])  # the order a run measures them in
RUNS = ("prefill", "decode", "train")
DTYPE_NAME = "bfloat16"  # every variant's dtype
# the variants dispatch serves: the ones the workflow reruns
TUNEKIT_VARIANTS = ("tunekit", "tunekit+compile", "tunekit+compile-ro", *CHOICES_VARIANTS)
TUNED_SUFFIX = " (tuned plan)"  # the workflow's rerun of a variant, served by the freshly tuned cache
# The distributions whose versions explain a run (importlib.metadata's names; a missing one is reported as None).
DISTRIBUTIONS = ("tunekit-triton", "torch", "triton", "transformers", "liger-kernel")


@dataclass(frozen=True)
class Workload:
    model: str  # one of MODELS
    layers: int = 2
    hidden: int = 4096
    prefill: tuple[int, int] = (4, 1024)  # batch, tokens
    decode: tuple[int, int] = (8, 1)
    train: tuple[int, int] = (4, 1024)
    vocab: int = 32000


@dataclass
class Result:
    model: str
    variant: str
    run: str
    ms: float
    tokens_per_s: float
    peak_gib: float  # peak allocated during the run, above what was allocated before it (weights included)
    logits_rel_err: float | None = None
    argmax_agree: float | None = None
    grad_rel_err: float | None = None
    notes: list[str] = field(default_factory=list)
    # the variant's first call of the run, seconds: with torch.compile, the compile time (and one run) it costs
    first_call_s: float | None = None
    # eager's time over the variant's, the median of per-round ratios where they were timed in alternation
    vs_eager: float | None = None


def skipped(model: str, variant: str, why: str) -> Result:
    """A variant that could not run on this model (not installed, no patch for it): one row that says why."""
    nan = float("nan")
    return Result(model, variant, "-", nan, nan, nan, notes=[why])


def rerun_variants(variants: tuple[str, ...]) -> tuple[str, ...]:
    """The variants the workflow reruns: those of `variants` that dispatch serves."""
    chosen = tuple(v for v in TUNEKIT_VARIANTS if v in variants)
    if not chosen:
        raise TunekitError(f"the workflow reruns {', '.join(TUNEKIT_VARIANTS)}: --variants names none of them")
    return chosen


def speed_vs_eager(results: Iterable[Result]) -> dict[tuple[str, str, str], float]:
    """(model, run, variant) -> eager's time over the variant's (above 1: faster than eager), for every measured
    row whose model and run have an eager time; eager's own rows are 1. Where the rows were timed in alternation,
    the median of their per-round ratios (`vs_eager`)."""
    results = list(results)
    eager = {(r.model, r.run): r.ms for r in results if r.variant == "eager" and not r.notes}
    speeds = {}
    for r in results:
        base = eager.get((r.model, r.run))
        if base is not None and not r.notes and r.ms > 0 and math.isfinite(r.ms):
            speeds[(r.model, r.run, r.variant)] = base / r.ms if r.vs_eager is None else r.vs_eager
    return speeds


def _cell(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def table(results: list[Result]) -> str:
    speeds = speed_vs_eager(results)
    width = max([16, *(len(r.variant) for r in results)])
    lines = [
        f"{'model':6} {'run':8} {'variant':{width}} {'ms':>8} {'vs eager':>9} {'tok/s':>10} {'peak GiB':>9} "
        f"{'logits err':>10} {'argmax':>7} {'grad err':>9} {'1st call s':>10}"
    ]
    for r in results:
        if r.notes:
            lines.append(f"{r.model:6} {'-':8} {r.variant:{width}} skipped: {r.notes[0]}")
            continue
        ratio = speeds.get((r.model, r.run, r.variant), float("nan"))
        lines.append(
            f"{r.model:6} {r.run:8} {r.variant:{width}} {r.ms:8.3f} {ratio:8.2f}x {r.tokens_per_s:10.0f} "
            f"{r.peak_gib:9.2f} {_cell(r.logits_rel_err, '10.4f'):>10} {_cell(r.argmax_agree, '7.3f'):>7} "
            f"{_cell(r.grad_rel_err, '9.4f'):>9} {_cell(r.first_call_s, '10.2f'):>10}"
        )
    return "\n".join(lines)


def versions() -> dict[str, str | None]:
    """The installed version of each distribution that explains a run; None where one is not installed."""
    found: dict[str, str | None] = {}
    for name in DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def document(results: list[Result], context: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document of a run: its context (workloads, device, versions, workflow, ...) and every result row.
    NaN (a skipped variant's numbers) becomes null: strict JSON has no NaN."""
    rows = [{k: _finite(v) for k, v in asdict(r).items()} for r in results]
    return {**(context or {}), "results": rows}


def _finite(value: Any) -> Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def write_json(results: list[Result], path: Path, context: Mapping[str, Any] | None = None) -> None:
    path.write_text(json.dumps(document(results, context), indent=1, allow_nan=False))
