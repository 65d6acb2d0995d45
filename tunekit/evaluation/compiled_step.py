"""The GEMM choices of a compiled model, decided inside its compiled steps.

    report = decide_compiled(model, {"decode": decode, "train": train_step})   # model patched (tunekit.patch)

1. Search: every step runs once through `torch.compile(model)` with each GEMM searched (compiled_gemm.SEARCH):
   Inductor times its own candidates for the problem, as max-autotune would, and the winner is recorded. Only a
   winner whose kernel is the GEMM's own launch (an Inductor Triton template) goes on, so the profile can charge it
   to its problem; a split-K decomposition (a batched GEMM and a reduction) does not.
2. In the step: each step runs compiled with torch's GEMMs (compile alone's graph, BEFORE), with the winners
   (TUNED), and with the winners again (CONTROL), in rotated blocks, profiled with input shapes. Every GEMM launch
   (aten::mm or addmm, an Inductor template kernel) is charged the GPU time of its kernels and matched to its
   problem by the buffers it reads; problems that no shape tells apart (a projection and its input gradient of the
   same square shape) are decided together. A group keeps its winner only where its GEMM time per step beats
   BEFORE's by more than the control's spread and `floor` (tunekit.evaluation.in_step.decide), and where it ran
   as many GEMMs under both (else it is not priced, and keeps torch's). A step whose output (logits) with the
   winners is more than MAX_REL_ERR off its output with torch's GEMMs keeps none of them.
3. The guarantee: each step is timed compiled with the kept choices and with torch's, in alternation; a step slower
   by more than `tolerance` (median of per-round ratios) drops every choice it runs.
4. Every decided problem's entry gets the verdict (tunekit.store.entry.with_compiled): a compiled graph then runs
   the kept choice for it with no search (tunekit.runtime.compiled_gemm).
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.core.space import Problem
from tunekit.evaluation.in_step import BEFORE, CONTROL, TUNED, Launches, TraceEvent, decide, trace_events
from tunekit.evaluation.step_timing import Alternation, Step, default_timer, output_tensor, ratio, step_call
from tunekit.runtime import compiled_gemm
from tunekit.runtime.compiled_gemm import Override
from tunekit.store.entry import with_compiled
from tunekit.store.key import CacheKey
from tunekit.store.store import Store

Signature = tuple[tuple[int, ...], tuple[int, ...]]  # a GEMM's operand shapes, each sorted: (A's, B's)
TEMPLATE_KERNEL = "triton_tem_"  # Inductor's name prefix of a template's kernel (its launch is profiled by name)
OWN_LAUNCH_UIDS = ("aten::", "triton::")  # candidates whose kernel is the GEMM's own launch
# A step's output with the winners against its output with torch's GEMMs: another summation order moves bf16 logits
# by about 1% in norm; a wrong GEMM by order 1.
MAX_REL_ERR = 0.05


@dataclass(frozen=True)
class CompiledVerdict:
    """The problems of a step that share a GEMM signature, decided together."""

    step: str
    problems: tuple[str, ...]  # canonical JSON
    choice: str  # the candidate (the search's winner)
    ms: dict[str, float]  # per serving: median ms per step run of the group's GEMMs
    ratio: float  # median per-block ratio TUNED / BEFORE (under 1: the choice is faster)
    noise: float
    kept: bool
    why: str = ""

    def line(self) -> str:
        shapes = ", ".join(_shape(p) for p in self.problems)
        if not self.ms:
            return f"{self.step}: {shapes}: torch's GEMM ({self.why})"
        verdict = "kept" if self.kept else f"torch's GEMM{f' ({self.why})' if self.why else ''}"
        return (
            f"{self.step}: {shapes}: {self.ms.get(BEFORE, 0.0):.4f} ms torch, {self.ms.get(TUNED, 0.0):.4f} ms "
            f"{_uid(self.choice)} ({self.ratio:.3f}x, noise {self.noise:.3f}): {verdict}"
        )


@dataclass
class CompiledReport:
    searched: dict[str, str] = field(default_factory=dict)  # problem -> the search's winner
    verdicts: list[CompiledVerdict] = field(default_factory=list)
    steps: dict[str, float] = field(default_factory=dict)  # compiled step: compile alone's ms / with the kept choices
    dropped: dict[str, int] = field(default_factory=dict)  # step -> choices the guarantee dropped
    refused: dict[str, str] = field(default_factory=dict)  # step -> why its output refused every choice it runs
    kept: dict[str, str] = field(default_factory=dict)  # problem -> the choice stored as kept
    stored: int = 0
    search_s: float = 0.0
    decide_s: float = 0.0

    def table(self) -> str:
        lines = [f"compiled GEMMs: {len(self.searched)} searched, {len(self.kept)} kept ({self.stored} stored)"]
        lines += ["  " + v.line() for v in self.verdicts]
        lines += [f"  {step}: every choice refused: {why}" for step, why in self.refused.items()]
        for step, speed in self.steps.items():
            dropped = f", {self.dropped[step]} choices dropped" if self.dropped.get(step) else ""
            lines.append(f"  {step} compiled: {speed:.3f}x compile alone with the kept choices{dropped}")
        lines.append(f"  search {self.search_s:.1f} s, decide {self.decide_s:.1f} s")
        return "\n".join(lines)


def _problem(name: str) -> Problem:
    problem: Problem = json.loads(name)
    return problem


def _shape(name: str) -> str:
    p = _problem(name)
    return f"{p['m']}x{p['n']}x{p['k']} {p['a_layout']}/{p['b_layout']}{' +bias' if p.get('has_bias') else ''}"


def _uid(choice: str) -> str:
    try:
        raw = json.loads(choice)
        return str(raw["uid"]) + "".join(f" {k}={v}" for k, v in raw["params"].items() if k.startswith("BLOCK_"))
    except (ValueError, KeyError, TypeError):
        return choice


def signature_of(problem: Mapping[str, object]) -> Signature:
    """A GEMM problem's operand shapes as the profile records them, each sorted: a launch passes an operand's
    buffer, which may be the transpose of the view the problem names (linear's weight for weight.T)."""
    m, n, k = (int(problem[d]) for d in ("m", "n", "k"))  # type: ignore[call-overload]
    return tuple(sorted((m, k))), tuple(sorted((k, n)))


def _matrix(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A buffer's shape as the matrix a GEMM reads of it (leading dims folded: the model's [batch, seq, hidden]
    hidden states are the [tokens, hidden] operand), sorted."""
    return tuple(sorted((math.prod(shape[:-1]), shape[-1])))


def launch_signature(
    name: str, shapes: tuple[tuple[int, ...], ...], wanted: Iterable[Signature] = ()
) -> Signature | None:
    """The signature of a profiled GEMM op: aten::mm or aten::addmm by its operands; an Inductor template kernel
    (whose arguments are the buffers it reads, A or the inputs of a prologue fused into it first, epilogue inputs
    after) as the first of `wanted` whose A is its first matrix argument and whose B is another. (A gated MLP's
    up projection and its down projection read matrices of the same shapes: only the first argument tells them
    apart.) None for any other op."""
    if name in ("aten::mm", "aten::addmm"):
        pair = shapes[0:2] if name == "aten::mm" else shapes[1:3]
        if len(pair) != 2 or any(len(s) != 2 for s in pair):
            return None
        return tuple(sorted(pair[0])), tuple(sorted(pair[1]))
    if name.startswith(TEMPLATE_KERNEL):
        matrices = [_matrix(s) for s in shapes if len(s) >= 2]
        if not matrices:
            return None
        first, rest = matrices[0], set(matrices[1:])
        return next((w for w in wanted if w[0] == first and w[1] in rest), None)
    return None


def gemm_times(
    events: Iterable[TraceEvent], runs: int, wanted: Iterable[Signature] = ()
) -> dict[Signature, tuple[float, int]]:
    """Per GEMM signature: (GPU ms per run, launches per run) over a profile of `runs` step runs (template kernels
    matched to `wanted`). A launch is charged its kernels: those of the runtime calls inside its op's window (host
    ms where there are none)."""
    wanted = list(wanted)
    profile = Launches.of(events)
    totals: dict[Signature, list[float]] = {}
    for e in profile.host:
        signature = launch_signature(e.name, e.shapes, wanted)
        if signature is None:
            continue
        ns = profile.gpu_ns(e.thread, e.start_ns, e.end_ns) if profile.on_gpu else e.end_ns - e.start_ns
        total = totals.setdefault(signature, [0.0, 0])
        total[0] += ns / 1e6
        total[1] += 1
    return {s: (ms / runs, round(count / runs)) for s, (ms, count) in totals.items()}


def _profiled(
    call: Callable[[], Any], runs: int, warmup: int, wanted: list[Signature]
) -> dict[Signature, tuple[float, int]]:
    for _ in range(warmup):
        call()
    activities = [torch.profiler.ProfilerActivity.CPU]
    cuda = torch.cuda.is_available()
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities, record_shapes=True) as profile:
        for _ in range(runs):
            call()
        if cuda:
            torch.cuda.synchronize()
    return gemm_times(trace_events(profile, shapes=True), runs, wanted)


def _group_verdict(
    step: str, problems: list[str], choice: str, timed: Mapping[str, list[dict[Signature, tuple[float, int]]]],
    signature: Signature, floor: float,
) -> CompiledVerdict:  # fmt: skip
    def blocks(serving: str) -> list[tuple[float, int]]:
        return [block.get(signature, (0.0, 0)) for block in timed[serving]]

    counts = {serving: {count for _, count in blocks(serving)} for serving in timed}
    if not counts[BEFORE] - {0} or counts[BEFORE] != counts[TUNED] or counts[TUNED] != counts[CONTROL]:
        why = f"not priced: {sorted(counts[BEFORE])} GEMMs per run with torch's, {sorted(counts[TUNED])} with it"
        return CompiledVerdict(step, tuple(problems), choice, {}, 1.0, 0.0, False, why)
    per_block = {serving: [ms for ms, _ in blocks(serving)] for serving in timed}
    chosen, ratios, noise = decide(per_block, floor)
    ms = {serving: statistics.median(times) for serving, times in per_block.items() if serving != CONTROL}
    return CompiledVerdict(step, tuple(problems), choice, ms, ratios.get(TUNED, 1.0), noise, chosen == TUNED)


def _outputs_differ(call: Callable[[], Any], torchs: Override, tuned: Override) -> str:
    """Why the step's output with the winners is not the output with torch's GEMMs (relative error past
    MAX_REL_ERR, in norm), or "" (also for a step with no output to compare: a training step)."""
    outputs = []
    for override in (torchs, tuned):
        with override.active():
            out = output_tensor(call())
        outputs.append(None if out is None else out.detach().float())
    want, got = outputs
    if want is None or got is None or want.shape != got.shape or want.numel() == 0:
        return ""
    scale = float(want.norm())
    err = float((got - want).norm()) / scale if scale > 0 else float((got - want).norm())
    return f"its output with the choices is {err:.3g} off torch's (relative, in norm)" if err > MAX_REL_ERR else ""


def _canonical(problem: Mapping[str, object]) -> str:
    return json.dumps(dict(problem), sort_keys=True, separators=(",", ":"))


def decide_compiled(
    model: torch.nn.Module,
    steps: Mapping[str, Step],
    *,
    blocks: int = 3,
    runs: int = 2,
    warmup: int = 2,
    floor: float = 0.005,
    rounds: int = 5,
    reps: int = 3,
    tolerance: float = 0.01,
    store: bool = True,
    timer: Callable[[Callable[[], Any], int], float] | None = None,
) -> CompiledReport:
    """Decide, inside each compiled step of a patched `model`, which GEMM problems a compiled graph serves with
    Inductor's search winner (the module docstring says how), and store the verdicts (`store`)."""
    report = CompiledReport()
    # Static shapes (each step its own graph), and room for a graph per step and serving.
    limits = torch._dynamo.config.patch(recompile_limit=64, accumulated_recompile_limit=1024)
    with limits:
        _decide(model, steps, report, blocks, runs, warmup, floor, rounds, reps, tolerance, timer)
    if store:
        report.stored = _store(report)
    compiled_gemm.renew()
    return report


