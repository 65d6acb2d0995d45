"""Model packs (tunekit.evaluation.model_packs): each pack model builds at its release's widths, and recording a
patched model's steps gives the plan a pack is tuned from, at exactly the steps' token counts."""

from __future__ import annotations

import pytest
import torch

from tunekit.core.errors import TunekitError
from tunekit.evaluation.model_packs import PACK_MODELS, build_pack_model, pack_model, record_pack_plan
from tunekit.fleet.plans import read_plan


@pytest.mark.parametrize("name", list(PACK_MODELS))
def test_a_pack_model_builds_at_its_release_widths(name):
    widths = PACK_MODELS[name].widths
    model = build_pack_model(name, "meta")  # shapes only
    config = model.config
    assert config.num_hidden_layers == 1
    for field in ("hidden_size", "intermediate_size", "vocab_size", "num_attention_heads", "num_key_value_heads"):
        assert getattr(config, field) == widths[field]
    linears = {n.rsplit(".", 1)[-1]: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    down = linears.get("down_proj")
    assert down is not None and (down.in_features, down.out_features) == (
        widths["intermediate_size"],
        widths["hidden_size"],
    )
    assert linears["lm_head"].out_features == widths["vocab_size"]
    assert next(model.parameters()).dtype == torch.bfloat16


def test_an_unknown_pack_is_refused_with_the_names():
    with pytest.raises(TunekitError, match="llama-3-8b"):
        pack_model("llama-9")


def test_recording_a_model_gives_its_problems_at_each_step_s_token_count(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        vocab_size=128,
    )  # fmt: skip
    model = LlamaForCausalLM(config)
    steps = {"prefill": (1, 12), "decode": (3, 1), "train": (1, 10)}
    n = record_pack_plan(model, 128, tmp_path / "plan.jsonl", steps)
    plan = read_plan(tmp_path / "plan.jsonl")
    assert n == len(plan) > 0
    gemm_m = {p["m"] for k, p in plan if k == "gemm" and p["a_layout"] == "row"}
    assert {12, 3, 10} <= gemm_m  # exact token counts: no bucket edges in a pack's plan
    kernels = {k for k, _ in plan}
    assert {"rmsnorm", "rmsnorm_backward"} <= kernels, kernels
    assert all(p.grad is None for p in model.parameters())  # the model itself is not run: a patched copy is
