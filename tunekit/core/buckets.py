"""Token buckets: how a kernel's entries cover the many token counts (batch x tokens) a served model meets.

A kernel whose problem has a token (row) dimension with exact sizes in its key declares it in its spec
(`KernelSpec.token_buckets`): the field, the bucket edges, and the problems it applies to. Then
- a recorded plan holds the bucket edges around each token count a run met, not the count itself
  (tunekit.runtime.recorder): a deployment that meets every M from 1 to 16384 tunes at most ~2 edges per octave
  (21 problems per layer shape), not thousands;
- dispatch serves a token count between two edges from the upper edge's entry (layer "bucket"), only where both
  edges are tuned and both beat torch by a margin (tunekit.runtime.buckets); otherwise torch, as for any untuned
  problem.

The row kernels (norms, softmax, RoPE, ...) already key their rows by `row_bucket` (the next power of two): their
key is the bucket, and they declare nothing here.

Edges (`token_edges`): powers of two up to 256, then half-octave steps (256, 384, 512, 768, 1024, 1536, ...).
Up to 256 rows the problem is one or two rows of output tiles (BLOCK_M goes to 256) and, at the widths of a 7B
model (N, K >= 4096), bound by streaming the N x K weight: time barely moves with M, and a power of two per bucket
is enough. Past that, time grows with the number of tile rows and steps with the wave count ceil(tiles / SMs)
(wave quantization: 4096 / 128 = 32 tile columns, so M 512 -> 640 with 128-row tiles goes from 128 tiles, one
wave of 132 SMs, to 160, two). Half-octave edges keep every M within 1.5x (above 384: 1.33x) of the edge whose
config serves it, so the config never meets more than 1.5x the tile rows it was tuned for.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as declared

from tunekit.core.space import Problem, Value

FINE_FROM = 256  # from here on the edges step by half octaves
MAX_EDGE = 1 << 20  # token counts above the last edge have no bucket (their own entry, or torch)


def token_edges(fine_from: int = FINE_FROM, top: int = MAX_EDGE) -> tuple[int, ...]:
    """Powers of two from 1, and from `fine_from` on also 1.5x each power of two, up to `top`."""
    edges = []
    power = 1
    while power <= top:
        edges.append(power)
        if power >= fine_from and power * 3 // 2 <= top:
            edges.append(power * 3 // 2)
        power *= 2
    return tuple(edges)


@dataclass(frozen=True)
class TokenBuckets:
    """The declaration: `field` counts tokens (rows) in the problems whose fields match `when` (field -> the values
    for which `field` is the token count; GEMM: m, where A is row-major, so m is the rows of the activations),
    bucketed by `edges` (ascending)."""

    field: str
    edges: tuple[int, ...] = declared(default_factory=token_edges)
    when: Mapping[str, tuple[Value, ...]] = declared(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.edges or list(self.edges) != sorted(set(self.edges)) or self.edges[0] < 1:
            raise ValueError(f"token bucket edges must be ascending positive ints, got {self.edges}")

    def applies(self, problem: Problem) -> bool:
        return all(problem.get(name) in values for name, values in self.when.items())

    def bracket(self, problem: Problem) -> tuple[int, int] | None:
        """(lo, hi): the edges with lo < token count < hi, where the count lies strictly between two edges of a
        problem this declaration applies to; None where it is an edge, outside the edges, or not covered."""
        if not self.applies(problem):
            return None
        m = problem.get(self.field)
        if not isinstance(m, int) or isinstance(m, bool) or m in self.edges:
            return None
        for lo, hi in zip(self.edges, self.edges[1:]):
            if lo < m < hi:
                return lo, hi
        return None

    def ceiling(self, count: int) -> int:
        """The smallest edge at or above `count` (the count itself past the last edge): the one edge whose entry
        may serve `count` besides an entry of its own, so two counts that no entry can tell apart share it."""
        at = bisect.bisect_left(self.edges, count)
        return self.edges[at] if at < len(self.edges) else count

    def at(self, problem: Problem, value: int) -> dict[str, Value]:
        """The problem with its token count set to `value` (every other field kept)."""
        return {**problem, self.field: value}

    def representatives(self, problem: Problem) -> list[dict[str, Value]]:
        """The problems a plan tunes for this one: its two bracketing edges, or the problem itself."""
        bracket = self.bracket(problem)
        if bracket is None:
            return [dict(problem)]
        return [self.at(problem, edge) for edge in bracket]
