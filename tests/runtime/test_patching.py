"""tunekit.nn modules and tunekit.patch on real model code (transformers' Llama and GPT-2, tiny, random weights),
in the interpreter: patched logits and gradients match the unpatched model, unpatch restores it exactly."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list

from tunekit import nn as tk_nn
from tunekit.integrations.patching import patch, unpatch

transformers = pytest.importorskip("transformers")  # in the dev extra: CI installs it, so this never skips there


# One tiny shape for both families: 64 wide, 2 layers of 4 heads, a vocabulary of 128 tokens (the ids the test draws).
WIDTH, LAYERS, HEADS, VOCAB = 64, 2, 4, 128


def _llama():
    config = transformers.LlamaConfig(
        hidden_size=WIDTH,
        intermediate_size=96,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=2,
        vocab_size=VOCAB,
    )
    return transformers.LlamaForCausalLM(config)


def _gpt2():
    config = transformers.GPT2Config(
        n_embd=WIDTH,
        n_layer=LAYERS,
        n_head=HEADS,
        vocab_size=VOCAB,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,  # dropout would make the two runs differ
    )
    return transformers.GPT2LMHeadModel(config)


MODELS = {"llama": _llama, "gpt2": _gpt2}
EXPECTED = {  # what patch swaps and fuses in each, found by structure and probes, not by class name
    "llama": (
        {"Linear": 15, "RMSNorm (by structure)": 5, "RoPE (by probe)": 2, "next-token loss (by probe)": 1},
        {"silu"},
    ),
    "gpt2": (
        {"LayerNorm": 5, "Linear": 1, "Linear [in, out] (by structure)": 8, "next-token loss (by probe)": 1},
        {"gelu_tanh"},
    ),
}


def _kinds(report):
    counts: dict[str, int] = {}
    for _, kind in report.swapped:
        counts[kind] = counts.get(kind, 0) + 1
    return counts


@pytest.mark.parametrize("name", sorted(MODELS))
def test_patched_model_matches_and_unpatch_restores(name):
    torch.manual_seed(0)
    model = MODELS[name]().eval()
    reference = copy.deepcopy(model)
    ids = torch.randint(0, VOCAB, (2, 9))
    with torch.no_grad():
        expected = reference(ids).logits
    report = patch(model)
    kinds, activations = EXPECTED[name]
    assert _kinds(report) == kinds and {a for _, a in report.fused} == activations
    assert patch(model).swapped == [] and patch(model).fused == []  # twice changes nothing
    with torch.no_grad():
        got = model(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)

    # Training: gradients of every parameter match the unpatched model's.
    model.train(), reference.train()
    for m in (model, reference):
        m.zero_grad()
        m(ids, labels=ids).loss.backward()
    grads = dict(reference.named_parameters())
    for pname, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[pname].grad, atol=1e-4, rtol=1e-3, msg=pname)

    restored = unpatch(model)
    assert restored == len(report.swapped)
    assert not any("forward" in m.__dict__ or hasattr(m, "_tunekit_patch") for m in model.modules())
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, expected)
    assert str(model) == str(reference)  # the fused activations are back in place


def test_no_class_is_mutated():
    before = {cls: cls.forward for cls in (torch.nn.Linear, torch.nn.LayerNorm, torch.nn.RMSNorm)}
    model = _llama()
    patch(model)
    assert {cls: cls.forward for cls in before} == before
    fresh = torch.nn.Linear(4, 4)
    assert "forward" not in fresh.__dict__


def test_a_swap_derives_the_modules_class_and_unpatch_restores_it():
    model = _llama()
    before = {path: type(m) for path, m in model.named_modules()}
    report = patch(model)
    modules = dict(model.named_modules())
    swapped = {path for path, kind in report.swapped if kind != "next-token loss (by probe)"}
    # projections and lm_head, norms and the final norm, each layer's attention (RoPE)
    assert len(swapped) == 7 * LAYERS + 1 + 2 * LAYERS + 1 + LAYERS
    for path in swapped:
        module, cls = modules[path], before[path]
        assert type(module) is not cls and isinstance(module, cls) and type(module).__name__ == cls.__name__
        assert "forward" not in module.__dict__  # on the class: torch.compile guards no instance forward
    assert len({type(modules[p]) for p in swapped if before[p] is torch.nn.Linear}) == 1  # one class per kind
    # A deep copy keeps each RoPE swap's function and guard together (the function's closure holds the guard).
    copied = dict(copy.deepcopy(model).named_modules())
    attention = [path for path, kind in report.swapped if kind == "RoPE (by probe)"]
    assert all(copied[p]._tunekit_rope.guard is modules[p]._tunekit_rope.guard for p in attention)
    unpatch(model)
    assert {path: type(m) for path, m in model.named_modules()} == before


def test_a_patched_model_pickles_and_loads_patched():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(48, 48), torch.nn.LayerNorm(48), _PlainRMSNorm(48), torch.nn.Linear(48, 8)
    )  # fmt: skip
    patch(model)
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    x = torch.randn(5, 48)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))
    assert [type(m) for m in loaded] == [type(m) for m in model]  # still swapped, as the same classes
    assert unpatch(loaded) == 4
    assert [type(m) for m in loaded] == [torch.nn.Linear, torch.nn.LayerNorm, _PlainRMSNorm, torch.nn.Linear]


def _guard_lines(model: torch.nn.Module, ids: torch.Tensor) -> int:
    """Lines of Dynamo's guards on the compiled forward of `model` (backend "eager": the guards are the same)."""
    compiled = torch.compile(model, backend="eager")
    with torch.no_grad():
        compiled(ids, use_cache=False)
    forward = model.forward.__func__
    frame = {"self": model, "args": (ids,), "kwargs": {"use_cache": False}, "func": forward.__wrapped__}
    with torch.no_grad():
        entries = [e for e in _debug_get_cache_entry_list(forward.__code__) if e.guard_manager.check(frame)]
    assert len(entries) == 1
    return len(str(entries[0].guard_manager).splitlines())


