"""The model benchmark: language models of several families (tunekit.evaluation.model_families: Llama, Mistral,
Qwen2, Gemma and GPT-2 layouts) from transformers configs (random weights, nothing downloaded), run eagerly as users
run them, as eager, tunekit-patched, torch.compile (default mode and reduce-overhead), tunekit-patched under either
and Liger-Kernel (where it patches the family). Reports time, tokens/s, peak memory, agreement of logits and
gradients with eager, and each variant's first call (compiling included). Times CUDA GPUs only.

Needs transformers (and liger-kernel for that column): `pip install 'tunekit-triton[models]'`.
"""

from __future__ import annotations

import copy
import importlib
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from tunekit.core.errors import TunekitError
from tunekit.evaluation.model_families import FAMILIES
from tunekit.evaluation.model_results import (
    CHOICES_VARIANTS,
    DTYPE_NAME,
    RUNS,
    VARIANTS,
    Result,
    Workload,
    skipped,
    table,
    write_json,
)
from tunekit.integrations import inductor_outer_products
from tunekit.integrations.patching import patch

DTYPE: torch.dtype = getattr(torch, DTYPE_NAME)
# The probes (tests/gpu/) import the workload, the measuring and the table from here.
__all__ = ["RUNS", "VARIANTS", "Result", "Workload", "build", "measure", "table", "write_json"]


def require_transformers() -> Any:
    """transformers, imported only here: an optional extra that the rest of tunekit never needs."""
    try:
        import transformers
    except ImportError:
        raise TunekitError("the model benchmark needs transformers: pip install 'tunekit-triton[models]'") from None
    return transformers


def device_name() -> str:
    return torch.cuda.get_device_name()


def inputs(w: Workload, device: torch.device) -> dict[str, torch.Tensor]:
    """Token ids of each run (prefill, decode, train), the same for every variant."""
    gen = torch.Generator(device="cpu").manual_seed(1)
    return {run: torch.randint(0, w.vocab, getattr(w, run), generator=gen).to(device) for run in RUNS}


