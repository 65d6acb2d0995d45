"""Under torch.compile a served kernel is a Triton-kernel node of the compiled graph (torch.library.triton_op and
its traced launch), not a custom op that dispatches in Python on every call; and what the graph runs is chosen per
problem: the kernel where its entry beats Inductor's measured time for the problem, torch's code elsewhere.

The graphs are the graphs AOT autograd hands the backend (after the ops are decomposed), run with aot_eager
semantics in the interpreter, where a probe launch stands for the compiled IR torch reads to find which arguments
a kernel writes (tunekit/launch/traced.py)."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers import compiled_targets, keep_targets, mlp_parameters
from torch._dynamo.backends.common import aot_autograd

import tunekit.ops as tk
from tunekit.core.device import fingerprint
from tunekit.core.registry import get_spec
from tunekit.runtime import compile_policy, dispatch
from tunekit.store.entry import UNDER_COMPILE, Entry
from tunekit.store.key import CacheKey
from tunekit.store.store import Store

# torch warns per traced kernel that the interpreter gives it no compiled IR (the probe answers instead)
logging.getLogger("torch._higher_order_ops.triton_kernel_wrap").setLevel(logging.ERROR)

KERNEL_NODE = "triton_kernel_wrapper"


class Block(torch.nn.Module):
    def __init__(self, d: int = 32, hidden: int = 48) -> None:
        super().__init__()
        g, self.w1, self.b1, self.w2 = mlp_parameters(d, hidden)
        self.norm_w = torch.nn.Parameter(1 + 0.1 * torch.randn(d, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = tk.rms_norm(x, (x.shape[-1],), self.norm_w, 1e-6)
        h = tk.linear(h, self.w1, self.b1, activation="gelu_tanh")
        h = tk.linear(h, self.w2, residual=x)
        return tk.sum(tk.softmax(h, dim=-1) * h, dim=-1)


@pytest.mark.usefixtures("swapped_under_compile")
def test_served_kernels_are_graph_nodes_with_no_op_dispatch() -> None:
    block = Block()
    x = torch.randn(2, 5, 32)
    targets, out = compiled_targets(block, x)
    kernels = [t for t in targets if KERNEL_NODE in t]
    # rms_norm, two GEMMs (the second with its residual), softmax, sum: one launch each at least
    assert len(kernels) >= 5, targets
    assert not [t for t in targets if "tunekit" in t], targets  # no custom op left for Python to dispatch
    with torch.no_grad():
        want = block(x)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def _plant_rms_norm(x: torch.Tensor, weight: torch.Tensor, provenance: dict[str, object]) -> None:
    """An entry of its own for the RMSNorm problem of x (the config the interpreter serves it now)."""
    with torch.no_grad():
        tk.rms_norm(x, (x.shape[-1],), weight, 1e-6)
    spec, device = get_spec("rmsnorm"), fingerprint()
    ((key, config),) = dispatch.served_configs()["rmsnorm"].items()
    problem = spec.problem_dict(key)
    with Store() as store:
        store.put(Entry(CacheKey.make(spec.name, spec.source_hash, device.key, problem), dict(config), 1.0,
                        device.to_json(), provenance))  # fmt: skip
    dispatch.reset_all()


@pytest.mark.parametrize(
    ("provenance", "kernel_in_graph"),
    [
        # compiled, twice as fast as Inductor's code for the problem: the kernel
        ({UNDER_COMPILE: {"kernel_ms": 1.0, "inductor_ms": 2.0}}, True),
        # within the margin: Inductor's code, which it can fuse with its neighbours
        ({UNDER_COMPILE: {"kernel_ms": 1.0, "inductor_ms": 1.01}}, False),
        # faster eagerly (the entry's 1.0 ms) but slower as Inductor builds it
        ({UNDER_COMPILE: {"kernel_ms": 2.5, "inductor_ms": 2.0}}, False),
        ({}, False),  # never timed under compile: torch's code
    ],
)
def test_the_stored_under_compile_choice_is_served(
    monkeypatch: pytest.MonkeyPatch, provenance: dict[str, object], kernel_in_graph: bool
) -> None:
    monkeypatch.setattr(compile_policy, "FORCED", None)  # measured, as without TUNEKIT_COMPILE_OPS
    dispatch.reset_all()
    x, weight = torch.randn(6, 32), 1 + 0.1 * torch.randn(32)
    _plant_rms_norm(x, weight, provenance)

    def norm(x: torch.Tensor) -> torch.Tensor:
        return tk.rms_norm(x, (32,), weight, 1e-6) * 2

    targets, out = compiled_targets(norm, x)
    assert any(KERNEL_NODE in t for t in targets) is kernel_in_graph, targets
    assert not [t for t in targets if "tunekit" in t], targets
    torch.testing.assert_close(out, torch.nn.functional.rms_norm(x, (32,), weight, 1e-6) * 2, rtol=1e-5, atol=1e-5)


def test_an_op_with_no_chosen_kernel_traces_as_torchs_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compile_policy, "FORCED", None)
    dispatch.reset_all()
    block = Block()
    targets, _ = compiled_targets(block, torch.randn(2, 5, 32))
    assert not [t for t in targets if KERNEL_NODE in t or "tunekit" in t], targets


def test_the_compiled_kernel_probe_runs_the_kernel_as_a_graph_node() -> None:
    """What tuning/inductor_candidate.py times as "the kernel under compile": a graph holding only the kernel."""
    from tunekit.tuning import inductor_candidate

    spec, device = get_spec("rmsnorm"), fingerprint()
    problem = spec.problem_from_shape((24, 40), "float32")
    inputs = spec.make_inputs(problem, torch.device("cpu"), 0)
    inductor_candidate._PROBES["test"] = (spec, spec.heuristic(problem, device), inputs)
    tensors = [v for v in inputs if isinstance(v, torch.Tensor)]
    try:
        targets, out = compiled_targets(lambda ts: torch.ops.tunekit.compiled_launch(ts, "test"), tensors)
    finally:
        del inductor_candidate._PROBES["test"]
    assert [t for t in targets if KERNEL_NODE in t] and not [t for t in targets if "tunekit" in t], targets
    (want,) = spec.reference(inputs)
    torch.testing.assert_close(out[0], want.to(out[0].dtype), rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("swapped_under_compile")
def test_dynamic_shapes_trace_torchs_code() -> None:
    """With symbolic sizes there is no one problem to choose a config for: torch's code, which Inductor sizes."""
    block = Block()
    x = torch.randn(3, 7, 32)
    targets, out = compiled_targets(block, x, dynamic=True)
    with torch.no_grad():
        want = block(x)
    assert targets and not [t for t in targets if KERNEL_NODE in t or "tunekit" in t], targets
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.usefixtures("swapped_under_compile")
def test_training_graphs_hold_the_backward_kernels() -> None:
    block = Block()
    graphs: dict[str, list[str]] = {"forward": [], "backward": []}
    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=keep_targets(graphs["forward"]), bw_compiler=keep_targets(graphs["backward"]))
    x = torch.randn(2, 5, 32, requires_grad=True)
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    compiled(x).sum().backward()
    got = [p.grad.clone() for p in (x, *block.parameters())]
    for p in (x, *block.parameters()):
        p.grad = None
    block(x).sum().backward()
    torch._dynamo.reset()
    for which, targets in graphs.items():
        assert any(KERNEL_NODE in t for t in targets), (which, targets)
        assert not [t for t in targets if "tunekit" in t], (which, targets)
    for g, p in zip(got, (x, *block.parameters())):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-4)
