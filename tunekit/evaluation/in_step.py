"""The final choice between torch's op and tuned configs, made inside the model's step.

The tuner times each problem alone, L2 flushed; the model runs it between its neighbours, with their data in L2,
its own layouts and clocks, and a set of configs that each won alone can lose together. So the last word is the
step's: each serving (what was served before tuning, what the tuner chose, torch's op for every problem) runs the
step under the profiler, with every tunekit op call in a range (tunekit.runtime.attribution), and each call is
charged the GPU time of the kernels it launched, of those the calls nested in it launched, and of its backward
(the autograd nodes it created, matched by sequence number). In a step that waits on the host (its GPU busy for
under half its calls' span: decode) a call is charged the longer of that GPU time and its host time, timed in runs
without the profiler (whose cost per recorded op would charge torch's calls, several ops each, more than a
replayed launch): there the GPU idles while the host works, so a kernel faster on the GPU but dearer to launch
makes the step slower. One profiled run prices every problem of the step at once, so the servings cost a few step
runs each, not one per problem and candidate.

Calls that share a problem (the same shapes in every layer, a forward and its backward) are decided together: a
group's cost under a serving is the sum of its calls'. The servings are timed in blocks, each block running every
serving in a rotated order, plus a control (the tuned serving again); a serving replaces what was served before only
where its median per-block ratio to "before" beats 1 by more than the control's median per-block spread (and
`floor`): medians both, so one disturbed block moves neither. On a machine with no GPU activity (the CPU tests) the
same windows are charged their host time.
"""

from __future__ import annotations

import bisect
import gc
import re
import statistics
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch

from tunekit.runtime.attribution import INNER, Attribution, Inner, Problem, attributing, parse_range

BEFORE, TUNED, TORCH_OP, CONTROL = "before", "tuned", "torch", "control"
# A profiled step whose GPU is busy for less than this share of its calls' host span is bound by the host.
HOST_BOUND_SHARE = 0.5
BACKWARD = "autograd::engine::evaluate_function:"  # a backward node's run, with its forward's sequence number
API_CALL = re.compile(r"^cu(da)?[A-Z]")  # a CUDA runtime or driver call (its correlation id names its GPU work)
Serving = Callable[[], AbstractContextManager[Any]]


@dataclass(frozen=True)
class TraceEvent:
    """One profiler event, as much of it as attribution reads (tests build these by hand)."""

    name: str
    on_device: bool  # GPU activity (a kernel, memset, memcpy, or a range as the GPU ran it)
    start_ns: int
    end_ns: int
    thread: int
    correlation: int = 0
    sequence_nr: int = -1
    fwd_thread: int = 0
    annotation: bool = False  # a record_function range
    shapes: tuple[tuple[int, ...], ...] = ()  # its inputs' shapes, where the profile recorded them


def trace_events(profile: torch.profiler.profile, shapes: bool = False) -> list[TraceEvent]:
    """The profile's events; with `shapes`, each op's input shapes (a profile made with record_shapes=True)."""
    results = profile.profiler.kineto_results if profile.profiler is not None else None
    if results is None:
        return []
    return [
        TraceEvent(
            e.name(),
            e.device_type() != torch.autograd.DeviceType.CPU,
            e.start_ns(),
            e.end_ns(),
            e.start_thread_id(),
            e.correlation_id(),
            e.sequence_nr(),
            e.fwd_thread_id(),
            e.is_user_annotation(),
            tuple(tuple(int(d) for d in s) for s in e.shapes()) if shapes else (),
        )
        for e in results.events()
    ]


@dataclass
class CallCosts:
    """Per (run, position) of a top-level op call: its cost in ms, and the other calls it ran (nested in it, or in
    its backward), by (run, index); whether the profiled step waits on the host."""

    ms: dict[tuple[int, int], float] = field(default_factory=dict)
    members: dict[tuple[int, int], set[Inner]] = field(default_factory=dict)
    host_bound: bool = False


def _within(starts: list[tuple[int, int]], thread: int, start: int, end: int) -> range:
    """Indices of the sorted (thread, start) pairs on `thread` that start in [start, end]."""
    return range(bisect.bisect_left(starts, (thread, start)), bisect.bisect_right(starts, (thread, end)))


