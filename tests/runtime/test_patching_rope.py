"""tunekit.patch and rotary position embedding: attention code that calls a RoPE function by global name runs
tunekit's fused op instead, per instance (recognized by what the function computes, in the interpreter)."""

from __future__ import annotations

import copy
import sys
import types

import pytest
import torch
from helpers import count_calls, tiny_llama

from tunekit.integrations import patching_rope
from tunekit.integrations.patching import patch, unpatch

transformers = pytest.importorskip("transformers")

VOCAB = 128


def _llama() -> torch.nn.Module:
    return tiny_llama(layers=2, vocab=VOCAB)


def _neox() -> torch.nn.Module:  # a partial rotary: cos and sin narrower than the heads
    config = transformers.GPTNeoXConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, vocab_size=VOCAB,
        rotary_pct=0.5,
    )  # fmt: skip
    return transformers.GPTNeoXForCausalLM(config)


@pytest.fixture
def rope_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the calls that reach tunekit's op."""
    return count_calls(monkeypatch, patching_rope.ops, "rotary_embedding")


def _kinds(report: object) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, kind in report.swapped:  # type: ignore[attr-defined]
        counts[kind] = counts.get(kind, 0) + 1
    return counts


@pytest.mark.parametrize(("build", "fused_calls"), [(_llama, 2), (_neox, 0)])
def test_rope_runs_on_tunekit_and_unpatch_restores(build, fused_calls: int, rope_calls: list[int]) -> None:
    torch.manual_seed(0)
    model = build().eval()
    reference = copy.deepcopy(model)
    ids = torch.randint(0, VOCAB, (2, 9))
    with torch.no_grad():
        expected = reference(ids).logits
    report = patch(model)
    assert _kinds(report)["RoPE (by probe)"] == 2  # one per attention module
    assert patch(model).swapped == []
    rope_calls.clear()  # patch checked the op on the model's dtypes
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, atol=1e-4, rtol=1e-4)
    # Llama's calls reach the op; GPT-NeoX's partial rotary (cos narrower than q) keeps its own function.
    assert len(rope_calls) == fused_calls

    model.train(), reference.train()
    model(ids, labels=ids).loss.backward()
    reference(ids, labels=ids).loss.backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-3, msg=name)

    unpatch(model)
    assert not any("forward" in m.__dict__ for m in model.modules())
    with torch.no_grad():
        model.eval()
        torch.testing.assert_close(model(ids).logits, expected, atol=0, rtol=0)


def test_patching_one_instance_leaves_the_class_and_other_instances(rope_calls: list[int]) -> None:
    torch.manual_seed(0)
    patched, other = _llama().eval(), _llama().eval()
    attention = type(patched.model.layers[0].self_attn)
    module_globals = sys.modules[attention.__module__].__dict__
    before, class_forward = dict(module_globals), attention.forward
    patch(patched)
    assert attention.forward is class_forward and module_globals.keys() == before.keys()
    assert all(module_globals[k] is v for k, v in before.items())
    rope_calls.clear()  # patch's own probe of the model's dtypes (when no earlier test made it) is not a call of theirs
    with torch.no_grad():
        other(torch.randint(0, VOCAB, (1, 5)))
    assert rope_calls == []  # the unpatched instance runs its class's code and globals


def _not_rope(q, k, cos, sin):  # rotates the other way: sin's sign flipped
    half = q.shape[-1] // 2

    def rot(x):
        return torch.cat((x[..., half:], -x[..., :half]), dim=-1)

    return q * cos.unsqueeze(1) + rot(q) * sin.unsqueeze(1), k * cos.unsqueeze(1) + rot(k) * sin.unsqueeze(1)


def _interleaved_rope(q, k, cos, sin):  # GPT-J's pairs: another formula
    def rot(x):
        return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)

    return q * cos.unsqueeze(1) + rot(q) * sin.unsqueeze(1), k * cos.unsqueeze(1) + rot(k) * sin.unsqueeze(1)


rope = None  # what _Attention calls by global name; each test sets it


class _Attention(torch.nn.Module):
    def forward(self, q, k, cos, sin):
        return rope(q, k, cos, sin)


def _true_rope(q, k, cos, sin):
    return patching_rope.rotary_reference(q, cos, sin), patching_rope.rotary_reference(k, cos, sin)


@pytest.mark.parametrize("impostor", [_not_rope, _interleaved_rope, lambda q, k, cos, sin: (q, k)])
def test_only_what_computes_rope_is_replaced(impostor, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "rope", impostor)
    assert patching_rope.rope_forward(_Attention()) is None
    monkeypatch.setattr(sys.modules[__name__], "rope", _true_rope)
    found = patching_rope.rope_forward(_Attention())
    assert found is not None and found[1] == ["rope"]


# ------------------------------------------------------------------------------- dtypes as the model passes them


def _olmo2(dtype: torch.dtype) -> torch.nn.Module:
    config = transformers.Olmo2Config(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    return transformers.Olmo2ForCausalLM(config).to(dtype)


def test_mixed_dtype_rope_keeps_the_models_cast_back() -> None:
    # OLMo-2's rotary embedding hands fp32 cos and sin to bf16 q and k, and its apply_rotary_pos_emb casts the
    # result back to q's dtype: the swapped function must return what the model's own returns (bf16), or the
    # attention after it meets fp32 queries and bf16 values.
    attention = _olmo2(torch.bfloat16).model.layers[0].self_attn
    reference = copy.deepcopy(attention)
    found = patching_rope.rope_forward(attention)
    assert found is not None and found[1] == ["apply_rotary_pos_emb"]
    attention.forward = types.MethodType(found[0], attention)
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 5, 64, generator=generator).bfloat16()
    cos, sin = torch.randn(2, 5, 16, generator=generator), torch.randn(2, 5, 16, generator=generator)
    with torch.no_grad():
        expected, _ = reference(hidden, (cos, sin), None)
        got, _ = attention(hidden, (cos, sin), None)
    assert got.dtype == expected.dtype == torch.bfloat16
    assert torch.equal(got, expected)


def test_olmo2_in_bf16_patches_and_runs_as_unpatched() -> None:
    model = _olmo2(torch.bfloat16).eval()
    reference = copy.deepcopy(model)
    ids = torch.randint(3, VOCAB, (2, 9))
    report = patch(model)
    with torch.no_grad():
        got, expected = model(ids).logits, reference(ids).logits
    assert got.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected.float(), atol=5e-2, rtol=5e-2)
    assert any("RoPE" in why and "float32" in why for _, why in report.skipped), str(report)
