"""The model benchmark: a Llama- and a GPT-2-style model from transformers configs (random weights, nothing
downloaded), run eagerly as users run them, as eager, tunekit-patched, torch.compile, tunekit-patched under
torch.compile and Liger-Kernel (where it supports the model). Reports time, tokens/s, peak memory, and agreement
of logits and gradients with eager.

Needs transformers (and liger-kernel for that column): `pip install 'tunekit-triton[models]'`.
"""

from __future__ import annotations

import copy
import json
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from tunekit.core.errors import TunekitError
from tunekit.runtime.patching import patch

VARIANTS = ("eager", "tunekit", "compile", "tunekit+compile", "liger")
RUNS = ("prefill", "decode", "train")


@dataclass(frozen=True)
class Workload:
    model: str  # "llama" or "gpt2"
    layers: int = 2
    hidden: int = 4096
    prefill: tuple[int, int] = (4, 1024)  # batch, tokens
    decode: tuple[int, int] = (8, 1)
    train: tuple[int, int] = (4, 1024)
    vocab: int = 32000


@dataclass
class Result:
    model: str
    variant: str
    run: str
    ms: float
    tokens_per_s: float
    peak_gib: float  # peak allocated during the run, above what was allocated before it (weights included)
    logits_rel_err: float | None = None
    argmax_agree: float | None = None
    grad_rel_err: float | None = None
    notes: list[str] = field(default_factory=list)


def build(w: Workload, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    try:
        import transformers
    except ImportError:
        raise TunekitError("the model benchmark needs transformers: pip install 'tunekit-triton[models]'") from None
    torch.manual_seed(0)
    if w.model == "llama":
        config: Any = transformers.LlamaConfig(
            hidden_size=w.hidden,
            intermediate_size=int(w.hidden * 2.6875),  # 11008 at 4096, Llama-2-7B's ratio
            num_hidden_layers=w.layers,
            num_attention_heads=max(1, w.hidden // 128),
            num_key_value_heads=max(1, w.hidden // 128),
            vocab_size=w.vocab,
        )
        model: torch.nn.Module = transformers.LlamaForCausalLM(config)
    elif w.model == "gpt2":
        config = transformers.GPT2Config(
            n_embd=w.hidden, n_layer=w.layers, n_head=max(1, w.hidden // 64), vocab_size=w.vocab,
            n_positions=max(w.prefill[1], w.train[1]), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        )  # fmt: skip
        model = transformers.GPT2LMHeadModel(config)
    else:
        raise TunekitError(f"model must be 'llama' or 'gpt2', but got {w.model!r}")
    return model.to(device=device, dtype=dtype)


def _variant(base: torch.nn.Module, name: str, model_kind: str) -> tuple[torch.nn.Module, Callable[..., Any]]:
    """(the model to train, the callable to run) for one variant; a fresh copy of the base weights."""
    model = copy.deepcopy(base)
    if name in ("tunekit", "tunekit+compile"):
        patch(model)
    if name == "liger":
        try:
            from liger_kernel.transformers import monkey_patch
        except ImportError:
            raise TunekitError("liger-kernel is not installed") from None
        if model_kind != "llama":
            raise TunekitError(f"Liger-Kernel has no patch for {model_kind}")
        monkey_patch.apply_liger_kernel_to_llama(model=model)
    run: Callable[..., Any] = torch.compile(model) if name.endswith("compile") else model
    return model, run


def _time(fn: Callable[[], Any], warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def measure(w: Workload, variants: tuple[str, ...] = VARIANTS, reps: int = 10) -> list[Result]:
    """Time each variant's runs. Eager always runs, and first: every other variant's agreement and ratio are
    against it."""
    variants = ("eager", *(v for v in variants if v != "eager"))
    device, dtype = torch.device("cuda"), torch.bfloat16
    base = build(w, device, dtype)
    gen = torch.Generator(device="cpu").manual_seed(1)
    inputs = {run: torch.randint(0, w.vocab, getattr(w, run), generator=gen).to(device) for run in RUNS}
    reference: dict[str, Any] = {}
    results: list[Result] = []
    for name in variants:
        try:
            model, run = _variant(base, name, w.model)
        except TunekitError as exc:
            results.append(Result(w.model, name, "-", float("nan"), float("nan"), float("nan"), notes=[str(exc)]))
            continue
        for run_name in RUNS:
            ids = inputs[run_name]
            if run_name == "train":
                model.train()
                grads = _grads(model, run, ids)  # before any optimizer step: every variant from the same weights
                opt = torch.optim.SGD(model.parameters(), lr=1e-6)

                def step(ids: torch.Tensor = ids, opt: torch.optim.Optimizer = opt, run: Any = run) -> None:
                    opt.zero_grad(set_to_none=True)
                    run(ids, labels=ids, use_cache=False).loss.backward()
                    opt.step()

                before = _reset_peak(model)
                ms = _time(step, 3, reps)
            else:
                model.eval()

                def forward(ids: torch.Tensor = ids, run: Any = run) -> Any:
                    with torch.no_grad():
                        return run(ids, use_cache=False).logits

                logits = forward()
                before = _reset_peak(model)
                ms = _time(forward, 3, reps)
            peak = (torch.cuda.max_memory_allocated() - before) / 2**30
            tokens = ids.numel()
            result = Result(w.model, name, run_name, ms, tokens / ms * 1e3, peak)
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
        del model, run
        torch.cuda.empty_cache()
    return results


def _reset_peak(model: torch.nn.Module) -> int:
    """Start a peak measurement; returns the baseline: memory allocated now that is not this model's weights
    (other variants' copies and kept references), so each peak counts the model's weights plus its run."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return torch.cuda.memory_allocated() - weights


def _grads(model: torch.nn.Module, run: Any, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    run(ids, labels=ids, use_cache=False).loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return grads


def table(results: list[Result]) -> str:
    eager = {(r.model, r.run): r.ms for r in results if r.variant == "eager"}
    lines = [
        f"{'model':6} {'run':8} {'variant':16} {'ms':>8} {'vs eager':>9} {'tok/s':>10} {'peak GiB':>9} "
        f"{'logits err':>10} {'argmax':>7} {'grad err':>9}"
    ]
    for r in results:
        if r.notes:
            lines.append(f"{r.model:6} {'-':8} {r.variant:16} skipped: {r.notes[0]}")
            continue
        ratio = eager.get((r.model, r.run), float("nan")) / r.ms
        fmt = lambda v, f: "" if v is None else format(v, f)  # noqa: E731
        lines.append(
            f"{r.model:6} {r.run:8} {r.variant:16} {r.ms:8.3f} {ratio:8.2f}x {r.tokens_per_s:10.0f} "
            f"{r.peak_gib:9.2f} {fmt(r.logits_rel_err, '10.4f'):>10} {fmt(r.argmax_agree, '7.3f'):>7} "
            f"{fmt(r.grad_rel_err, '9.4f'):>9}"
        )
    return "\n".join(lines)


def write_json(results: list[Result], path: Path) -> None:
    path.write_text(json.dumps([asdict(r) for r in results], indent=1))
