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
import time
from collections.abc import Callable
from contextlib import nullcontext
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


def _time(fn: Callable[[], Any], warmup: int, reps: int) -> float:
    from tunekit.evaluation.step_timing import median_ms

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return median_ms(fn, reps)


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


def measure(w: Workload, variants: tuple[str, ...] = VARIANTS, reps: int = 10) -> list[Result]:
    """Time each variant's runs. Eager always runs, and first: every other variant's agreement and ratio are
    against it. Liger runs last, and what its patch changed globally is undone after it."""
    variants = ("eager", *(v for v in variants if v not in ("eager", "liger")), *(v for v in variants if v == "liger"))
    clean = _modeling_state(w.model)
    device = torch.device("cuda")
    base = build(w, device, DTYPE)
    ids_of = inputs(w, device)
    reference: dict[str, Any] = {}
    results: list[Result] = []
    for name in variants:
        try:
            model, run = _variant(base, name, w.model)
        except TunekitError as exc:
            results.append(skipped(w.model, name, str(exc)))
            continue
        # compile alone and its modes compile their own graph, not the one tunekit's pass rewrites once a variant
        # before them patched a model (inductor_outer_products)
        own_graph = nullcontext() if name.startswith("tunekit") else inductor_outer_products.disabled()
        with own_graph:
            results += _runs(w, name, model, run, ids_of, reference, reps)
        del model, run
        _restore(clean)
        torch.cuda.empty_cache()
    return results


def _runs(
    w: Workload,
    name: str,
    model: torch.nn.Module,
    run: Callable[..., Any],
    ids_of: dict[str, torch.Tensor],
    reference: dict[str, Any],
    reps: int,
) -> list[Result]:
    """One variant's runs (prefill, decode, train), each timed after its first call; `reference` holds eager's
    logits and gradients (eager runs first) for the others' agreement."""
    results: list[Result] = []
    for run_name in RUNS:
        ids = ids_of[run_name]
        if run_name == "train":
            model.train()
            clock = _first_call()
            grads = _grads(model, run, ids)  # before any optimizer step: every variant from the same weights
            first_s = clock()
            opt = torch.optim.SGD(model.parameters(), lr=1e-6)

            def step(ids: torch.Tensor = ids, opt: torch.optim.Optimizer = opt, run: Any = run) -> None:
                opt.zero_grad(set_to_none=True)
                loss(run, ids).backward()
                opt.step()

            before = _reset_peak(model)
            ms = _time(step, 3, reps)
        else:
            model.eval()
            infer = forward(run, ids)
            clock = _first_call()
            logits = infer()
            first_s = clock()
            logits = logits.clone()  # reduce-overhead: a CUDA graph's output is overwritten by the next replay
            before = _reset_peak(model)
            ms = _time(infer, 3, reps)
        peak = (torch.cuda.max_memory_allocated() - before) / 2**30
        tokens = ids.numel()
        result = Result(w.model, name, run_name, ms, tokens / ms * 1e3, peak, first_call_s=first_s)
        if run_name == "train":
            if name == "eager":
                reference["grads"] = grads
            else:
                result.grad_rel_err = max(_rel(grads[k], reference["grads"][k]) for k in reference["grads"])
        elif name == "eager":
            reference[run_name] = logits
        else:
            ref = reference[run_name]
            result.logits_rel_err = _rel(logits, ref)
            result.argmax_agree = float((logits.argmax(-1) == ref.argmax(-1)).float().mean())
        results.append(result)
    return results


def _first_call() -> Callable[[], float]:
    """A clock for a variant's first call of a run (compiling included, under torch.compile): call it after."""
    torch.cuda.synchronize()
    start = time.perf_counter()

    def seconds() -> float:
        torch.cuda.synchronize()
        return time.perf_counter() - start

    return seconds


def _reset_peak(model: torch.nn.Module) -> int:
    """Start a peak measurement; returns the baseline: memory allocated now that is not this model's weights
    (other variants' copies and kept references), so each peak counts the model's weights plus its run."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return torch.cuda.memory_allocated() - weights


def _grads(model: torch.nn.Module, run: Any, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss(run, ids).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads
