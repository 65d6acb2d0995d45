"""Under torch.compile, a patched model's graph calls tunekit's ops only where the compile policy swaps them: with
the default (measured) policy and nothing measured, a patched model traces fullgraph to torch's own ops (what
Inductor fuses); with every op forced the same model traces fullgraph to tunekit's ops. TUNEKIT_COMPILE_OPS is
validated."""

from __future__ import annotations

import copy

import pytest
import torch

import tunekit.ops as ops
from tunekit.core.errors import TunekitError
from tunekit.integrations.patching import patch
from tunekit.runtime import compile_policy

transformers = pytest.importorskip("transformers")


def _patched_qwen2() -> tuple[torch.nn.Module, torch.nn.Module]:
    config = transformers.Qwen2Config(
        hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, vocab_size=96, max_position_embeddings=32,
    )  # fmt: skip
    torch.manual_seed(0)
    eager = transformers.Qwen2ForCausalLM(config).float()
    patched = copy.deepcopy(eager)
    patch(patched)
    return eager, patched


def _trace(model: torch.nn.Module, ids: torch.Tensor) -> tuple[list[str], torch.Tensor]:
    """The call_function targets of the fullgraph-compiled training forward, and its loss (backward run too)."""
    targets: list[str] = []

    def backend(gm: torch.fx.GraphModule, _: object):  # type: ignore[no-untyped-def]
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    loss = torch.compile(model, fullgraph=True, backend=backend)(ids, labels=ids, use_cache=False).loss
    loss.backward()
    torch._dynamo.reset()
    return targets, loss


def test_default_policy_traces_torch_ops_only() -> None:
    eager, patched = _patched_qwen2()
    ids = torch.randint(0, 96, (2, 8))
    targets, loss = _trace(patched, ids)
    swapped = [t for t in targets if "tunekit" in t]
    assert targets and not swapped, swapped  # no entry chosen under compile: the graph compile alone builds
    want = eager(ids, labels=ids, use_cache=False).loss
    want.backward()
    torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-4)
    for (name, p), (_, q) in zip(eager.named_parameters(), patched.named_parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-3, atol=1e-4, msg=name)


@pytest.mark.usefixtures("swapped_under_compile")
def test_every_op_swapped_traces_fullgraph_to_tunekit_ops() -> None:
    _, patched = _patched_qwen2()
    ids = torch.randint(0, 96, (2, 8))
    targets, _ = _trace(patched, ids)
    assert any("tunekit.linear" in t or "tunekit.matmul" in t for t in targets), targets
    assert any("tunekit.rms_norm" in t for t in targets), targets


@pytest.mark.parametrize(
    ("raw", "want"), [("all", {compile_policy.ALL}), ("none", set()), (" linear, rms_norm ", {"linear", "rms_norm"})]
)
def test_the_environment_sets_the_policy(monkeypatch: pytest.MonkeyPatch, raw: str, want: set[str]) -> None:
    monkeypatch.setenv("TUNEKIT_COMPILE_OPS", raw)
    assert compile_policy._from_settings() == want


def test_unset_the_policy_is_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TUNEKIT_COMPILE_OPS", raising=False)
    assert compile_policy._from_settings() is None


def test_an_unknown_op_in_the_environment_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checked against the ops' own list (tunekit.ops does this when imported)."""
    monkeypatch.setenv("TUNEKIT_COMPILE_OPS", "linear,flash_attention")
    monkeypatch.setattr(compile_policy, "FORCED", compile_policy._from_settings())
    with pytest.raises(TunekitError, match=r"TUNEKIT_COMPILE_OPS must name ops of .* but got \['flash_attention'\]"):
        compile_policy.check_forced_names(ops.__all__)
    compile_policy.check_forced_names(["linear", "flash_attention"])  # a list that has it: accepted


@pytest.mark.usefixtures("swapped_under_compile")
def test_a_patched_model_compiles_to_kernel_nodes_with_no_op_dispatch() -> None:
    """The forward graph AOT autograd hands the backend: tunekit's launches as Triton-kernel nodes, no tunekit op
    left for Python to dispatch per call, logits as eager's."""
    from helpers import compiled_targets

    eager, patched = _patched_qwen2()
    ids = torch.randint(0, 96, (2, 8))
    targets, logits = compiled_targets(lambda i: patched(i, use_cache=False).logits, ids)
    with torch.no_grad():
        want = eager(ids, use_cache=False).logits
    assert sum("triton_kernel_wrapper" in t for t in targets) >= 4, targets  # norms, projections, RoPE
    assert not [t for t in targets if "tunekit" in t], targets
    torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4)