@dataclass
class Launches:
    """A profile's host side: its events (record_function ranges apart), and each runtime or driver call that ran
    GPU work as (thread, start, the GPU ns of its work), sorted, with `starts` their (thread, start)."""

    host: list[TraceEvent]
    ranges: list[TraceEvent]
    calls: list[tuple[int, int, int]]
    starts: list[tuple[int, int]]
    on_gpu: bool  # whether the profile holds any GPU activity

    @staticmethod
    def of(events: Iterable[TraceEvent]) -> Launches:
        device_ns: dict[int, int] = {}
        host: list[TraceEvent] = []
        ranges: list[TraceEvent] = []
        for e in events:
            if e.on_device:
                if not e.annotation:
                    device_ns[e.correlation] = device_ns.get(e.correlation, 0) + e.end_ns - e.start_ns
            else:
                (ranges if e.annotation else host).append(e)
        calls = sorted(
            (e.thread, e.start_ns, device_ns[e.correlation])
            for e in host
            if e.correlation in device_ns and API_CALL.match(e.name)
        )
        starts = [(thread, start) for thread, start, _ in calls]
        return Launches(host, ranges, calls, starts, bool(device_ns))

    def gpu_ns(self, thread: int, start: int, end: int) -> int:
        """The GPU ns of the work launched on `thread` in [start, end]."""
        return sum(self.calls[i][2] for i in _within(self.starts, thread, start, end))


def call_costs(events: Iterable[TraceEvent], top: set[int], timed_from: int = 0) -> CallCosts:
    """Each top-level call's GPU ms (host ms where the trace holds no GPU activity) and the calls it ran; whether
    the step waits on the host: from the first call of run `timed_from` on (warm-up runs, the first one on the
    full path, spend host time that the timed runs do not), the GPU busy for under HOST_BOUND_SHARE of the span
    to the later of the last call's end and the last launch."""
    tops: dict[tuple[int, int], tuple[int, int, int]] = {}
    inner: list[tuple[int, int, Inner]] = []
    profile = Launches.of(events)
    host = profile.host
    for e in profile.ranges:
        if (at := parse_range(e.name)) is not None:
            tops[at] = (e.thread, e.start_ns, e.end_ns)
        elif (named := parse_range(e.name, INNER)) is not None:
            inner.append((e.thread, e.start_ns, named))
    launches = profile.calls
    forward = sorted(
        (e.thread, e.start_ns, e.sequence_nr) for e in host if e.sequence_nr >= 0 and not e.name.startswith(BACKWARD)
    )
    backward = {
        (e.fwd_thread, e.sequence_nr): (e.thread, e.start_ns, e.end_ns)
        for e in host
        if e.sequence_nr >= 0 and e.name.startswith(BACKWARD)
    }
    inner.sort()
    launch_starts = profile.starts
    forward_starts = [(thread, start) for thread, start, _ in forward]
    inner_starts = [(thread, start) for thread, start, _ in inner]
    costs = CallCosts(host_bound=_host_bound(profile, [w for (run, _), w in tops.items() if run >= timed_from]))
    for (run, position), (thread, start, end) in tops.items():
        if position not in top:
            continue
        windows = {(thread, start, end)}
        for i in _within(forward_starts, thread, start, end):  # the autograd nodes it made: their backward runs
            node = backward.get((thread, forward[i][2]))
            if node is not None:
                windows.add(node)
        if profile.on_gpu:
            launched = {i for window in windows for i in _within(launch_starts, *window)}
            ns = sum(launches[i][2] for i in launched)
        else:  # no GPU activity: the windows' host time
            ns = sum(e - s for _, s, e in windows)
        costs.ms[(run, position)] = ns / 1e6
        costs.members[(run, position)] = {inner[i][2] for window in windows for i in _within(inner_starts, *window)}
    return costs


