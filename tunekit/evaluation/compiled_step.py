"""The GEMM choices of a compiled model, decided inside its compiled steps.

    report = decide_compiled(model, {"decode": decode, "train": train_step})   # model patched (tunekit.patch)

1. Search: every step runs once through `torch.compile(model)` with each GEMM searched (compiled_gemm.SEARCH):
   Inductor times its own candidates for the problem, as max-autotune would, and its fastest Triton template is
   recorded, even where torch's GEMM timed faster (its kernel is the GEMM's own launch, so the profile can charge it
   to its problem; a split-K decomposition, a batched GEMM and a reduction, is not one).
2. GEMM times: each step runs compiled with torch's GEMMs (compile alone's graph, BEFORE), with the winners
   (TUNED), and with the winners again (CONTROL), in rotated blocks, profiled with input shapes. Every GEMM launch
   (aten::mm or addmm, an Inductor template kernel) is charged the GPU time of its kernels and matched to its
   problem by the buffers it reads; problems that no shape tells apart (a projection and its input gradient of the
   same square shape) are decided together. A group's winner passes only where its GEMM time per step beats
   BEFORE's by more than the control's spread and `floor` (tunekit.evaluation.in_step.decide), and where it ran
   as many GEMMs under both (else it is not priced). A step whose output (logits) with the winners is more than
   MAX_REL_ERR off its output with torch's GEMMs keeps none of them.
3. Whole steps (`_whole_steps`): each step is timed compiled with torch's GEMMs, with the choices that passed on
   GEMM times, and with every winner, in alternation. A step bound by the host (decode) gains from a template's
   cheaper launch what GPU times do not show; one bound by the GPU must not lose what they showed. The faster set
   is kept past the control's spread, the GEMM times' set only where the step is not slower.
4. Every decided problem's entry gets the verdict (tunekit.store.entry.with_compiled): a compiled graph then runs
   the kept choice for it with no search (tunekit.runtime.compiled_gemm). A problem with no entry (never tuned
   here, in no pack) is reported, not stored: tune_model tunes the model's problems first.
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


GEMM_TIMES = "kept by GEMM times"  # a step's choices whose GEMMs ran faster with them, in the profile
EVERY = "every winner"  # every choice the step runs


@dataclass(frozen=True)
class WholeStep:
    """A step timed whole: which of its choice sets it keeps ("" for none), each set's speed over torch's GEMMs
    (median of per-round ratios), and the control's spread."""

    kept: str
    speeds: dict[str, float]
    noise: float

    def line(self, step: str) -> str:
        speeds = ", ".join(f"{label} {speed:.3f}x" for label, speed in self.speeds.items())
        kept = self.kept or "none"
        return f"{step} compiled, whole step vs torch's GEMMs: {speeds} (noise {self.noise:.3f}): {kept} kept"


@dataclass
class CompiledReport:
    searched: dict[str, str] = field(default_factory=dict)  # problem -> the search's winner
    verdicts: list[CompiledVerdict] = field(default_factory=list)
    steps: dict[str, float] = field(default_factory=dict)  # compiled step: compile alone's ms / with its kept choices
    dropped: dict[str, int] = field(default_factory=dict)  # step -> choices the guarantee dropped
    refused: dict[str, str] = field(default_factory=dict)  # step -> why its output refused every choice it runs
    kept: dict[str, str] = field(default_factory=dict)  # problem -> the choice stored as kept
    whole: dict[str, WholeStep] = field(default_factory=dict)  # step -> which choices its whole time kept
    by_step: set[str] = field(default_factory=set)  # problems kept by a whole step's time, not their GEMM times
    stored: int = 0
    unstored: int = 0  # decided problems with no entry to hold the verdict
    search_s: float = 0.0
    decide_s: float = 0.0

    def table(self) -> str:
        stored = f"{self.stored} stored" + (f", {self.unstored} without an entry" if self.unstored else "")
        lines = [f"compiled GEMMs: {len(self.searched)} searched, {len(self.kept)} kept ({stored})"]
        lines += ["  " + v.line() for v in self.verdicts]
        lines += [f"  {step}: every choice refused: {why}" for step, why in self.refused.items()]
        lines += ["  " + whole.line(step) for step, whole in self.whole.items()]
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
        if result is not None:  # (a template: its kernel is the GEMM's own launch, so the profile can charge it)
            report.searched[problem] = winners[problem] = result.choice
    report.search_s = time.perf_counter() - clock

    clock = time.perf_counter()
    torchs = Override(lambda problem: "")
    tuned = Override(lambda problem: winners.get(_canonical(problem), ""))
    servings = {BEFORE: torchs, TUNED: tuned, CONTROL: tuned}
    by_signature: dict[Signature, list[str]] = {}
    for problem in sorted(winners):
        by_signature.setdefault(signature_of(_problem(problem)), []).append(problem)
    ran: dict[str, set[str]] = {}  # step -> the problems with a winner whose GEMMs it runs
    kept: set[str] = set()  # by their GEMM times
    refused: set[str] = set()  # run by a step whose output moved with the winners
    for name, step in steps.items() if winners else ():
        call = step_call(compiled, step)
        timed: dict[str, list[dict[Signature, tuple[float, int]]]] = {serving: [] for serving in servings}
        order = list(servings)
        for block in range(blocks):
            for serving in order[block % len(order) :] + order[: block % len(order)]:
                with servings[serving].active():
                    timed[serving].append(_profiled(call, runs, warmup, list(by_signature)))
        moved = _outputs_differ(call, torchs, tuned)
        if moved:
            report.refused[name] = moved
        for signature, problems in by_signature.items():
            if not any(block.get(signature, (0.0, 0))[1] for serving in timed for block in timed[serving]):
                continue  # (another step's GEMMs)
            if moved:
                refused.update(problems)
                continue
            ran.setdefault(name, set()).update(problems)
            choices = {winners[p] for p in problems}
            if len(choices) > 1:  # decided together, yet searched apart: no one choice to time for the group
                why = "its problems won with different candidates"
                verdict = CompiledVerdict(name, tuple(problems), "", {}, 1.0, 0.0, False, why)
            else:
                verdict = _group_verdict(name, problems, choices.pop(), timed, signature, floor)
            report.verdicts.append(verdict)
            if verdict.kept:
                kept.update(problems)

    whole = _whole_steps(model, steps, compiled, report, winners, ran, kept, torchs, tuned, rounds, reps, tolerance,
                         timer)  # fmt: skip
    report.kept = {p: c for p, c in whole.items() if p not in refused}
    report.by_step.intersection_update(report.kept)
    report.decide_s = time.perf_counter() - clock


