"""What a torch.compile graph runs for each tunekit op: the op's Triton kernel, or the torch code Inductor fuses.

Inductor generates its own fused kernels for norms, RoPE, activations and residual adds, and picks GEMM kernels
itself. An opaque op in the middle of such a chain stops that fusion: patched models with every op a custom op ran
at 0.64-0.79x eager for decode and 0.86-0.90x for training under compile (Qwen2- and Mistral-family models on the
H200), where compile alone gave 2.6x and 1.2-1.3x. So under compile a kernel serves a problem only where it was
measured to beat what Inductor generates for it, both compiled: tunekit/tuning/inductor_candidate.py times the
entry's kernel as Inductor builds it and torch's op compiled for the problem, and keeps both with the entry
(`under_compile_*` fields). (Inductor's build of a tuned kernel can be slower than Triton's own: 8-10% on Qwen2-7B's
prefill GEMMs, 2.5x on one with a SiLU epilogue, H200; so the eager time says nothing here.) Where a kernel wins,
the op is a `torch.library.triton_op` whose launch becomes a Triton-kernel node of the graph (tunekit/launch/
traced.py): Inductor launches it itself, with no per-call dispatch of tunekit's. Where none wins, the op
traces as torch's own code, or a patched module's own forward: the graph compile alone builds.

TUNEKIT_COMPILE_OPS overrides the measurement: a comma list of op names, `all` or `none`. A listed op always traces
as tunekit's op and serves what it serves eagerly (for benchmarks that force a swap); the others trace as torch's.
The setting is read when this module is imported: a compiled graph treats it as a constant, so changing it means
compiling again (torch._dynamo.reset()).
"""

from __future__ import annotations

from collections.abc import Iterable

from tunekit.core import settings
from tunekit.core.errors import TunekitError
from tunekit.store.entry import Entry, under_compile_record

ALL = "all"  # TUNEKIT_COMPILE_OPS=all: every op (the op list lives with the ops: tunekit.ops.__all__)
# A kernel serves under compile only if it beats Inductor's time by more than this fraction (timing noise between
# two separately compiled kernels on the H200: METHOD.md's repeat-to-repeat spread of medians is ~1-2%).
MARGIN = 0.02


def _from_settings() -> frozenset[str] | None:
    """The ops TUNEKIT_COMPILE_OPS forces ({ALL} for all), or None (unset: measured per problem)."""
    raw = settings.compile_ops()
    if raw is None:
        return None
    if raw == ALL:
        return frozenset({ALL})
    if raw == "none":
        return frozenset()
    return frozenset(n.strip() for n in raw.split(",") if n.strip())


def check_forced_names(ops: Iterable[str]) -> None:
    """Refuse a TUNEKIT_COMPILE_OPS that names no op of `ops` (tunekit.ops checks its own list when imported)."""
    unknown = sorted((FORCED or frozenset()) - {ALL} - set(ops))
    if unknown:
        raise TunekitError(f"TUNEKIT_COMPILE_OPS must name ops of {', '.join(ops)} (or all, none), but got {unknown}")


FORCED: frozenset[str] | None = _from_settings()
# Kernels whose measured choices count (None: all): what the model-level check (tunekit/evaluation/
# compile_verify.py) narrows to time one kernel's choices at a time.
ONLY_KERNELS: frozenset[str] | None = None
MODEL_VERDICT = "model"  # in an under-compile record: the compiled model step was slower with the kernel


def beats_inductor(entry: Entry | None) -> bool:
    """Whether a tuned entry serves its kernel under compile: with the ops forced (FORCED set) every served entry
    does; otherwise one whose kernel, compiled, beats torch's op compiled for the problem by more than MARGIN, and
    that no compiled model step was measured slower with (MODEL_VERDICT)."""
    if FORCED is not None:
        return True
    if entry is None:
        return False
    record = under_compile_record(entry.provenance)
    if record is None or MODEL_VERDICT in record:
        return False
    if ONLY_KERNELS is not None and entry.key.kernel not in ONLY_KERNELS:
        return False
    kernel_ms, inductor_ms = _positive(record.get("kernel_ms")), _positive(record.get("inductor_ms"))
    return kernel_ms is not None and inductor_ms is not None and kernel_ms < inductor_ms * (1 - MARGIN)


def _positive(value: object) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    return float(value) if ok else None  # type: ignore[arg-type]


def forced(op_name: str) -> bool | None:
    """True or False where TUNEKIT_COMPILE_OPS decides for this op; None where measurement does."""
    return None if FORCED is None else ALL in FORCED or op_name in FORCED
