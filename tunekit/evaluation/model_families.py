"""The language-model families the model benchmark builds from transformers configs (random weights, nothing
downloaded), at any width: each family's layout (attention heads and key/value groups, q/k/v bias, MLP width and
kind, tied or untied embeddings) follows its 7B-class release, scaled to the workload's hidden size and vocabulary.

    llama    gated SiLU MLP (2.6875x), MHA, untied embeddings        Llama-2-7B's layout
    mistral  gated SiLU MLP (3.5x), GQA (8 key/value heads)           Mistral-7B's
    qwen2    gated SiLU MLP (~5.29x), GQA (4 groups), q/k/v bias      Qwen2-7B's (152k vocabulary there)
    gemma    gated GELU MLP (8x), MQA, heads of 256, tied embeddings  Gemma-2B's (256k vocabulary there)
    gpt2     plain GELU MLP (4x), LayerNorm, biases, tied embeddings  GPT-2's
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tunekit.evaluation.model_results import Workload


@dataclass(frozen=True)
class Family:
    config: str  # transformers' config class
    model: str  # transformers' causal-LM class
    keywords: Callable[[Workload], dict[str, Any]]  # the config's keywords for a workload
    liger: str | None  # Liger-Kernel's monkey_patch function for the family, where it has one
    modeling: str  # transformers' modeling module (what a global patch rewrites)


def _heads(w: Workload, width: int = 128) -> int:
    return max(1, w.hidden // width)


def _decoder(w: Workload, mlp: float, kv_heads: int | None, **extra: Any) -> dict[str, Any]:
    heads = _heads(w)
    return dict(
        hidden_size=w.hidden,
        intermediate_size=int(w.hidden * mlp),
        num_hidden_layers=w.layers,
        num_attention_heads=heads,
        num_key_value_heads=heads if kv_heads is None else max(1, min(heads, kv_heads)),
        vocab_size=w.vocab,
        **extra,
    )


FAMILIES: dict[str, Family] = {
    "llama": Family(
        "LlamaConfig", "LlamaForCausalLM", lambda w: _decoder(w, 2.6875, None), "apply_liger_kernel_to_llama",
        "transformers.models.llama.modeling_llama",
    ),
    "mistral": Family(
        "MistralConfig", "MistralForCausalLM", lambda w: _decoder(w, 3.5, 8), "apply_liger_kernel_to_mistral",
        "transformers.models.mistral.modeling_mistral",
    ),
    "qwen2": Family(
        "Qwen2Config", "Qwen2ForCausalLM", lambda w: _decoder(w, 18944 / 3584, 4, tie_word_embeddings=False),
        "apply_liger_kernel_to_qwen2", "transformers.models.qwen2.modeling_qwen2",
    ),
    "gemma": Family(
        "GemmaConfig", "GemmaForCausalLM",
        lambda w: {**_decoder(w, 8.0, 1), "num_attention_heads": _heads(w, 256), "head_dim": 256},
        "apply_liger_kernel_to_gemma", "transformers.models.gemma.modeling_gemma",
    ),
    "gpt2": Family(
        "GPT2Config", "GPT2LMHeadModel",
        lambda w: dict(
            n_embd=w.hidden, n_layer=w.layers, n_head=_heads(w, 64), vocab_size=w.vocab,
            n_positions=max(w.prefill[1], w.train[1]), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        ),
        None, "transformers.models.gpt2.modeling_gpt2",
    ),
}  # fmt: skip
