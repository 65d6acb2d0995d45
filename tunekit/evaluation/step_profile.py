"""Where a model step's GPU time goes, by kernel kind (GEMM, attention, norm, loss, copy/cast, reduce,
elementwise): the view that answers "why is this step not faster" by comparing eager with tunekit, kind by kind.
Kernels are classified by name (cuBLAS/CUTLASS, flash attention, torch's and tunekit's kernels); GPUs only."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

KINDS = [  # first match wins
    ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|sm90_|_matmul|cublas", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa|mha", re.I)),
    ("norm", re.compile(r"norm|rms", re.I)),
    ("softmax/loss", re.compile(r"softmax|cross_entropy|_ce_|nll|log_softmax", re.I)),
    ("copy/cast", re.compile(r"copy|cast|cat|_to_copy|fill|memcpy|memset", re.I)),
    ("reduce", re.compile(r"reduce|sum|mean", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|pointwise|bias|act|silu|gelu|mul|add|rope", re.I)),
]
NAMED = "  "  # prefix of a per-kernel row (kinds a patch may remove are also listed kernel by kernel)


def kind_of(kernel_name: str) -> str:
    return next((kind for kind, pattern in KINDS if pattern.search(kernel_name)), "other")


def profile_kinds(step: Callable[[], Any], steps: int = 3) -> dict[str, float]:
    """GPU ms per call of `step` by kernel kind, and (rows prefixed NAMED) by kernel outside GEMM and attention,
    plus "calls <kind>": kernel launches per step. Two warm-up calls first."""
    import torch

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    totals: dict[str, float] = {}
    for event in prof.key_averages():
        if event.device_type.name != "CUDA" or event.self_device_time_total <= 0:
            continue
        ms = event.self_device_time_total / 1e3 / steps
        kind = kind_of(event.key)
        totals[kind] = totals.get(kind, 0.0) + ms
        totals[f"calls {kind}"] = totals.get(f"calls {kind}", 0.0) + event.count / steps
        if kind not in ("gemm", "attention"):
            totals[f"{NAMED}{kind}: {event.key[:80]}"] = ms
    return totals


def kind_table(by_variant: Mapping[str, Mapping[str, float]], title: str) -> str:
    """Kinds as rows (ms and launches per step), variants as columns, then the total."""
    variants = list(by_variant)
    first = by_variant[variants[0]]
    kinds = sorted(
        {k for v in by_variant.values() for k in v if not k.startswith((NAMED, "calls "))},
        key=lambda k: -first.get(k, 0.0),
    )
    lines = [title, f"{'kind':14}" + "".join(f"{v + ' ms':>14}{'calls':>7}" for v in variants)]
    for kind in kinds:
        lines.append(
            f"{kind:14}"
            + "".join(f"{v.get(kind, 0.0):14.3f}{v.get('calls ' + kind, 0.0):7.0f}" for v in by_variant.values())
        )
    totals = [sum(t for k, t in v.items() if not k.startswith((NAMED, "calls "))) for v in by_variant.values()]
    lines.append(f"{'total':14}" + "".join(f"{t:14.3f}{'':7}" for t in totals))
    return "\n".join(lines)