@dataclass(frozen=True)
class GroupVerdict:
    """The calls of a step that share problems, decided together."""

    problems: tuple[Problem, ...]
    calls: int  # top-level op calls per step run
    ms: dict[str, float]  # per serving: the group's median ms per step run
    ratios: dict[str, float]  # per serving: median per-block ratio of its ms to "before"'s (under 1: faster)
    noise: float  # the control's median per-block spread (|control / tuned - 1|)
    chosen: str
    # Servings left out of the decision: a call of the group did not run under them (a patched loss calls torch
    # directly where torch serves it), so their times do not price the same calls.
    left_out: tuple[str, ...] = ()


def _groups(problems_of: Mapping[int, set[Problem]]) -> list[tuple[list[int], set[Problem]]]:
    """Positions joined where they share a problem (union-find), with the problems of each group."""
    parent = {p: p for p in problems_of}

    def root(p: int) -> int:
        while parent[p] != p:
            parent[p] = parent[parent[p]]
            p = parent[p]
        return p

    owner: dict[Problem, int] = {}
    for position, problems in problems_of.items():
        for problem in problems:
            if problem in owner:
                parent[root(position)] = root(owner[problem])
            else:
                owner[problem] = position
    groups: dict[int, tuple[list[int], set[Problem]]] = {}
    for position, problems in problems_of.items():
        positions, joined = groups.setdefault(root(position), ([], set()))
        positions.append(position)
        joined |= problems
    return list(groups.values())


@dataclass
class _Blocks:
    """Per serving, per block: top position -> ms per step run (the mean over the block's timed runs); and per top
    position, the other calls it ran in any run."""

    ms: dict[str, list[dict[int, float]]] = field(default_factory=dict)
    members: dict[int, set[Inner]] = field(default_factory=dict)


def _host_bound(profile: Launches, timed: list[tuple[int, int, int]]) -> bool:
    """Whether the GPU was busy under HOST_BOUND_SHARE of the timed calls' span, counting the work launched from
    the first timed call on, and the span to the last such launch where it comes after the last call."""
    if not profile.on_gpu or not timed:
        return False
    start = min(s for _, s, _ in timed)
    launched = [(at, ns) for _, at, ns in profile.calls if at >= start]
    end = max(max(e for _, _, e in timed), max((at for at, _ in launched), default=0))
    return sum(ns for _, ns in launched) < HOST_BOUND_SHARE * (end - start)


def _profile(
    call: Callable[[], Any], attribution: Attribution, first_run: int, runs: int, timed_from: int
) -> CallCosts:
    activities = [torch.profiler.ProfilerActivity.CPU]
    cuda = torch.cuda.is_available()
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        for run in range(first_run, first_run + runs):
            attribution.begin_run(run)
            call()
        if cuda:
            torch.cuda.synchronize()
    return call_costs(trace_events(profile), attribution.top, timed_from)


HOST_RUNS = 5  # step runs timed on the host per serving and block: a call's median over them


def _host_ms(call: Callable[[], Any], attribution: Attribution, first_run: int, runs: int) -> dict[int, float]:
    """Per top-level position, its median host ms over `runs` step runs without the profiler (the collector off:
    a collection inside one call would charge it milliseconds)."""
    per_run: dict[int, list[int]] = {}
    enabled = gc.isenabled()
    gc.disable()
    try:
        with attribution.timing_host() as host_ns:
            for run in range(first_run, first_run + runs):
                attribution.begin_run(run)
                call()
                for position, ns in host_ns.items():
                    per_run.setdefault(position, []).append(ns)
                host_ns.clear()
    finally:
        if enabled:
            gc.enable()
    return {position: statistics.median(ns) / 1e6 for position, ns in per_run.items()}


def charged(gpu_ms: Mapping[int, float], host_ms: Mapping[int, float]) -> dict[int, float]:
    """Per position in a step bound by the host: the longer of the call's GPU time and its host time."""
    return {p: max(ms, host_ms.get(p, 0.0)) for p, ms in gpu_ms.items()}