def _decide(
    model: torch.nn.Module, steps: Mapping[str, Step], report: CompiledReport, blocks: int, runs: int, warmup: int,
    floor: float, rounds: int, reps: int, tolerance: float, timer: Callable[[Callable[[], Any], int], float] | None,
) -> None:  # fmt: skip
    compiled = torch.compile(model, dynamic=False)
    traced: set[str] = set()
    search = compiled_gemm.search_choice()

    def searching(problem: Problem) -> str:
        traced.add(_canonical(problem))
        return search

    clock = time.perf_counter()
    compiled_gemm.clear_searched()
    with Override(searching).active():
        for step in steps.values():
            step_call(compiled, step)()
    found = compiled_gemm.searched()
    winners: dict[str, str] = {}
    for problem in sorted(traced):
        result = found.get(compiled_gemm.without_bias(_problem(problem)))
        if result is not None:
            report.searched[problem] = result.choice
            own_launch = json.loads(result.choice)["uid"].startswith(OWN_LAUNCH_UIDS)
            if own_launch and not compiled_gemm.is_torchs(result.choice):
                winners[problem] = result.choice
    report.search_s = time.perf_counter() - clock

    clock = time.perf_counter()
    torchs = Override(lambda problem: "")
    tuned = Override(lambda problem: winners.get(_canonical(problem), ""))
    servings = {BEFORE: torchs, TUNED: tuned, CONTROL: tuned}
    by_signature: dict[Signature, list[str]] = {}
    for problem in sorted(winners):
        by_signature.setdefault(signature_of(_problem(problem)), []).append(problem)
    ran: dict[str, set[str]] = {}  # step -> the problems with a winner whose GEMMs it runs
    kept: set[str] = set()
    rejected: set[str] = set()
    for name, step in steps.items() if winners else ():
        call = step_call(compiled, step)
        timed: dict[str, list[dict[Signature, tuple[float, int]]]] = {serving: [] for serving in servings}
        order = list(servings)
        for block in range(blocks):
            for serving in order[block % len(order) :] + order[: block % len(order)]:
                with servings[serving].active():
                    timed[serving].append(_profiled(call, runs, warmup, list(by_signature)))
        refused = _outputs_differ(call, torchs, tuned)
        if refused:
            report.refused[name] = refused
        for signature, problems in by_signature.items():
            if not any(block.get(signature, (0.0, 0))[1] for serving in timed for block in timed[serving]):
                continue  # (another step's GEMMs)
            if refused:
                rejected.update(problems)
                continue
            ran.setdefault(name, set()).update(problems)
            choices = {winners[p] for p in problems}
            if len(choices) > 1:  # decided together, yet searched apart: no one choice to time for the group
                why = "its problems won with different candidates"
                verdict = CompiledVerdict(name, tuple(problems), "", {}, 1.0, 0.0, False, why)
            else:
                verdict = _group_verdict(name, problems, choices.pop(), timed, signature, floor)
            report.verdicts.append(verdict)
            (kept if verdict.kept else rejected).update(problems)

    # The guarantee: each step, compiled, with the kept choices against compile alone's graph. A choice kept in one
    # step and slower in another is not kept.
    keeping = {p: winners[p] for p in kept - rejected}
    alternate = Alternation(timer or default_timer(model), rounds, reps)
    for name, step in steps.items():
        runs_kept = ran.get(name, set()) & set(keeping)
        if not runs_kept:
            continue
        chosen = Override(lambda problem, keeping=dict(keeping): keeping.get(_canonical(problem), ""))
        call = step_call(compiled, step)
        times = alternate.run({"alone": (call, torchs.active), "kept": (call, chosen.active)})
        report.steps[name] = ratio(times, "alone", "kept")
        if report.steps[name] < 1 - tolerance:
            report.dropped[name] = len(runs_kept)
            keeping = {p: c for p, c in keeping.items() if p not in runs_kept}
    report.kept = keeping
    report.decide_s = time.perf_counter() - clock


def _store(report: CompiledReport) -> int:
    """Write each decided problem's verdict into its entry (the working cache's, else a copy of the shipped one)."""
    from tunekit.store.database import shipped_entries

    spec = get_spec("gemm")
    device = fingerprint()
    shipped = shipped_entries()
    stored = 0
    store = Store()
    try:
        for verdict in report.verdicts:
            for problem in verdict.problems:
                key = CacheKey.make(spec.name, spec.source_hash, device.key, _problem(problem))
                entry = store.get(key) or shipped.get(key)
                if entry is None:
                    continue
                kept = problem in report.kept
                record: dict[str, Any] = {"kept": "choice" if kept else "torch", "choice": verdict.choice,
                                          "step": verdict.step, "noise": round(verdict.noise, 6)}  # fmt: skip
                if verdict.ms:
                    record["ms"] = {"choice": verdict.ms.get(TUNED, 0.0), "torch": verdict.ms.get(BEFORE, 0.0)}
                store.put(with_compiled(entry, record))
                stored += 1
    finally:
        store.close()
    return stored
