"""One candidate, checked then timed: fresh random inputs, NaN-poisoned outputs, compare to the reference.

`measure` is the whole per-candidate step, shared by the in-process tuner and the isolated worker
(tunekit.tuning.isolation), so both record exactly the same outcomes.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch

from tunekit.core import backend
from tunekit.core.space import Config, Problem
from tunekit.core.spec import DTYPE_NAMES, KernelSpec, Tolerance
from tunekit.core.triton_adapter import KERNEL_FAILURES
from tunekit.launch.plan import Replay, build_plan, call_signature
from tunekit.launch.watch import Watch
from tunekit.store.entry import TrialRecord
from tunekit.tuning.bench import Timer
from tunekit.tuning.phases import Stopwatch

# Only these score a config as failed; anything else is a bug and propagates.
KNOWN_KERNEL_FAILURES: tuple[type[BaseException], ...] = (
    *KERNEL_FAILURES,  # Triton's: compilation, out of resources, ptxas, the interpreter
    RuntimeError,  # CUDA launch errors and torch errors raised inside a launch
)
_MAX_ERROR_CHARS = 300


def poison(out: torch.Tensor) -> None:
    """Fill an output with values no correct kernel leaves behind: NaN, or the most negative integer."""
    out.fill_(float("nan") if out.dtype.is_floating_point else torch.iinfo(out.dtype).min)


def check_outputs(
    spec: KernelSpec,
    outputs: tuple[torch.Tensor, ...],
    expected: tuple[torch.Tensor, ...],
    widen: Callable[[Tolerance, torch.Tensor], Tolerance] | None = None,
) -> str | None:
    """None when every output matches within the spec's tolerance for its dtype, else why not.

    `widen(tolerance, reference)` adjusts each floating output's tolerance (the benchmark's baselines).
    """
    if len(outputs) != len(expected):
        return f"kernel returned {len(outputs)} outputs, reference {len(expected)}"
    for i, (out, ref) in enumerate(zip(outputs, expected)):
        if out.shape != ref.shape:
            return f"output {i}: shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
        # Compared where the output lives: on a GPU, moving tens of MB to the host and comparing them in float64 on
        # the CPU cost more than the candidate's timing, and workers sharing a host's cores slowed each other.
        want = ref.detach().to(out.device)
        if not out.dtype.is_floating_point:
            differ = out != want.to(out.dtype)
            if bool(differ.any()):
                return f"output {i}: {int(differ.sum())} integer elements differ"
            continue
        tol = spec.tolerances[DTYPE_NAMES.get(out.dtype, "float32")]
        if widen is not None:
            tol = widen(tol, ref)
        got, want = out.detach().double(), want.double()
        # NaN where the reference is finite means an element was never written (outputs are poisoned).
        unwritten = torch.isnan(got) & ~torch.isnan(want)
        if bool(unwritten.any()):
            return f"output {i}: {int(unwritten.sum())} elements not written or NaN"
        if not torch.allclose(got, want, atol=tol.atol, rtol=tol.rtol, equal_nan=True):
            err = (got - want).abs().nan_to_num(0.0).max().item()
            return f"output {i}: max abs error {err:.3g} over tolerance (atol={tol.atol}, rtol={tol.rtol})"
    return None


def verify_config(
    spec: KernelSpec, config: Config, problem: Problem, device: torch.device, seed: int, watch: Stopwatch | None = None
) -> str | None:
    """Run the candidate once on fresh inputs; None when correct, else the reason it is wrong. `watch` gets the
    first launch (Triton's compile of the config, unless compiled already) as `compile`, the rest as `verify`."""
    watch = watch or Stopwatch(None)
    inputs = spec.make_inputs(problem, device, seed)
    outputs = spec.alloc_outputs(inputs)
    for out in outputs:
        poison(out)
    watch.lap("verify")
    try:
        spec.launch(config, inputs, outputs)
    finally:
        watch.lap("compile")
    try:
        return check_outputs(spec, outputs, spec.reference(inputs))
    finally:
        watch.lap("verify")


def failure(config: Config, exc: BaseException) -> TrialRecord:
    return TrialRecord(dict(config), "failed", error=f"{exc.__class__.__name__}: {str(exc)[:_MAX_ERROR_CHARS]}")


def measure(
    spec: KernelSpec,
    config: Config,
    problem: Problem,
    device: torch.device,
    inputs: tuple[Any, ...],
    outputs: tuple[Any, ...],
    timer: Timer,
    verify_seed: int,
    phases: dict[str, float] | None = None,
) -> TrialRecord:
    """Verify on fresh inputs (seeded `verify_seed`), then time on the shared bench inputs/outputs.

    Known kernel failures become a `failed` record; a wrong answer a `wrong` one (never timed). `phases` receives
    the seconds spent in compile, verify and bench (tunekit.tuning.phases).
    """
    watch = Stopwatch(phases)
    try:
        wrong = verify_config(spec, config, problem, device, seed=verify_seed, watch=watch)
        if wrong is not None:
            return TrialRecord(dict(config), "wrong", error=wrong)
        if backend.INTERPRETED:  # interpreter timings mean nothing; no second launch to watch
            ms = timer(lambda: spec.launch(config, inputs, outputs), config)
        else:
            ms = timer(as_called_eagerly(spec, config, inputs, outputs), config)
    except KNOWN_KERNEL_FAILURES as exc:
        return failure(config, exc)
    finally:
        watch.lap("bench")
    return TrialRecord(dict(config), "ok", time_ms=float(ms))


def retime(
    spec: KernelSpec, config: Config, inputs: tuple[Any, ...], outputs: tuple[Any, ...], timer: Timer
) -> TrialRecord:
    """Time a config measured before (the winner's confirmation), without verifying it again."""
    try:
        launch = functools.partial(spec.launch, config, inputs, outputs)
        ms = timer(launch if backend.INTERPRETED else as_called_eagerly(spec, config, inputs, outputs), config)
    except KNOWN_KERNEL_FAILURES as exc:
        return failure(config, exc)
    return TrialRecord(dict(config), "ok", time_ms=float(ms))


class InProcessBench:
    """Candidates run in the tuner's own process on shared bench inputs (the interpreter and custom timers).
    `last_phases`: the seconds of the last measurement by phase (tunekit.tuning.phases)."""

    def __init__(self, spec: KernelSpec, problem: Problem, seed: int, timer: Timer) -> None:
        self.spec = spec
        self.problem = problem
        self.timer = timer
        self.label = timer.label
        self.torch_device = backend.torch_device()
        self.inputs = spec.make_inputs(problem, self.torch_device, seed)
        self.outputs = spec.alloc_outputs(self.inputs)
        self.last_phases: dict[str, float] = {}

    def measure(self, config: Config, verify_seed: int) -> TrialRecord:
        self.last_phases = {}
        return measure(
            self.spec, config, self.problem, self.torch_device, self.inputs, self.outputs, self.timer, verify_seed,
            self.last_phases,
        )  # fmt: skip

    def precompile(self, configs: list[Config], threads: int) -> None:
        """Compile `configs` ahead on `threads` threads (tunekit.tuning.precompile; nothing in the interpreter)."""
        from tunekit.tuning.precompile import compile_all

        compile_all(self.spec, configs, self.inputs, self.outputs, threads)

    def retime(self, config: Config) -> TrialRecord:
        start = time.perf_counter()
        try:
            return retime(self.spec, config, self.inputs, self.outputs, self.timer)
        finally:
            self.last_phases = {"bench": time.perf_counter() - start}


def as_called_eagerly(
    spec: KernelSpec, config: Config, inputs: tuple[Any, ...], outputs: tuple[Any, ...]
) -> Callable[[], object]:
    """The launch as a user's eager call of its op runs it once the op holds a plan (tunekit/runtime/hotpath.py):
    the call signature, the plan's lookup by it, then the replay (its allocations, straight into each compiled
    kernel's launcher). A launch no plan can replay (one that runs torch ops, say) is timed as the full path it
    keeps. The GPU time is the same either way; the host time, which the timer counts for launch-bound problems,
    is what the user's call pays, so a kernel races torch's op with tunekit's own per-call work on it."""

    def launch() -> None:
        spec.launch(config, inputs, outputs)

    watch = Watch()
    with watch.active():
        launch()
    args: tuple[Any, ...] = (*inputs, *outputs)
    plan, _ = build_plan(watch, args, {}, None, None)
    if not isinstance(plan, Replay):
        return launch
    plans = {call_signature(args, {}): plan}

    def served() -> object:
        return plans[call_signature(args, {})](args, {})

    return served