def test_a_patched_model_compiles_with_about_the_guards_of_the_model_alone():
    # Dynamo checks every guard on every compiled call: with an instance forward per swapped module, a patched
    # 32-layer Llama checked 1.9x the guards of the model alone (257 vs 133 us per call on a 2-core CPU).
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (2, 1))
    lines = {}
    for layers in (1, 3):
        for patched in (False, True):
            config = transformers.LlamaConfig(
                hidden_size=WIDTH, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=HEADS,
                num_key_value_heads=2, vocab_size=VOCAB,
            )  # fmt: skip
            model = transformers.LlamaForCausalLM(config).eval()
            if patched:
                patch(model)
            lines[layers, patched] = _guard_lines(model, ids)
    per_layer = {patched: (lines[3, patched] - lines[1, patched]) / 2 for patched in (False, True)}
    assert per_layer[True] <= 1.1 * per_layer[False], (lines, per_layer)
    assert lines[1, True] <= 1.3 * lines[1, False], lines


class _OffsetRMSNorm(torch.nn.Module):
    """Gemma's form, (1 + weight): looks like an RMSNorm, computes something else."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(n) * 0.1)
        self.eps = 1e-6

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + self.weight)


class _PlainRMSNorm(_OffsetRMSNorm):
    def __init__(self, n: int) -> None:
        super().__init__(n)
        del self.eps
        self.variance_epsilon = 1e-5

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


class _SquaredWeightRMSNorm(_OffsetRMSNorm):
    """Looks like an RMSNorm, computes no form tunekit runs."""

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.square()


class _FinalRMSNorm(_PlainRMSNorm):
    """A class that refuses subclasses: tunekit cannot derive the class its swap needs."""

    def __init_subclass__(cls, **kwargs: object) -> None:
        raise TypeError("final")


def test_a_module_whose_class_refuses_subclasses_is_skipped_and_runs_as_before():
    model = torch.nn.Sequential(_FinalRMSNorm(48), _PlainRMSNorm(48))
    x = torch.randn(5, 48)
    expected = model(x)
    report = patch(model)
    assert report.swapped == [("1", "RMSNorm (by structure)")]
    assert report.skipped == [("0", "its class cannot be derived (TypeError: final)")]
    assert type(model[0]) is _FinalRMSNorm and "_tunekit_patch" not in model[0].__dict__
    torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)


def test_rmsnorm_is_recognized_by_what_it_computes():
    # Gemma's (1 + weight) form is recognized as such (it was skipped before tunekit ran it); a form tunekit does
    # not run is still skipped.
    model = torch.nn.Sequential(_OffsetRMSNorm(48), _PlainRMSNorm(48), _SquaredWeightRMSNorm(48))
    x = torch.randn(5, 48)
    expected = model(x)
    report = patch(model)
    assert report.swapped == [("0", "RMSNorm (1 + weight) (by structure)"), ("1", "RMSNorm (by structure)")]
    assert [path for path, _ in report.skipped] == ["2"]
    torch.testing.assert_close(model(x), expected, atol=1e-5, rtol=1e-5)


def test_nn_modules_load_torch_weights_and_match_torch():
    torch.manual_seed(1)
    pairs = [
        (torch.nn.LayerNorm(40), tk_nn.LayerNorm(40)),
        (torch.nn.RMSNorm(40, eps=1e-6), tk_nn.RMSNorm(40, eps=1e-6)),
        (torch.nn.Linear(40, 24), tk_nn.Linear(40, 24)),
    ]
    x = torch.randn(3, 5, 40)
    for theirs, ours in pairs:
        with torch.no_grad():
            for p in theirs.parameters():
                p.copy_(torch.randn_like(p))
        assert ours.load_state_dict(theirs.state_dict()) is not None
        assert list(ours.state_dict()) == list(theirs.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(ours(x), theirs(x), atol=1e-4, rtol=1e-4)
        # A dtype the kernels do not take runs torch's own forward.
        torch.testing.assert_close(ours.double()(x.double()), theirs.double()(x.double()))


def test_linear_fuses_activation_and_residual():
    torch.manual_seed(2)
    layer = tk_nn.Linear(32, 16, activation="silu")
    x, r = torch.randn(4, 32), torch.randn(4, 16)
    with torch.no_grad():
        expected = torch.nn.functional.silu(torch.nn.functional.linear(x, layer.weight, layer.bias)) + r
        torch.testing.assert_close(layer(x, r), expected, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="activation must be None or one of"):
        tk_nn.Linear(4, 4, activation="swish")


def test_an_activation_is_fused_only_into_the_projection_whose_output_it_takes():
    """Mamba's mixer applies its SiLU to a convolution's output and to a gate, never to `dt_proj` or `x_proj`; in
    bfloat16 fusing it into them changed the probe's output by less than the tolerance (so the output check alone
    fused it) and a gradient by 24%. A gated MLP's SiLU takes gate_proj's output itself: that one is fused."""
    from tunekit.evaluation.patch_conformance import build, causal_lm_families

    classes = dict(causal_lm_families())
    mamba = build("falcon_mamba", classes["falcon_mamba"], torch.bfloat16, "cpu")
    assert patch(mamba).fused == []
    llama = build("llama", classes["llama"], torch.bfloat16, "cpu")
    assert [path for path, _ in patch(llama).fused] == [f"model.layers.{i}.mlp.gate_proj" for i in range(2)]