def forward(run: Callable[..., Any], ids: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A no-grad forward of `ids` (prefill or decode) returning the logits."""

    def call() -> torch.Tensor:
        with torch.no_grad():
            return run(ids, use_cache=False).logits

    return call


def loss(run: Callable[..., Any], ids: torch.Tensor) -> torch.Tensor:
    """The training loss of `ids` as its own labels: `.backward()` is the training run without the optimizer."""
    return run(ids, labels=ids, use_cache=False).loss


def run_once(model: torch.nn.Module, run: Callable[..., Any], ids: dict[str, torch.Tensor]) -> None:
    """Each run once (prefill and decode forwards in eval mode, a training forward and backward), what the workflow
    records problems from: every op a timed run calls, called once."""
    model.eval()
    forward(run, ids["prefill"])()
    forward(run, ids["decode"])()
    model.train()
    loss(run, ids["train"]).backward()
    model.zero_grad(set_to_none=True)


def build(w: Workload, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    transformers = require_transformers()
    family = FAMILIES.get(w.model)
    if family is None:
        raise TunekitError(f"model must be one of {', '.join(FAMILIES)}, but got {w.model!r}")
    torch.manual_seed(0)
    config = getattr(transformers, family.config)(**family.keywords(w))
    model: torch.nn.Module = getattr(transformers, family.model)(config)
    return model.to(device=device, dtype=dtype)


def _variant(base: torch.nn.Module, name: str, model_kind: str) -> tuple[torch.nn.Module, Callable[..., Any]]:
    """(the model to train, the callable to run) for one variant; a fresh copy of the base weights."""
    model = copy.deepcopy(base)
    if name.startswith("tunekit"):
        patch(model)
    if name == "liger":
        try:
            from liger_kernel.transformers import monkey_patch
        except ImportError:
            raise TunekitError("liger-kernel is not installed (pip install 'tunekit-triton[peer]')") from None
        apply = FAMILIES[model_kind].liger
        if apply is None or not hasattr(monkey_patch, apply):
            raise TunekitError(f"Liger-Kernel has no patch for {model_kind}")
        getattr(monkey_patch, apply)(model=model)
    run: Callable[..., Any] = model
    if name in CHOICES_VARIANTS:
        from tunekit.integrations.inductor_choices import gemm_choices_class

        options = dict(gemm_choices_class(untuned="inductor").compile_options)
        if name.endswith("-ro"):  # what mode="reduce-overhead" sets (mode and options exclude each other)
            options["triton.cudagraphs"] = True
        run = torch.compile(model, options=options)
    elif name.endswith("compile"):
        run = torch.compile(model)
    elif name.endswith("compile-ro"):
        run = torch.compile(model, mode="reduce-overhead")
    return model, run


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def _modeling_state(model_kind: str) -> list[tuple[Any, dict[str, Any]]]:
    """The namespaces Liger-Kernel's patch rewrites for every model of the process, not only the one it is given
    (the family's modeling module: its functions and its classes' attributes), as they are now."""
    try:
        modeling = importlib.import_module(FAMILIES[model_kind].modeling)
    except (ImportError, KeyError):
        return []
    classes = [c for c in vars(modeling).values() if isinstance(c, type) and c.__module__ == modeling.__name__]
    return [(modeling, dict(vars(modeling))), *((c, dict(vars(c))) for c in classes)]


def _restore(state: list[tuple[Any, dict[str, Any]]]) -> None:
    """Undo what a global patch changed in `state`'s namespaces, so the variants measured after it (and the
    workflow's) run transformers' own code: Liger swaps Llama's RoPE function, norm and MLP classes and its
    causal-LM forward at module level."""
    for owner, saved in state:
        for name in [n for n in vars(owner) if n not in saved]:
            delattr(owner, name)
        for name, value in saved.items():
            if vars(owner).get(name) is not value and not (name.startswith("__") and name.endswith("__")):
                setattr(owner, name, value)


DEVICE = "cuda"  # where the models run (the CPU tests run a tiny model on "cpu")
# Alternation rounds per run: every variant timed in turn each round (the order rotating), its speed the median of
# its per-round ratios to eager's time: a host-bound step (decode) drifts more between variants timed one after
# another than the variants differ.
ROUNDS = 5


@dataclass
class _Built:
    """A variant's model, what to call, and the modeling namespaces as its patch left them (Liger-Kernel's patch is
    global: swapped in only while its variant runs)."""

    name: str
    model: torch.nn.Module
    run: Callable[..., Any]
    namespaces: list[tuple[Any, dict[str, Any]]]

    @contextmanager
    def serving(self, clean: list[tuple[Any, dict[str, Any]]]) -> Iterator[None]:
        # compile alone and its modes compile their own graph, not the one tunekit's pass rewrites once a variant
        # patched a model (inductor_outer_products)
        own_graph = nullcontext() if self.name.startswith("tunekit") else inductor_outer_products.disabled()
        _restore(self.namespaces)
        try:
            with own_graph:
                yield
        finally:
            _restore(clean)


@dataclass
class _Prepared:
    step: Callable[[], Any]
    result: Result


def measure(w: Workload, variants: tuple[str, ...] = VARIANTS, reps: int = 10, rounds: int = ROUNDS) -> list[Result]:
    """Time each variant's runs in alternation with eager's (`rounds` rounds of `reps` timed calls each, after each
    variant's first call and warm-up), rows by variant then run. Eager always runs, and first: every other
    variant's agreement and speed are against it. Every variant is built before any is timed; what a global
    patch (Liger-Kernel's) changed is undone outside its variant's turns and after the run."""
    from tunekit.evaluation.step_timing import Alternation, median_ms, ratio

    variants = ("eager", *(v for v in variants if v not in ("eager", "liger")), *(v for v in variants if v == "liger"))
    clean = _modeling_state(w.model)
    device = torch.device(DEVICE)
    timer = partial(median_ms, on_gpu=device.type == "cuda")
    base = build(w, device, DTYPE)
    ids_of = inputs(w, device)
    built: list[_Built] = []
    skips: dict[str, Result] = {}
    try:
        for name in variants:
            try:
                model, run = _variant(base, name, w.model)
            except TunekitError as exc:
                skips[name] = skipped(w.model, name, str(exc))
                continue
            finally:
                namespaces = _modeling_state(w.model)
                _restore(clean)
            built.append(_Built(name, model, run, namespaces))
        del base
        rows: dict[tuple[str, str], Result] = {}
        reference: dict[str, Any] = {}
        for run_name in RUNS:
            prepared = {}
            for b in built:
                with b.serving(clean):
                    prepared[b.name] = _prepare(w, run_name, b, ids_of[run_name], reference)
            calls = {b.name: (prepared[b.name].step, partial(b.serving, clean)) for b in built}
            times = Alternation(timer, rounds, reps, warmup=3).run(calls)
            for name, p in prepared.items():
                p.result.ms = statistics.median(times[name])
                p.result.tokens_per_s = ids_of[run_name].numel() / p.result.ms * 1e3
                p.result.vs_eager = 1.0 if name == "eager" else ratio(times, "eager", name)
                rows[(name, run_name)] = p.result
    finally:
        built.clear()
        _restore(clean)
        torch.cuda.empty_cache()
    return [skips[v] if v in skips else rows[(v, r)] for v in variants for r in (("-",) if v in skips else RUNS)]


def _prepare(w: Workload, run_name: str, b: _Built, ids: torch.Tensor, reference: dict[str, Any]) -> _Prepared:
    """A variant's run ready to time: its first call (compiling included), its agreement with eager's (eager is
    prepared first and leaves its logits and gradients in `reference`), its peak memory over three more calls."""
    model, run = b.model, b.run
    if run_name == "train":
        model.train()
        clock = _first_call()
        grads = _grads(model, run, ids)  # before any optimizer step: every variant from the same weights
        first_s = clock()
        opt = torch.optim.SGD(model.parameters(), lr=1e-6)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            loss(run, ids).backward()
            opt.step()

    else:
        model.eval()
        step = forward(run, ids)
        clock = _first_call()
        logits = step()
        first_s = clock()
        logits = logits.clone()  # reduce-overhead: a CUDA graph's output is overwritten by the next replay
    peak = _peak_gib(model, step)
    result = Result(w.model, b.name, run_name, float("nan"), float("nan"), peak, first_call_s=first_s)
    if run_name == "train":
        if b.name == "eager":
            reference["grads"] = grads
        else:
            result.grad_rel_err = max(_rel(grads[k], reference["grads"][k]) for k in reference["grads"])
    elif b.name == "eager":
        reference[run_name] = logits
    else:
        ref = reference[run_name]
        result.logits_rel_err = _rel(logits, ref)
        result.argmax_agree = float((logits.argmax(-1) == ref.argmax(-1)).float().mean())
    return _Prepared(step, result)


def _synchronize() -> None:
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _first_call() -> Callable[[], float]:
    """A clock for a variant's first call of a run (compiling included, under torch.compile): call it after."""
    _synchronize()
    start = time.perf_counter()

    def seconds() -> float:
        _synchronize()
        return time.perf_counter() - start

    return seconds


def _reset_peak(model: torch.nn.Module) -> int:
    """Start a peak measurement; returns the baseline: memory allocated now that is not this model's weights
    (other variants' copies and kept references), so each peak counts the model's weights plus its run."""
    _synchronize()
    torch.cuda.reset_peak_memory_stats()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return torch.cuda.memory_allocated() - weights


def _peak_gib(model: torch.nn.Module, step: Callable[[], Any], calls: int = 3) -> float:
    """The peak memory of `calls` calls of `step` above what is not the model's weights, GiB (NaN off a GPU)."""
    on_gpu = next(model.parameters()).is_cuda
    before = _reset_peak(model) if on_gpu else 0
    for _ in range(calls):
        step()
    return (torch.cuda.max_memory_allocated() - before) / 2**30 if on_gpu else float("nan")


def _grads(model: torch.nn.Module, run: Any, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss(run, ids).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads
