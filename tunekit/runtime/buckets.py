"""The bucket layer of dispatch: a token count between two bucket edges (tunekit/core/buckets.py), with no entry
of its own, served by the upper edge's tuned config, only where that cannot be slower than torch as far as the
measurements say.

The rule, for M with lo < M < hi (lo, hi adjacent edges of the kernel's declared token field; every other problem
field equal, dtype, layouts and flags included):
- both edges have an entry of their own here (user cache, else a shipped database; same kernel identity and
  device), whose config is valid for its own problem;
- neither is demoted (tunekit.store.entry.DEMOTED): a demoted edge serves torch to the whole bucket (layer
  "demoted", on every device, as dispatch serves a demoted entry);
- on a GPU, both hold torch's time as the tuner measured it, and the served config (hi's) beats torch at both
  edges by BUCKET_MARGIN: torch_ms >= BUCKET_MARGIN * its time. At hi that is hi's best; at lo, its time among lo's
  measured trials where lo's tuning run measured it, else lo's best (which is no slower than hi's config at lo: a
  weaker check, said in the note). Why both edges: where both times are affine in M across the bucket (a fixed
  cost plus a cost per row), their ratio is monotone in M, so a config that beats torch at both edges beats it
  everywhere between them; the margin is for what is not affine (wave quantization: a partial last wave, cuBLAS
  switching kernels at some M) and for timing noise;
- hi's config is valid for M (the space's rules, e.g. GROUP_M with one row of tiles).
Then hi's config serves M (layer "bucket"); otherwise the problem is untuned (torch on a GPU), and the refusal's
reason goes with the resolution (`tunekit show --kernel gemm --shape ...` prints it).

In the interpreter, timings mean nothing and dispatch serves tuned entries without comparing with torch: the
bucket layer there asks for both edges, no demotion and a valid config, so the CPU tests run the layer's kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tunekit.core import settings
from tunekit.core.device import DeviceFingerprint
from tunekit.core.space import Config, Problem, config_id
from tunekit.core.spec import KernelSpec
from tunekit.store.entry import TORCH_CANDIDATE, Entry, demotion, superseded_floor, torch_time
from tunekit.store.key import CacheKey

# Each edge's entry must run at least this many times torch's speed (torch_ms / time_ms), measured at that edge.
BUCKET_MARGIN = 1.10

Lookup = Callable[[CacheKey], "Entry | None"]


@dataclass(frozen=True)
class Bucketed:
    """What the bucket layer decided for a problem between two edges: `layer` "bucket" (hi's config), "demoted"
    (torch), or "" (refused: the problem is untuned); `note` says why, for `show`."""

    layer: str
    config: Config
    entry: Entry | None
    note: str


def _edge(spec: KernelSpec, problem: Problem, device: DeviceFingerprint, lookup: Lookup) -> Entry | None:
    entry = lookup(CacheKey.make(spec.name, spec.source_hash, device.key, problem))
    if entry is None or not spec.space.is_valid(entry.config, problem, device):
        return None
    return entry


def _speedup(entry: Entry, config: Config) -> tuple[float | None, bool]:
    """torch's time at the entry's problem over `config`'s there, and whether `config` was measured there: among the
    entry's trials where its tuning run measured `config`, else the entry's best (no slower than `config` there)."""
    torch_ms = torch_time(entry.provenance)
    wanted = config_id(config)
    own = [t.time_ms for t in entry.trials if t.status == "ok" and t.time_ms and config_id(t.config) == wanted]
    own += [entry.time_ms] if config_id(entry.config) == wanted else []
    time_ms = min(own) if own else entry.time_ms
    return (None if torch_ms is None or time_ms <= 0 else torch_ms / time_ms), bool(own)


def bucket_resolution(spec: KernelSpec, problem: Problem, device: DeviceFingerprint, lookup: Lookup) -> Bucketed | None:
    """The bucket layer's verdict for `problem` (None: the kernel declares no buckets, or the problem's token count
    is not between two edges). `lookup` finds an entry by its exact key (user cache, then shipped)."""
    buckets = spec.token_buckets
    bracket = None if buckets is None else buckets.bracket(problem)
    if buckets is None or bracket is None:
        return None
    lo, hi = bracket
    span = f"{buckets.field}={problem[buckets.field]} in bucket ({lo}, {hi})"
    edges = {edge: _edge(spec, buckets.at(problem, edge), device, lookup) for edge in bracket}
    missing = [str(edge) for edge, entry in edges.items() if entry is None]
    if missing:
        return _refused(f"{span}: no tuned entry at {buckets.field}={', '.join(missing)}")
    demoted = [(edge, e) for edge, e in edges.items() if e is not None and demotion(e) is not None]
    if demoted and spec.torch_fallback:
        edge, entry = demoted[0]
        return Bucketed("demoted", TORCH_CANDIDATE, entry, f"{span}: the entry at {edge} is demoted")
    upper = edges[hi]
    assert upper is not None
    speeds = []
    if spec.torch_fallback and not device.is_interpreter and not settings.buckets():
        # Measured on the H200: both edges 1.60-1.85x torch, in between 0.36-0.71x (Qwen2-7B's o_proj, M 72-120).
        return _refused(f"{span}: bucket serving is off on GPUs (TUNEKIT_BUCKETS=1)")
    if spec.torch_fallback and not device.is_interpreter:
        for edge, timed_entry in edges.items():
            speedup, measured = (None, False) if timed_entry is None else _speedup(timed_entry, upper.config)
            whose = f"the config tuned at {hi}" if edge == hi or measured else f"the best config at {lo}"
            if timed_entry is not None and superseded_floor(timed_entry):
                return _refused(f"{span}: the entry at {edge} is launch-bound, timed by an earlier method")
            if speedup is None:
                return _refused(f"{span}: the entry at {edge} holds no torch time")
            if speedup < BUCKET_MARGIN:
                return _refused(f"{span}: {whose} is {speedup:.2f}x torch at {edge} (needs {BUCKET_MARGIN:.2f}x)")
            speeds.append(f"{whose} {speedup:.2f}x torch at {edge}")
    if not spec.space.is_valid(upper.config, problem, device):
        rules = ", ".join(spec.space.violations(upper.config, problem, device))
        return _refused(f"{span}: the config of {hi} breaks {rules} here")
    timed = f" ({', '.join(speeds)})" if speeds else ""
    return Bucketed("bucket", upper.config, upper, f"{span}: the config tuned at {hi}{timed}")


def _refused(note: str) -> Bucketed:
    return Bucketed("", TORCH_CANDIDATE, None, note)
