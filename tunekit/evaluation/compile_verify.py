"""The compiled model step decides what a compiled graph runs: each kernel's under-compile choices are kept only
where the model's compiled steps are not slower with them than compile alone.

A problem's choice is measured alone (tunekit/tuning/inductor_candidate.py), where Inductor fuses nothing around
it; in a model, a kernel node between Inductor's kernels stops fusions (a norm with its residual add) and small
wins drown in the step. So, per kernel with choices, the model is compiled with only that kernel's choices and
timed against compile alone in alternation (median of per-round ratios), every step; a kernel slower in any step
by more than the noise gets a verdict in its entries (compile_policy.MODEL_VERDICT), which turns its choices off.
Last, all kept kernels together are checked the same way, and turned off together if the whole is slower.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial

import torch

from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.evaluation.step_timing import Alternation, StepTimer, default_timer, ratio
from tunekit.runtime import compile_policy, dispatch
from tunekit.store.entry import Entry, under_compile_record, with_under_compile
from tunekit.store.store import Store

NOISE = 0.01  # a kernel must not cost the step more than this fraction (the control's spread on the H200)
Step = Callable[[torch.nn.Module], object]


@dataclass
class Verdict:
    kernels: tuple[str, ...]
    ratios: dict[str, float]  # per step: compile alone time / time with the kernels' choices (> 1: faster)

    @property
    def kept(self) -> bool:
        return all(r >= 1 - NOISE for r in self.ratios.values())


def _chosen(store: Store) -> dict[str, list[Entry]]:
    device = fingerprint()
    by_kernel: dict[str, list[Entry]] = {}
    for entry in store.entries():
        spec = get_spec(entry.key.kernel)
        if entry.key.device_key != device.key or entry.key.source_hash != spec.source_hash:
            continue
        if dispatch.serves_kernel(spec, entry, device) and compile_policy.beats_inductor(entry):
            by_kernel.setdefault(entry.key.kernel, []).append(entry)
    return by_kernel


def _first_call(only: frozenset[str], call: Callable[[], object]) -> None:
    """Run `call` once with the choices of `only` (empty: none): a compiled model's graphs are built on its first
    call of each step, under the policy of that moment, and the policy is no guard of theirs."""
    compile_policy.ONLY_KERNELS = only
    dispatch.reset_all()
    call()


def _time(model: torch.nn.Module, kernels: frozenset[str], steps: Mapping[str, Step], opts: dict) -> Verdict:
    alone: torch.nn.Module = torch.compile(copy.deepcopy(model), **opts["compile"])  # type: ignore[assignment]
    mine: torch.nn.Module = torch.compile(copy.deepcopy(model), **opts["compile"])  # type: ignore[assignment]
    ratios = {}
    for name, step in steps.items():
        calls: dict[str, tuple[Callable[[], object], Callable[[], AbstractContextManager[object]]]] = {
            "alone": (partial(step, alone), nullcontext),
            "mine": (partial(step, mine), nullcontext),
        }
        _first_call(frozenset(), calls["alone"][0])
        _first_call(kernels, calls["mine"][0])
        times = Alternation(opts["timer"], opts["rounds"], opts["reps"]).run(calls)
        ratios[name] = ratio(times, "alone", "mine")
    return Verdict(tuple(sorted(kernels)), ratios)


def _record(store: Store, entries: list[Entry], verdict: Verdict) -> None:
    why = ", ".join(f"{step} {r:.3f}x" for step, r in verdict.ratios.items())
    for entry in entries:
        record = {
            **(under_compile_record(entry.provenance) or {}),
            compile_policy.MODEL_VERDICT: f"slower compiled: {why}",
        }
        store.put(with_under_compile(entry, record))


def verify_under_compile(
    model: torch.nn.Module,
    steps: Mapping[str, Step],
    timer: StepTimer | None = None,
    rounds: int = 5,
    reps: int = 5,
    **compile_kwargs: object,
) -> list[Verdict]:
    """Check each kernel's under-compile choices in `model`'s compiled steps (a patched model: `steps` call it);
    turn off the choices of a kernel that makes a step slower. Returns the verdicts, per kernel, then all kept."""
    opts = {"timer": timer or default_timer(model), "rounds": rounds, "reps": reps, "compile": compile_kwargs}
    verdicts: list[Verdict] = []
    try:
        with Store() as store:
            chosen = _chosen(store)
        for kernel, entries in sorted(chosen.items()):
            verdict = _time(model, frozenset({kernel}), steps, opts)
            verdicts.append(verdict)
            if not verdict.kept:
                with Store() as store:
                    _record(store, entries, verdict)
        kept = frozenset(v.kernels[0] for v in verdicts if v.kept)
        if len(kept) > 1:
            together = _time(model, kept, steps, opts)
            verdicts.append(together)
            if not together.kept:
                with Store() as store:
                    _record(store, [e for k in kept for e in chosen[k]], together)
    finally:
        compile_policy.ONLY_KERNELS = None
        dispatch.reset_all()
        torch._dynamo.reset()
    return verdicts
