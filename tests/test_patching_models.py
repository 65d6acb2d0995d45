"""tunekit.patch on model families it was not written against (transformers' tiny random configs, nothing
downloaded), and on the module shapes model code has: logits (and, for some, gradients) match the unpatched model,
unpatch restores it exactly, patching twice changes nothing, and what is swapped is what the structure says."""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass

import pytest
import torch

from tunekit.runtime.patching import patch, unpatch

transformers = pytest.importorskip("transformers")

WIDTH, VOCAB = 64, 128
_ENCODER = dict(  # BERT-like config keywords
    hidden_size=WIDTH,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    vocab_size=VOCAB,
    max_position_embeddings=64,
)
_DECODER = {**_ENCODER, "num_key_value_heads": 2, "head_dim": 16}  # Llama-like


@dataclass(frozen=True)
class Family:
    config: str  # transformers' config class
    model: str  # transformers' model class
    kwargs: dict
    norm: str | None  # what the norms of model code (a 1-D weight and an eps, not torch's) are swapped as
    fused: tuple[int, str | None]  # how many activations fuse (one per MLP), and which
    skipped: int = 0  # modules that look swappable but are not (a subclass with its own forward)


FAMILIES = {
    "mistral": Family("MistralConfig", "MistralForCausalLM", _DECODER, "RMSNorm (by structure)", (2, "silu")),
    "qwen2": Family("Qwen2Config", "Qwen2ForCausalLM", _DECODER, "RMSNorm (by structure)", (2, "silu")),
    "qwen3": Family("Qwen3Config", "Qwen3ForCausalLM", _DECODER, "RMSNorm (by structure)", (2, "silu")),
    # Gemma's norms compute x̂ * (1 + weight): swapped as that form, never as a plain RMSNorm.
    "gemma": Family(
        "GemmaConfig", "GemmaForCausalLM", _DECODER, "RMSNorm (1 + weight) (by structure)", (2, "gelu_tanh")
    ),
    "gemma2": Family(
        "Gemma2Config", "Gemma2ForCausalLM", _DECODER, "RMSNorm (1 + weight) (by structure)", (2, "gelu_tanh")
    ),
    "gemma3": Family(
        "Gemma3TextConfig", "Gemma3ForCausalLM", _DECODER, "RMSNorm (1 + weight) (by structure)", (2, "gelu_tanh")
    ),
    # Phi-3 projects gate and up in one GEMM and applies SiLU to half of it: nothing to fuse.
    "phi3": Family(
        "Phi3Config", "Phi3ForCausalLM", {**_DECODER, "pad_token_id": 0}, "RMSNorm (by structure)", (0, None)
    ),
    # Cohere's norm subtracts the mean and has no bias.
    "cohere": Family(
        "CohereConfig", "CohereForCausalLM", {**_DECODER, "pad_token_id": 0}, "LayerNorm (by structure)", (2, "silu")
    ),
    # Mixtral's experts hold their weights as 3-D tensors (no Linear): the router and attention are swapped.
    "mixtral": Family(
        "MixtralConfig",
        "MixtralForCausalLM",
        {**_DECODER, "num_local_experts": 4, "num_experts_per_tok": 2},
        "RMSNorm (by structure)",
        (0, None),
    ),
    # Nemotron's LayerNorm1P subclasses torch's LayerNorm with its own forward ((1 + weight)): left alone.
    "nemotron": Family("NemotronConfig", "NemotronForCausalLM", _DECODER, None, (0, None), skipped=5),
    "gpt_neox": Family(
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        dict(hidden_size=WIDTH, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB),
        None,
        (2, "gelu"),
    ),
    "opt": Family(
        "OPTConfig",
        "OPTForCausalLM",
        dict(
            hidden_size=WIDTH,
            ffn_dim=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            vocab_size=VOCAB,
            word_embed_proj_dim=WIDTH,
            max_position_embeddings=64,
            pad_token_id=1,
        ),
        None,
        (2, "relu"),
    ),
    # Falcon's FalconLinear subclasses torch's Linear with its own forward: skipped, 4 per layer.
    "falcon": Family(
        "FalconConfig",
        "FalconForCausalLM",
        dict(hidden_size=WIDTH, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB),
        None,
        (0, None),
        skipped=8,
    ),
    # BLOOM's MLP applies its GELU as a function: nothing to fuse.
    "bloom": Family(
        "BloomConfig",
        "BloomForCausalLM",
        dict(hidden_size=WIDTH, n_layer=2, n_head=4, vocab_size=VOCAB),
        None,
        (0, None),
    ),
    "gptj": Family(
        "GPTJConfig",
        "GPTJForCausalLM",
        dict(n_embd=WIDTH, n_layer=2, n_head=4, vocab_size=VOCAB, rotary_dim=8, n_positions=64),
        None,
        (2, "gelu_tanh"),
    ),
    # BERT: one GELU per layer, and one in the masked-LM head (dense, GELU, LayerNorm).
    "bert": Family("BertConfig", "BertForMaskedLM", _ENCODER, None, (3, "gelu")),
    "roberta": Family("RobertaConfig", "RobertaForMaskedLM", {**_ENCODER, "pad_token_id": 1}, None, (2, "gelu")),
    # T5's norm is an RMSNorm without mean subtraction, its statistics in fp32.
    "t5": Family(
        "T5Config",
        "T5ForConditionalGeneration",
        dict(d_model=WIDTH, d_kv=16, d_ff=96, num_layers=1, num_heads=4, vocab_size=VOCAB),
        "RMSNorm (by structure)",
        (2, "relu"),
    ),
}