def _time_servings(
    call: Callable[[], Any], servings: Mapping[str, Serving], blocks: int, runs: int, warmup: int
) -> tuple[_Blocks, Attribution]:
    """Each block runs every serving (rotated order): `warmup` runs then `runs` timed ones, all profiled: the first
    run of a serving takes the full path, where dispatch notes each call's problems (later runs replay plans), and
    its profile says which top-level call each backward call belongs to. Where the first profile says the step
    waits on the host, every serving's calls are also timed on the host, in HOST_RUNS more runs without the profiler
    (one rule for every serving, so that their costs compare)."""
    timed = _Blocks({name: [] for name in servings})
    names = list(servings)
    first = 0
    host_bound: bool | None = None
    with attributing() as attribution:
        for block in range(blocks):
            for name in names[block % len(names) :] + names[: block % len(names)]:
                with servings[name]():
                    costs = _profile(call, attribution, first, warmup + runs, first + warmup)
                    host_bound = costs.host_bound if host_bound is None else host_bound
                    host_ms = _host_ms(call, attribution, first + warmup + runs, HOST_RUNS) if host_bound else {}
                per_position: dict[int, list[float]] = {}
                for (run, position), ms in costs.ms.items():
                    timed.members.setdefault(position, set()).update(costs.members[(run, position)])
                    if run >= first + warmup:
                        per_position.setdefault(position, []).append(ms)
                gpu_ms = {p: statistics.fmean(v) for p, v in per_position.items()}
                timed.ms[name].append(charged(gpu_ms, host_ms) if host_ms else gpu_ms)
                first += warmup + runs + (HOST_RUNS if host_ms else 0)
    return timed, attribution


def decide(per_block: Mapping[str, list[float]], floor: float) -> tuple[str, dict[str, float], float]:
    """(the serving kept, each serving's median per-block ratio to BEFORE, the control's spread) from a group's ms
    per block under each serving (BEFORE, TUNED and CONTROL among them)."""
    spreads = [abs(c / t - 1) for c, t in zip(per_block[CONTROL], per_block[TUNED]) if t > 0]
    noise = statistics.median(spreads) if spreads else 0.0
    ratios = {
        name: statistics.median(m / b if b > 0 else 1.0 for m, b in zip(ms, per_block[BEFORE]))
        for name, ms in per_block.items()
        if name != CONTROL
    }
    bar = 1 - max(noise, floor)
    winners = [name for name, ratio in ratios.items() if name != BEFORE and ratio < bar]
    return (min(winners, key=ratios.__getitem__) if winners else BEFORE), ratios, noise


def group_verdict(
    positions: list[int], problems: set[Problem], ms: Mapping[str, list[dict[int, float]]], floor: float
) -> GroupVerdict:
    """The decision for the calls at `positions` from each serving's per-block ms per position. A serving under
    which one of the calls did not run in some block is left out (its sum would price other calls)."""
    ran_all = [name for name, blocks in ms.items() if all(p in block for block in blocks for p in positions)]
    per_block = {name: [sum(block[p] for p in positions) for block in ms[name]] for name in ran_all}
    if {BEFORE, TUNED, CONTROL} <= set(per_block):
        chosen, ratios, noise = decide(per_block, floor)
    else:
        chosen, ratios, noise = BEFORE, {}, 0.0
    return GroupVerdict(
        tuple(sorted(problems, key=repr)),
        len(positions),
        {name: statistics.median(times) for name, times in per_block.items()},
        ratios,
        noise,
        chosen,
        tuple(name for name in ms if name not in per_block),
    )


def arbitrate(
    call: Callable[[], Any],
    servings: Mapping[str, Serving],
    problems: set[Problem],
    *,
    blocks: int = 3,
    runs: int = 2,
    warmup: int = 2,
    floor: float = 0.005,
) -> list[GroupVerdict]:
    """Time `call` (one step run) under each serving (BEFORE and TUNED required; CONTROL is added: TUNED again) and
    decide, per group of calls that share one of `problems`, which serving it keeps: BEFORE unless another is
    faster by more than the control's spread and `floor`, then the fastest."""
    servings = {**servings, CONTROL: servings[TUNED]}
    timed, attribution = _time_servings(call, servings, blocks, runs, warmup)
    problems_of: dict[int, set[Problem]] = {}
    for position in attribution.top:
        ran: set[int | Inner] = {position, *timed.members.get(position, set())}
        noted: set[Problem] = set().union(*(attribution.notes.get(p, set()) for p in ran))
        if noted & problems:
            problems_of[position] = noted & problems
    return [group_verdict(positions, noted, timed.ms, floor) for positions, noted in _groups(problems_of)]
