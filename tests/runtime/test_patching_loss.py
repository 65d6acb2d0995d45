"""tunekit.patch and a language model's loss: transformers' next-token loss runs tunekit's fused cross-entropy, per
instance, recognized by what it computes (in the interpreter)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import count_calls, tiny_llama

from tunekit.integrations import patching_loss
from tunekit.integrations.patching import patch, unpatch

pytest.importorskip("transformers")  # tiny_llama builds on it

VOCAB = 128


def _llama() -> torch.nn.Module:
    return tiny_llama(layers=1, vocab=VOCAB)


@pytest.fixture
def loss_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    return count_calls(monkeypatch, patching_loss.ops, "cross_entropy")


def test_the_loss_runs_fused_trains_alike_and_unpatch_restores(loss_calls: list[int]) -> None:
    torch.manual_seed(0)
    model = _llama()
    reference = copy.deepcopy(model)
    original = model.loss_function
    ids = torch.randint(0, VOCAB, (2, 9))
    ids[0, 3] = -100  # an ignored target
    report = patch(model)
    assert ("", "next-token loss (by probe)") in report.swapped
    assert patch(model).swapped == []
    got, want = model(ids.clamp(min=0), labels=ids).loss, reference(ids.clamp(min=0), labels=ids).loss
    # The first call of a signature also runs the op on its first positions, checking it against the original.
    assert got.dtype == want.dtype == torch.float32 and len(loss_calls) == 2
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    got.backward(), want.backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4, msg=name)

    logits = torch.randn(2, 9, VOCAB)
    items = torch.tensor(7)
    torch.testing.assert_close(
        model.loss_function(logits, ids, vocab_size=VOCAB, num_items_in_batch=items),
        original(logits, ids, vocab_size=VOCAB, num_items_in_batch=items),
    )
    assert len(loss_calls) == 4  # another signature (num_items_in_batch): checked, then run
    model.loss_function(logits, ids, vocab_size=VOCAB, num_items_in_batch=7)
    assert len(loss_calls) == 6  # another kind of num_items_in_batch: checked once, whatever its value
    model.loss_function(logits, ids, vocab_size=VOCAB, num_items_in_batch=9)
    assert len(loss_calls) == 7
    unpatch(model)
    assert model.loss_function is original and "_loss_function" not in model.__dict__


def test_a_loss_that_is_not_the_next_token_cross_entropy_is_kept() -> None:
    model = _llama()

    def smoothed(logits, labels, vocab_size, **kwargs):
        shifted = F.pad(labels, (0, 1), value=-100)[..., 1:]
        return F.cross_entropy(logits.float().flatten(0, -2), shifted.flatten(), label_smoothing=0.1)

    model.loss_function = smoothed
    assert all(kind != "next-token loss (by probe)" for _, kind in patch(model).swapped)
    assert model.loss_function is smoothed
    unpatch(model)
    assert model.loss_function is smoothed  # the user's own, kept through unpatch


def test_other_arguments_run_the_original(loss_calls: list[int]) -> None:
    model = _llama()
    patch(model)
    logits, labels = torch.randn(1, 5, VOCAB), torch.randint(0, VOCAB, (1, 5))
    shift = torch.randint(0, VOCAB, (1, 5))
    expected = F.cross_entropy(logits.flatten(0, 1), shift.flatten())
    torch.testing.assert_close(model.loss_function(logits, labels, vocab_size=VOCAB, shift_labels=shift), expected)
    assert loss_calls == []