def _build(name: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    family = FAMILIES[name]
    config_class = getattr(transformers, family.config, None)
    if config_class is None:
        pytest.skip(f"transformers {transformers.__version__} has no {family.config}")
    config = config_class(**family.kwargs)
    for attr in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout_rate", "dropout"):
        if hasattr(config, attr):
            setattr(config, attr, 0.0)
    torch.manual_seed(0)
    return getattr(transformers, family.model)(config).to(dtype)


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    extra = {"decoder_input_ids": ids} if model.config.is_encoder_decoder else {}
    return model(ids, **extra).logits


def _looks_like_norm(module: torch.nn.Module) -> bool:
    has_eps = any(hasattr(module, eps) for eps in ("eps", "variance_epsilon"))
    return has_eps and isinstance(getattr(module, "weight", None), torch.Tensor) and module.weight.dim() == 1


def _expected_kinds(model: torch.nn.Module, family: Family) -> Counter:
    """What the structure says patch swaps: torch's own modules by type, norms of model code by the family."""
    kinds: Counter = Counter()
    for module in model.modules():
        own_forward = next(
            (t for t in (torch.nn.LayerNorm, torch.nn.RMSNorm, torch.nn.Linear) if type(module) is t), None
        )
        if own_forward is not None:
            kinds[own_forward.__name__] += 1
        elif family.norm and not isinstance(module, torch.nn.LayerNorm) and _looks_like_norm(module):
            kinds[family.norm] += 1
    return kinds


def _state(model: torch.nn.Module) -> tuple[list[int], dict[str, torch.Tensor], str]:
    return [id(m) for m in model.modules()], {k: v.clone() for k, v in model.state_dict().items()}, str(model)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_patched_matches_and_unpatch_restores(name):
    model = _build(name).eval()
    reference = copy.deepcopy(model)
    ids = torch.randint(3, VOCAB, (2, 9))
    with torch.no_grad():
        expected = _logits(reference, ids)
    modules, state, text = _state(model)

    report = patch(model)
    family = FAMILIES[name]
    assert Counter(kind for _, kind in report.swapped) == _expected_kinds(model, family)
    count, activation = family.fused
    assert len(report.fused) == count and {a for _, a in report.fused} <= {activation}
    assert len(report.skipped) == family.skipped
    again = patch(model)
    assert again.swapped == [] and again.fused == []  # twice changes nothing
    with torch.no_grad():
        torch.testing.assert_close(_logits(model, ids), expected, atol=1e-4, rtol=1e-4)

    assert unpatch(model) == len(report.swapped)
    after_modules, after_state, after_text = _state(model)
    assert after_modules == modules and after_text == text
    assert after_state.keys() == state.keys() and all(torch.equal(after_state[k], v) for k, v in state.items())
    assert not any(k.startswith("_tunekit") or k == "forward" for m in model.modules() for k in m.__dict__)
    with torch.no_grad():
        assert torch.equal(_logits(model, ids), expected)


@pytest.mark.parametrize("name", ["gemma", "t5", "opt", "cohere"])
def test_family_gradients_match_in_train_mode(name):
    model = _build(name).train()
    reference = copy.deepcopy(model)
    report = patch(model)
    assert len(report.fused) == FAMILIES[name].fused[0]  # fused in train mode too (the probes run in eval mode)
    ids = torch.randint(3, VOCAB, (2, 7))
    for m in (model, reference):
        extra = {"decoder_input_ids": ids} if m.config.is_encoder_decoder else {}
        m(ids, labels=ids, **extra).loss.backward()
    grads = dict(reference.named_parameters())
    for pname, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[pname].grad, atol=1e-5, rtol=1e-3, msg=pname)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_family_half_precision_matches(dtype):
    model = _build("gemma", dtype).eval()
    reference = copy.deepcopy(model)
    ids = torch.randint(3, VOCAB, (2, 9))
    patch(model)
    with torch.no_grad():
        got, expected = _logits(model, ids), _logits(reference, ids)
    assert got.dtype == expected.dtype == dtype
    torch.testing.assert_close(got.float(), expected.float(), atol=5e-2, rtol=5e-2)


def test_tied_lm_head_stays_tied():
    model = _build("qwen2", torch.float32)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    keys = list(model.state_dict())
    report = patch(model)
    assert ("lm_head", "Linear") in report.swapped
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert list(model.state_dict()) == keys