def _whole_steps(
    model: torch.nn.Module, steps: Mapping[str, Step], compiled: Any, report: CompiledReport, winners: dict[str, str],
    ran: dict[str, set[str]], kept: set[str], torchs: Override, tuned: Override, rounds: int, reps: int,
    tolerance: float, timer: Callable[[Callable[[], Any], int], float] | None,
) -> dict[str, str]:  # fmt: skip
    """Which choices each step keeps, by the whole step's time: problem -> choice, over every step.

    A step bound by the host gains from a template what its GEMM times do not show (Inductor launches its template
    for less host time than torch's GEMM call), and one bound by the GPU must not lose what they showed. So each step
    runs compiled with torch's GEMMs (twice: the second run's ratio is the control's spread), with the choices its
    GEMM times kept (GEMM_TIMES) and with every winner it runs (EVERY), in alternation. EVERY is kept where it beats
    torch's GEMMs by more than `tolerance` and the spread, and GEMM_TIMES; else GEMM_TIMES where the step is not
    slower than torch's by more than `tolerance`; else none. A problem kept in one step and not in another that
    runs it is not kept: a step that loses choices so is timed again with the rest, and drops them if slower."""
    alternate = Alternation(timer or default_timer(model), rounds, reps)
    chosen: dict[str, dict[str, str]] = {}
    for name, step in steps.items():
        runs = ran.get(name, set())
        if not runs:
            continue
        options = {GEMM_TIMES: {p: winners[p] for p in runs & kept}, EVERY: {p: winners[p] for p in runs}}
        if options[GEMM_TIMES] == options[EVERY]:
            del options[EVERY]
        if not options[GEMM_TIMES]:
            del options[GEMM_TIMES]
        call = step_call(compiled, step)
        calls = {"torch": (call, torchs.active), "torch (control)": (call, torchs.active)}
        for label, choices in options.items():
            override = tuned if label == EVERY else Override(lambda p, c=choices: c.get(_canonical(p), ""))
            calls[label] = (call, override.active)
        times = alternate.run(calls)
        noise = abs(1 - ratio(times, "torch", "torch (control)"))
        speeds = {label: ratio(times, "torch", label) for label in options}
        pick = ""
        if EVERY in speeds and speeds[EVERY] > max(1 + max(tolerance, noise), speeds.get(GEMM_TIMES, 0.0)):
            pick = EVERY
        elif GEMM_TIMES in speeds and speeds[GEMM_TIMES] >= 1 - tolerance:
            pick = GEMM_TIMES
        report.whole[name] = WholeStep(pick, speeds, noise)
        chosen[name] = options.get(pick, {})
        if pick:
            report.steps[name] = speeds[pick]
        if pick == EVERY:
            report.by_step.update(p for p in options[EVERY] if p not in options.get(GEMM_TIMES, {}))
    keeping = {p: c for choices in chosen.values() for p, c in choices.items()}
    for name, choices in chosen.items():  # not kept where a step that runs it keeps torch's
        for problem in ran[name] - set(choices):
            keeping.pop(problem, None)
    for name, choices in chosen.items():
        left = {p: c for p, c in choices.items() if p in keeping}
        if left == choices or not left:
            if choices and not left:
                report.dropped[name] = len(choices)
            continue
        chosen_left = Override(lambda p, c=left: c.get(_canonical(p), ""))
        call = step_call(compiled, steps[name])
        times = alternate.run({"torch": (call, torchs.active), "kept": (call, chosen_left.active)})
        report.steps[name] = ratio(times, "torch", "kept")
        if report.steps[name] < 1 - tolerance:
            report.dropped[name] = len(choices)
            keeping = {p: c for p, c in keeping.items() if p not in left}
    return keeping


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
                    report.unstored += 1
                    continue
                kept = problem in report.kept
                choice = report.kept.get(problem, verdict.choice)
                record: dict[str, Any] = {"kept": "choice" if kept else "torch", "choice": choice,
                                          "step": verdict.step, "noise": round(verdict.noise, 6),
                                          "by": "step" if problem in report.by_step else "gemm"}  # fmt: skip
                if verdict.ms:
                    record["ms"] = {"choice": verdict.ms.get(TUNED, 0.0), "torch": verdict.ms.get(BEFORE, 0.0)}
                store.put(with_compiled(entry, record))
                stored += 1
    finally:
        store.close()
    return stored
