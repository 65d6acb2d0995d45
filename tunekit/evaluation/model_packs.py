"""The popular open models tunekit ships tuned ("model packs"): each model's exact layer widths, the token counts a
pack covers, and the recording of a model's problems into a plan.

A pack is built on a GPU (tests/gpu/model_packs.py): the model is made from its transformers config at its real
widths with one decoder layer (every layer of these models has the same problems) and random weights, patched with
tunekit.patch, run for each step below under tunekit.record_problems, and the plan is tuned; the entries of the
plan's problems are written to `cache/packs/<pack>.json`, which installs with the package and is served like every
shipped database (tunekit.store.database). A problem at another token count is not in a pack and is served as any
untuned problem (torch).

The widths are those of each release's published config.json (the `source` below); nothing is downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tunekit.core.errors import TunekitError


@dataclass(frozen=True)
class PackModel:
    name: str  # the pack's name: cache/packs/<name>.json
    source: str  # the release whose config.json gives the widths
    config: str  # transformers' config class
    model: str  # transformers' causal-LM class
    widths: dict[str, Any] = field(default_factory=dict)  # the config's keywords, but the layer count
    family: str | None = None  # the model benchmark's family of the same code (model_families: Liger's patch)


# batch x tokens of each step a pack covers: prefill and decode without grad, a training step with its backward.
PACK_STEPS: dict[str, tuple[int, int]] = {"prefill": (4, 1024), "decode": (8, 1), "train": (2, 1024)}

_GQA = dict(num_attention_heads=32, num_key_value_heads=8)
PACK_MODELS: dict[str, PackModel] = {
    m.name: m
    for m in (
        PackModel(
            "llama-3-8b", "meta-llama/Meta-Llama-3-8B", "LlamaConfig", "LlamaForCausalLM",
            dict(hidden_size=4096, intermediate_size=14336, vocab_size=128256, **_GQA), "llama",
        ),
        PackModel(
            "mistral-7b", "mistralai/Mistral-7B-v0.1", "MistralConfig", "MistralForCausalLM",
            dict(hidden_size=4096, intermediate_size=14336, vocab_size=32000, **_GQA), "mistral",
        ),
        PackModel(
            "qwen2.5-7b", "Qwen/Qwen2.5-7B", "Qwen2Config", "Qwen2ForCausalLM",
            dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4,
                 vocab_size=152064, tie_word_embeddings=False), "qwen2",
        ),
        PackModel(
            "gemma-2-9b", "google/gemma-2-9b", "Gemma2Config", "Gemma2ForCausalLM",
            dict(hidden_size=3584, intermediate_size=14336, num_attention_heads=16, num_key_value_heads=8,
                 head_dim=256, vocab_size=256000),
        ),
        PackModel(
            "phi-3-mini", "microsoft/Phi-3-mini-4k-instruct", "Phi3Config", "Phi3ForCausalLM",
            dict(hidden_size=3072, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=32,
                 vocab_size=32064),
        ),
        PackModel(
            "qwen2.5-32b", "Qwen/Qwen2.5-32B", "Qwen2Config", "Qwen2ForCausalLM",
            dict(hidden_size=5120, intermediate_size=27648, num_attention_heads=40, num_key_value_heads=8,
                 vocab_size=152064, tie_word_embeddings=False), "qwen2",
        ),
    )
}  # fmt: skip


def pack_model(name: str) -> PackModel:
    found = PACK_MODELS.get(name)
    if found is None:
        raise TunekitError(f"no model pack named {name!r}; the packs are {', '.join(PACK_MODELS)}")
    return found


def build_pack_model(
    name: str, device: torch.device | str, dtype: torch.dtype = torch.bfloat16, layers: int = 1
) -> torch.nn.Module:
    """The model at its release's widths with `layers` decoder layers and random weights (made on `device`, so a
    GPU initialises them; "meta" builds only the shapes)."""
    from tunekit.evaluation.model_bench import require_transformers

    transformers = require_transformers()
    spec = pack_model(name)
    config = getattr(transformers, spec.config)(**spec.widths, num_hidden_layers=layers)
    torch.manual_seed(0)
    with torch.device(device):
        model: torch.nn.Module = getattr(transformers, spec.model)(config)
    return model.to(dtype=dtype)


def record_pack_plan(
    model: torch.nn.Module, vocab: int, path: Path, steps: dict[str, tuple[int, int]] = PACK_STEPS
) -> int:
    """Run a patched copy of `model` once per step under tunekit.record_problems and write its plan to `path`
    (exact token counts, no buckets); returns the number of problems."""
    import copy

    from tunekit.evaluation.model_bench import forward, loss
    from tunekit.integrations.patching import patch
    from tunekit.runtime.recorder import record_problems

    patched = copy.deepcopy(model)
    patch(patched)
    device = next(model.parameters()).device
    gen = torch.Generator(device="cpu").manual_seed(1)
    with record_problems(buckets=False) as recorder:
        for step, (batch, tokens) in steps.items():
            ids = torch.randint(0, vocab, (batch, tokens), generator=gen).to(device)
            if step == "train":
                loss(patched, ids).backward()  # the model benchmark's step: its own labels
                patched.zero_grad(set_to_none=True)
            else:
                forward(patched, ids)()
    return recorder.write(path)
