"""tunekit.patch on model families it was not written against (transformers' tiny random configs, nothing
downloaded), and on the module shapes model code has: logits (and, for some, gradients) match the unpatched model,
unpatch restores it exactly, patching twice changes nothing, and what is swapped is what the structure says."""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass

import pytest
import torch

from tunekit.integrations.patching import patch, unpatch

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
    rope: bool = True  # attention calls transformers' rotate_half RoPE function (one swap per attention module)
    loss: bool = True  # a causal LM whose forward calls its next-token loss_function


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
        "CohereConfig",
        "CohereForCausalLM",
        {**_DECODER, "pad_token_id": 0},
        "LayerNorm (by structure)",
        (2, "silu"),
        rope=False,
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
        rope=False,
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
        rope=False,
    ),
    "gptj": Family(
        "GPTJConfig",
        "GPTJForCausalLM",
        dict(n_embd=WIDTH, n_layer=2, n_head=4, vocab_size=VOCAB, rotary_dim=8, n_positions=64),
        None,
        (2, "gelu_tanh"),
        rope=False,
    ),
    # BERT: one GELU per layer, and one in the masked-LM head (dense, GELU, LayerNorm).
    "bert": Family("BertConfig", "BertForMaskedLM", _ENCODER, None, (3, "gelu"), rope=False, loss=False),
    "roberta": Family(
        "RobertaConfig",
        "RobertaForMaskedLM",
        {**_ENCODER, "pad_token_id": 1},
        None,
        (2, "gelu"),
        rope=False,
        loss=False,
    ),
    # T5's norm is an RMSNorm without mean subtraction, its statistics in fp32.
    "t5": Family(
        "T5Config",
        "T5ForConditionalGeneration",
        dict(d_model=WIDTH, d_kv=16, d_ff=96, num_layers=1, num_heads=4, vocab_size=VOCAB),
        "RMSNorm (by structure)",
        (2, "relu"),
        rope=False,
        loss=False,
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
    if family.rope:
        kinds["RoPE (by probe)"] = _ENCODER["num_hidden_layers"]  # one attention module per layer
    if family.loss:
        kinds["next-token loss (by probe)"] = 1
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
    family = FAMILIES[name]
    kinds = _expected_kinds(model, family)  # by the classes the model was built with

    report = patch(model)
    assert Counter(kind for _, kind in report.swapped) == kinds
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


def test_patched_family_compiles_fullgraph():
    model = _build("qwen2").eval()
    ids = torch.randint(3, VOCAB, (1, 5))
    with torch.no_grad():
        expected = _logits(model, ids)
        patch(model)
        got = torch.compile(model, fullgraph=True, backend="eager")(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


# ---------------------------------------------------------------------------------------------- module shapes


def _patched_matches(model: torch.nn.Module, x: torch.Tensor, tol: float = 1e-4):
    """Patch `model`; assert its output is unchanged, and exactly restored by unpatch. Returns the report."""
    with torch.no_grad():
        expected = model(x)
        report = patch(model)
        torch.testing.assert_close(model(x), expected, atol=tol, rtol=tol)
        unpatch(model)
        assert torch.equal(model(x), expected)
    return report


class _MLP(torch.nn.Module):
    def __init__(self, act: torch.nn.Module, d: int = 24, hidden: int = 40, bias: bool = True) -> None:
        super().__init__()
        self.fc_in, self.act, self.fc_out = torch.nn.Linear(d, hidden, bias), act, torch.nn.Linear(hidden, d, bias)

    def forward(self, x):
        return self.fc_out(self.act(self.fc_in(x)))


class _NewGELU(torch.nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh((2.0 / torch.pi) ** 0.5 * (x + 0.044715 * x.pow(3))))


class _QuickGELU(torch.nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class _ClippedGELU(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.gelu(x).clamp(-10, 10)


@pytest.mark.parametrize(
    ("act", "fused"),
    [
        (torch.nn.GELU(), "gelu"),
        (torch.nn.GELU(approximate="tanh"), "gelu_tanh"),
        (_NewGELU(), "gelu_tanh"),
        (torch.nn.ReLU(), "relu"),
        (torch.nn.SiLU(), "silu"),
        (_QuickGELU(), None),  # no activation the epilogue runs
        (_ClippedGELU(), None),  # GELU up to 10: differs beyond
    ],
)
def test_activation_fuses_as_what_it_computes(act, fused):
    torch.manual_seed(3)
    report = _patched_matches(_MLP(act), torch.randn(2, 5, 24) * 4)
    assert report.fused == ([("fc_in", fused)] if fused else [])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_linear_without_bias_odd_sizes_3d_input(dtype):
    torch.manual_seed(4)
    model = _MLP(torch.nn.GELU(approximate="tanh"), d=37, hidden=50, bias=False).to(dtype)
    report = _patched_matches(model, torch.randn(2, 5, 37, dtype=dtype), 1e-4 if dtype == torch.float32 else 2e-2)
    assert [k for _, k in report.swapped] == ["Linear", "Linear"] and report.fused == [("fc_in", "gelu_tanh")]


class _LoRALinear(torch.nn.Linear):
    """A Linear subclass with its own forward (LoRA-style): its extra path is zero until trained."""

    def __init__(self, d: int, n: int) -> None:
        super().__init__(d, n)
        self.lora_a, self.lora_b = torch.nn.Parameter(torch.randn(4, d)), torch.nn.Parameter(torch.zeros(n, 4))

    def forward(self, x):
        return super().forward(x) + x @ self.lora_a.T @ self.lora_b.T


def test_linear_subclass_and_wrapped_forward_are_left_alone():
    torch.manual_seed(5)
    model = torch.nn.Sequential(_LoRALinear(16, 16), torch.nn.Linear(16, 16))
    wrapped = model[1].forward
    model[1].forward = lambda x: wrapped(x) * 2  # a wrapper set on the instance, as hooks libraries do
    x = torch.randn(3, 16)
    report = _patched_matches(model, x)
    assert report.swapped == [] and [p for p, _ in report.skipped] == ["0", "1"]
    assert "forward" in model[1].__dict__  # unpatch kept the wrapper
    patch(model)
    with torch.no_grad():
        model[0].lora_b.normal_()  # trained: the subclass's own forward still runs
        torch.testing.assert_close(model(x), model[1](model[0].forward(x)))


class _TwoMLPs(torch.nn.Module):
    """One activation module in two parents (reused across layers)."""

    def __init__(self) -> None:
        super().__init__()
        act = torch.nn.GELU()
        self.first, self.second = _MLP(act), _MLP(act)

    def forward(self, x):
        return self.second(self.first(x))


def test_shared_activation_fuses_in_each_parent_and_comes_back():
    torch.manual_seed(6)
    model = _TwoMLPs()
    act = model.first.act
    report = _patched_matches(model, torch.randn(4, 24))
    assert sorted(report.fused) == [("first.fc_in", "gelu"), ("second.fc_in", "gelu")]
    assert model.first.act is act and model.second.act is act


class _FunctionalMLP(_MLP):
    def forward(self, x):
        return self.fc_out(torch.nn.functional.gelu(self.fc_in(x)))


class _SharedProjection(torch.nn.Module):
    """fc_in is held by the MLP (GELU after it) and called bare by this parent as well."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = _MLP(torch.nn.GELU())
        self.fc_in = self.mlp.fc_in

    def forward(self, x):
        return self.mlp(x) + self.fc_in(x)[..., :24]


def test_nothing_fuses_where_it_would_be_wrong():
    torch.manual_seed(7)
    assert _patched_matches(_FunctionalMLP(torch.nn.Identity()), torch.randn(4, 24)).fused == []
    assert _patched_matches(_SharedProjection(), torch.randn(4, 24)).fused == []


class _GatedMLP(torch.nn.Module):
    """up is defined before gate, and down starts at zero (zero-init output projections): at init the parent's
    output is 0 whatever is fused where."""

    def __init__(self, d: int = 24, hidden: int = 40) -> None:
        super().__init__()
        self.up, self.gate = torch.nn.Linear(d, hidden, bias=False), torch.nn.Linear(d, hidden, bias=False)
        self.down, self.act = torch.nn.Linear(hidden, d, bias=False), torch.nn.SiLU()
        torch.nn.init.zeros_(self.down.weight)

    def forward(self, x):
        return self.down(self.act(self.gate(x)) * self.up(x))


class _ShiftedMLP(_MLP):
    """A zero-initialized shift between the projection and the activation."""

    def __init__(self) -> None:
        super().__init__(torch.nn.ReLU())
        self.shift = torch.nn.Parameter(torch.zeros(40))

    def forward(self, x):
        return self.fc_out(self.act(self.fc_in(x) + self.shift))


def test_parameters_at_init_do_not_hide_a_wrong_fusion():
    torch.manual_seed(8)
    gated, shifted = _GatedMLP(), _ShiftedMLP()
    x = torch.randn(4, 24)
    assert patch(gated).fused == [("gate", "silu")]
    assert patch(shifted).fused == []
    with torch.no_grad():  # trained: the parameters move away from their initial values
        gated.down.weight.normal_()
        shifted.shift.normal_()
        linear = torch.nn.functional.linear
        gate, up = linear(x, gated.gate.weight), linear(x, gated.up.weight)
        expected = linear(torch.nn.functional.silu(gate) * up, gated.down.weight)
        torch.testing.assert_close(gated(x), expected, atol=1e-4, rtol=1e-4)


class _DropoutMLP(_MLP):
    def __init__(self) -> None:
        super().__init__(torch.nn.GELU())
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.fc_out(self.drop(self.act(self.fc_in(x))))


def test_train_mode_model_fuses_and_matches():
    torch.manual_seed(9)
    model = _DropoutMLP().train()
    reference = copy.deepcopy(model)
    assert patch(model).fused == [("fc_in", "gelu")] and model.training and model.drop.training
    x = torch.randn(4, 24)
    torch.manual_seed(10)
    expected = reference(x)
    torch.manual_seed(10)
    torch.testing.assert_close(model(x), expected, atol=1e-4, rtol=1e-4)


class _Norm(torch.nn.Module):
    """A norm of model code: `mean` subtracts the mean (LayerNorm without bias); `true_eps` is what it uses."""

    def __init__(self, n: int, mean: bool, eps: float = 1e-6, true_eps: float | None = None) -> None:
        super().__init__()
        self.weight, self.variance_epsilon = torch.nn.Parameter(torch.ones(n)), eps
        self.mean, self.true_eps = mean, eps if true_eps is None else true_eps

    def forward(self, x):
        h = x.float() - x.float().mean(-1, keepdim=True) if self.mean else x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.true_eps)
        return self.weight * h.to(x.dtype)


@pytest.mark.parametrize(
    ("norm", "kind"),
    [
        (_Norm(4096, mean=True).bfloat16(), "LayerNorm (by structure)"),  # wide and bf16: the mean is tiny
        (_Norm(64, mean=False), "RMSNorm (by structure)"),
        (_Norm(64, mean=False, true_eps=1e-5), None),  # its eps attribute is not the eps it uses
    ],
)
def test_norms_are_recognized_by_what_they_compute(norm, kind):
    x = torch.randn(3, norm.weight.shape[0], dtype=norm.weight.dtype) + 0.5
    report = _patched_matches(torch.nn.Sequential(norm), x, 1e-4 if x.dtype == torch.float32 else 2e-2)
    assert [k for _, k in report.swapped] == ([kind] if kind else [])


def test_mixed_dtypes_and_autocast_keep_the_models_own_dtype_rules():
    norm, linear = _Norm(64, mean=False), torch.nn.Linear(64, 32)  # an fp32 norm weight (kept in fp32)
    x = torch.randn(3, 64).bfloat16()
    with torch.no_grad():
        expected_norm = norm(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected_linear = linear(x.float())
        patch(norm), patch(linear)
        got_norm = norm(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got_linear = linear(x.float())
    assert got_norm.dtype == expected_norm.dtype == torch.float32 and torch.equal(got_norm, expected_norm)
    assert got_linear.dtype == expected_linear.dtype == torch.bfloat16 and torch.equal(got_linear, expected_linear)


def test_tunekit_linear_keeps_its_activation_and_meta_models_patch():
    from tunekit import nn as tk_nn

    model = torch.nn.Sequential(tk_nn.Linear(16, 16, activation="silu"), _MLP(torch.nn.GELU(), d=16))
    report = _patched_matches(model, torch.randn(3, 16))
    assert [p for p, _ in report.swapped] == ["1.fc_in", "1.fc_out"]  # tunekit's own Linear is left as it is
    assert model[0].activation == "silu"  # unpatch did not take it
    with torch.device("meta"):  # not loaded yet: no probe runs, nothing is fused, nothing fails
        meta = torch.nn.Sequential(_MLP(torch.nn.GELU()), _Norm(24, mean=False))
    report = patch(meta)
    assert [k for _, k in report.swapped] == ["Linear", "Linear"] and report.fused == []


def test_runs_here_takes_only_calls_on_the_kernels_device_with_matching_parameters():
    from tunekit import nn as tk_nn

    x, w = torch.randn(3, 8), torch.randn(8)
    assert tk_nn.runs_here(x, w, None)
    assert not tk_nn.runs_here(x, w.double())  # a parameter of another dtype
    assert not tk_nn.runs_here(x, torch.empty(8, device="meta"))  # a parameter on another device
    assert not tk_nn.runs_here(torch.empty(3, 8, device="meta"), torch.empty(8, device="meta"))
    assert not tk_nn.runs_here(x.to(torch.int32))  # a dtype the kernels do not take
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not tk_nn.runs_here(x, w)


def test_linear_forward_reads_a_parametrized_weight_as_its_property():
    from torch.nn.utils import parametrize

    from tunekit import nn as tk_nn

    class Doubled(torch.nn.Module):
        def forward(self, weight: torch.Tensor) -> torch.Tensor:
            return weight * 2

    linear = torch.nn.Linear(16, 8)
    parametrize.register_parametrization(linear, "weight", Doubled())
    x = torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(tk_nn.linear_forward(linear, x), linear(x))
        torch.testing.assert_close(
            tk_nn.linear_forward(linear, x), x @ (2 * linear.parametrizations.weight.original).T + linear.bias
        )
