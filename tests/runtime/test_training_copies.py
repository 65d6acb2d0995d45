"""A patched training step makes no copy that eager torch does not make: every copy, clone or layout change of a
2-D-or-larger tensor under the patched model's forward and backward is one the unpatched model makes too.

The interpreter moves each kernel argument to host buffers and back: those copies are inside a launch and are
not counted (on a GPU they do not exist). Weights of linear layers are [out, in] (read by the GEMM as weight.T,
column-major): a gradient produced row-major for weight.T costs a strided copy of every weight gradient when autograd
accumulates it, which is what this test caught."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from triton.runtime import interpreter

from tunekit.integrations.patching import patch

transformers = pytest.importorskip("transformers")

_COPIES = {"aten.copy_", "aten.clone", "aten._to_copy", "aten.contiguous", "aten.as_strided_copy"}
_DECODER = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=160,
    max_position_embeddings=64,
)
FAMILIES = {
    "qwen2 (q/k/v bias, GQA)": ("Qwen2Config", "Qwen2ForCausalLM", _DECODER),
    "qwen2 tied embeddings": ("Qwen2Config", "Qwen2ForCausalLM", {**_DECODER, "tie_word_embeddings": True}),
    "mistral (gated MLP)": ("MistralConfig", "MistralForCausalLM", _DECODER),
    "gpt_neox (plain MLP, biases)": (
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, vocab_size=160),
    ),
}


class _CopyCounter(TorchDispatchMode):
    """Counts the copies of tensors of two or more dims by (op, shape, source strides), outside kernel launches."""

    def __init__(self) -> None:
        super().__init__()
        self.copies: Counter[tuple[str, tuple[int, ...], tuple[int, ...]]] = Counter()
        self.in_launch = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = str(func.overloadpacket)
        if name in _COPIES and not self.in_launch:
            src = args[1] if name == "aten.copy_" else args[0]
            if isinstance(src, torch.Tensor) and src.dim() >= 2:
                self.copies[(name, tuple(src.shape), tuple(src.stride()))] += 1
        return func(*args, **(kwargs or {}))


def _step_copies(model: torch.nn.Module, ids: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> Counter:
    model.train()
    counter = _CopyCounter()
    launch = interpreter.GridExecutor.__call__

    def counted_launch(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        counter.in_launch += 1
        try:
            return launch(self, *args, **kwargs)
        finally:
            counter.in_launch -= 1

    monkeypatch.setattr(interpreter.GridExecutor, "__call__", counted_launch)
    with counter:
        model(ids, labels=ids, use_cache=False).loss.backward()
    monkeypatch.setattr(interpreter.GridExecutor, "__call__", launch)
    return counter.copies


@pytest.mark.parametrize("family", list(FAMILIES))
def test_patched_training_step_copies_nothing_eager_does_not(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    config_name, model_name, kwargs = FAMILIES[family]
    torch.manual_seed(0)
    eager = getattr(transformers, model_name)(getattr(transformers, config_name)(**kwargs)).float()
    patched = copy.deepcopy(eager)
    patch(patched)
    ids = torch.randint(0, kwargs["vocab_size"], (2, 12))
    eager_copies = _step_copies(eager, ids, monkeypatch)
    patched_copies = _step_copies(patched, ids, monkeypatch)
    extra = patched_copies - eager_copies
    assert not extra, f"copies the patched step makes and eager does not: {dict(extra)}"
    # The step ran tunekit's GEMMs with gradients: their weight gradients exist and match eager's layout.
    for (name, p), (_, q) in zip(eager.named_parameters(), patched.named_parameters()):
        assert q.grad is not None and q.grad.stride() == p.grad.stride(), name
        torch.testing.assert_close(q.grad, p.grad, rtol=2e-3, atol=2e-3, msg=name)


def test_a_linear_layers_three_gemms_are_three_problems_in_their_own_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a training step's linear layer runs, as dispatch keys it: the forward (row A, column-major weight.T),
    dX = dY W (row, row) and dW = (dY^T X)^T (column-major dY^T, row X): layouts that cost differently are different
    problems, each tuned and served on its own; a misaligned operand is another problem again (aligned16)."""
    from tunekit.runtime.dispatch import dispatcher

    gemm = dispatcher("gemm")
    seen: list[tuple] = []
    resolve = type(gemm).config

    def noting(self, key):  # type: ignore[no-untyped-def]
        seen.append(key)
        return resolve(self, key)

    monkeypatch.setattr(type(gemm), "config", noting)
    x = torch.randn(24, 32, requires_grad=True)
    layer = torch.nn.Linear(32, 48, bias=False)
    from tunekit.ops import linear

    linear(x, layer.weight).sum().backward()
    fields = {key[:6] for key in seen}  # (m, n, k, dtype, a_layout, b_layout)
    assert {(24, 48, 32, "float32", "row", "col"), (24, 32, 48, "float32", "row", "row")} <= fields
    assert (48, 32, 24, "float32", "col", "row") in fields
    assert layer.weight.grad.stride() == layer.weight.stride()  # dW arrives in the weight's own layout
