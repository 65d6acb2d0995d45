"""Training through the pointwise ops (gelu, bias_act, bias_act_residual): eager training runs the op's eager
autograd Function, whose backward launches the tuned `pointwise_backward` kernel (d input and d bias in one pass);
its gradients match torch's in float64 for every activation, dtype, bias and residual; the torch-served backward
(fp32 torch ops) agrees with the kernel, NaN included; on a GPU whose backward problem is untuned, torch's own
chain trains the call."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from kernel_checks import HERE, INTERPRETER_NOISE
from test_pointwise import TORCH_ACTIVATIONS, operands, randn

import tunekit
import tunekit.ops.pointwise as pointwise_ops
from tunekit.core.spec import DTYPE_NAMES
from tunekit.fleet.plans import read_plan
from tunekit.kernels.pointwise import pointwise_backward as pwb
from tunekit.ops.pointwise import activation_grad, bias_act, bias_act_residual, gelu
from tunekit.runtime.dispatch import dispatcher
from tunekit.runtime.hotpath import Stats
from tunekit.search_spaces.pointwise.pointwise import ACTIVATIONS
from tunekit.store.entry import Entry
from tunekit.store.key import CacheKey
from tunekit.store.store import Store

pytestmark = INTERPRETER_NOISE
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# A flat 1-D input, an odd row length, a 3-D input, tall-skinny rows.
SHAPES = ((7,), (1023,), (3, 5, 17), (300, 3))


def _call(x: torch.Tensor, b: torch.Tensor | None, r: torch.Tensor | None, activation: str, scale: float):
    if r is None:
        return bias_act(x, b, activation, scale=scale)
    return bias_act_residual(x, b, r, activation, scale=scale)


def _torch_grads(leaves: list[torch.Tensor | None], dy: torch.Tensor, activation: str, scale: float) -> list:
    """torch's autograd in float64 on the same values, each gradient rounded once to its leaf's dtype."""
    x, b, r = (None if t is None else t.detach().double().requires_grad_() for t in leaves)
    v = TORCH_ACTIVATIONS[activation](x * scale + (b if b is not None else 0))
    y = v + r if r is not None else v
    wrt = [t for t in (x, b, r) if t is not None]
    return [g.to(dy.dtype) for g in torch.autograd.grad(y, wrt, dy.double())]


def _assert_grads(got: list, want: list, what: str) -> None:
    for i, (g, w) in enumerate(zip(got, want)):
        which = f"{what} gradient {i}"
        assert g is not None and g.shape == w.shape and g.dtype == w.dtype, which
        tol = pwb.SPEC.tolerances[DTYPE_NAMES[w.dtype]]
        torch.testing.assert_close(g, w, atol=tol.atol, rtol=tol.rtol, msg=lambda m, which=which: f"{which}: {m}")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: DTYPE_NAMES[d])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gradients_match_torch_for_every_activation_bias_and_residual(activation: str, dtype: torch.dtype) -> None:
    for shape, x, b, r in operands(SHAPES, dtype):
        dy = randn(*shape, dtype=dtype, seed=300 + shape[-1], std=1.0)
        for bias in (None, b):
            for residual in (None, r):
                scale = 0.5 if residual is None else 1.0
                leaves = [t if t is None else t.clone().requires_grad_() for t in (x, bias, residual)]
                wrt = [t for t in leaves if t is not None]
                got = torch.autograd.grad(_call(*leaves, activation, scale), wrt, dy)
                what = f"{activation} {shape} bias={bias is not None} residual={residual is not None}"
                _assert_grads(list(got), _torch_grads(leaves, dy, activation, scale), what)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_gradient_matches_torch(approximate: str) -> None:
    x = randn(4, 33, dtype=torch.float32, seed=1).requires_grad_()
    dy = randn(4, 33, dtype=torch.float32, seed=2, std=1.0)
    (got,) = torch.autograd.grad(gelu(x, approximate), x, dy)
    x64 = x.detach().double().requires_grad_()
    (want,) = torch.autograd.grad(F.gelu(x64, approximate=approximate), x64, dy.double())
    _assert_grads([got], [want.float()], f"gelu {approximate}")


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int, bool]]:
    """Every backward dispatch: (kernel, outputs written, launched); the fp32 torch fallback must not run."""
    seen: list[tuple[str, int, bool]] = []
    real_launch = pointwise_ops.dispatch_launch

    def spy(kernel, inputs, outputs):  # type: ignore[no-untyped-def]
        seen.append((kernel.kernel, len(outputs), real_launch(kernel, inputs, outputs)))
        return seen[-1][2]

    def no_fallback(*args: object) -> None:
        raise AssertionError("the torch-served backward ran")

    monkeypatch.setattr(pointwise_ops, "dispatch_launch", spy)
    monkeypatch.setattr(pointwise_ops, "activation_grad", no_fallback)
    return seen


def test_eager_training_launches_the_backward_kernel(launches: list) -> None:
    """In the interpreter the backward problem is served by a kernel config, never torch: d input and d bias come
    from one pointwise_backward launch per backward."""
    x, b = torch.randn(6, 40, requires_grad=True), torch.randn(40, requires_grad=True)
    for _ in range(2):
        y = bias_act(x, b, "gelu_tanh")
        assert type(y.grad_fn).__name__ == "BiasActEagerBackward"
        y.sum().backward()
    backward = dispatcher("pointwise_backward")
    assert launches == [("pointwise_backward", 2, True)] * 2
    assert "torch" not in backward.served_by.values() and backward.counters == {"heuristic": 1}
    # the op asks which implementation serves the backward problem (torch's chain if torch), then the backward
    assert list(backward.memo) == [(8, 40, "float32", "gelu_tanh", True)] and backward.memo_hits == 3


def test_only_the_wanted_gradients_are_computed(launches: list) -> None:
    """A residual alone needs no backward kernel (its gradient is grad); a bias alone gets d bias from it; an input
    alone gets no d bias."""
    x, b, r = torch.randn(5, 16), torch.randn(16), torch.randn(5, 16, requires_grad=True)
    dy = torch.randn(5, 16)
    (dr,) = torch.autograd.grad(bias_act_residual(x, b, r, "silu"), r, dy)
    assert launches == [] and torch.equal(dr, dy)
    b.requires_grad_()
    (db,) = torch.autograd.grad(bias_act(x, b, "silu"), b, dy)
    _assert_grads([db], _torch_grads([x, b, None], dy, "silu", 1.0)[1:], "bias only")
    x.requires_grad_()
    (dx,) = torch.autograd.grad(bias_act(x, b.detach(), "silu"), x, dy)
    _assert_grads([dx], _torch_grads([x, b, None], dy, "silu", 1.0)[:1], "input only")
    assert launches == [("pointwise_backward", 2, True), ("pointwise_backward", 1, True)]


def test_strided_input_and_broadcast_gradient() -> None:
    base = torch.randn(24, 9)
    x = base.t().requires_grad_()  # [9, 24], strided along the last dim
    b = torch.randn(24, requires_grad=True)
    bias_act(x, b, "tanh", scale=2.0).sum().backward()  # the upstream gradient is an expanded (stride 0) tensor
    _assert_grads([x.grad, b.grad], _torch_grads([x, b, None], torch.ones(9, 24), "tanh", 2.0), "strided")


def test_empty_input_trains() -> None:
    x, b = torch.randn(0, 8, requires_grad=True), torch.randn(8, requires_grad=True)
    bias_act(x, b, "relu").sum().backward()
    assert x.grad is not None and x.grad.shape == (0, 8) and torch.equal(b.grad, torch.zeros(8))


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_torch_served_backward_agrees_with_the_kernel(activation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The backward custom op's torch branch (where dispatch serves torch, e.g. under torch.compile on an untuned
    GPU) and the kernel give the same gradients, relu's NaN handling included (torch's threshold_backward)."""
    x, b = randn(6, 24, dtype=torch.float32, seed=1), randn(24, dtype=torch.float32, seed=2, std=0.5)
    dy = randn(6, 24, dtype=torch.float32, seed=3, std=1.0)
    x[0, :3] = math.nan
    dy[1, 0], dy[2, 2] = math.nan, math.nan
    x[2, 2] = -1.0 - abs(float(b[2])) / 0.5  # z < 0 under a NaN gradient: relu's gradient is 0 there, as torch's
    args = (dy, x, b, activation, 0.5, True)
    kernel = pointwise_ops._pointwise_backward(*args)
    monkeypatch.setattr(pointwise_ops, "dispatch_launch", lambda *_: False)
    fallback = pointwise_ops._pointwise_backward(*args)
    for got, want in zip(fallback, kernel):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, equal_nan=True)
    if activation == "relu":
        assert float(fallback[0][2, 2]) == 0.0 and math.isnan(float(fallback[0][1, 0]))


def test_activation_grad_follows_torchs_relu_backward() -> None:
    z = torch.tensor([-1.0, 0.0, 2.0, math.nan, -3.0, 4.0])
    grad = torch.tensor([1.0, 1.0, 1.0, 1.0, math.nan, math.inf])
    zr = z.clone().requires_grad_()
    (want,) = torch.autograd.grad(F.relu(zr), zr, grad)
    torch.testing.assert_close(activation_grad(z, "relu", grad), want, equal_nan=True)
    assert torch.equal(activation_grad(z[:3], "relu"), torch.tensor([0.0, 0.0, 1.0]))  # the derivative alone


def test_untuned_gpu_trains_with_torchs_chain(untuned_gpu) -> None:
    """Untuned on a GPU, the backward problem is served by torch: torch's own ops and autograd run the call (no
    tunekit Function, no forward kernel resolved)."""
    x, b, r = torch.randn(4, 24, requires_grad=True), torch.randn(24, requires_grad=True), torch.randn(4, 24)
    for op in (gelu, bias_act, bias_act_residual):  # counted from here: earlier tests in this process called them
        op.stats = Stats()  # type: ignore[attr-defined]
    for y in (gelu(x), bias_act(x, b, "silu"), bias_act_residual(x, b, r.requires_grad_(), "relu")):
        assert "Eager" not in type(y.grad_fn).__name__, type(y.grad_fn).__name__
        y.sum().backward()
    # No pointwise kernel has an entry here: each call goes straight to torch, consulting no dispatcher.
    assert not untuned_gpu.dispatcher("pointwise_backward").served_by
    assert not untuned_gpu.dispatcher("pointwise").served_by
    assert all(op.stats.torch_direct == 1 for op in (gelu, bias_act, bias_act_residual))  # type: ignore[attr-defined]


def test_untuned_triton_setting_trains_with_the_kernels(untuned_gpu, monkeypatch) -> None:
    monkeypatch.setenv("TUNEKIT_UNTUNED", "triton")
    x, b = torch.randn(4, 24, requires_grad=True), torch.randn(24, requires_grad=True)
    y = bias_act(x, b, "gelu")
    assert type(y.grad_fn).__name__ == "BiasActEagerBackward"
    dy = torch.randn(4, 24)
    got = torch.autograd.grad(y, (x, b), dy)
    _assert_grads(list(got), _torch_grads([x, b, None], dy, "gelu", 1.0), "untuned, triton")
    assert set(untuned_gpu.dispatcher("pointwise_backward").served_by.values()) <= {"nearest", "heuristic"}


def test_a_tuned_backward_trains_with_the_kernels_on_a_gpu(untuned_gpu, launches) -> None:
    """The decision is the backward problem's: with it tuned (an entry in the cache for this device), eager
    training takes the tunekit Function even where the forward problem is untuned (served torch)."""
    x, b = torch.randn(4, 24, requires_grad=True), torch.randn(24, requires_grad=True)
    spec, device = untuned_gpu.dispatcher("pointwise_backward").spec, untuned_gpu.fingerprint()
    problem = spec.problem_dict(spec.key_of((x, x, b, True, "silu", 1.0)))
    config = spec.heuristic(problem, HERE)
    key = CacheKey.make(spec.name, spec.source_hash, device.key, problem)
    with Store() as store:
        store.put(Entry(key, dict(config), 1.0, device.to_json(), {"strategy": "tpe"}))
    untuned_gpu.reset_all()
    y = bias_act(x, b, "silu")
    assert type(y.grad_fn).__name__ == "BiasActEagerBackward"
    dy = torch.randn(4, 24)
    got = torch.autograd.grad(y, (x, b), dy)
    _assert_grads(list(got), _torch_grads([x, b, None], dy, "silu", 1.0), "tuned backward")
    assert set(untuned_gpu.dispatcher("pointwise").served_by.values()) == {"torch"}
    assert launches == [("pointwise_backward", 2, True)]


def test_a_recorded_training_step_holds_the_backward_problem(tmp_path: Path) -> None:
    """record_problems sees the backward problem next to the forward one, so `tune --plan` tunes both."""
    x, b = torch.randn(8, 64, requires_grad=True), torch.randn(64, requires_grad=True)
    with tunekit.record_problems(tmp_path / "plan.jsonl"):
        bias_act(x, b, "gelu").square().sum().backward()
    problems = read_plan(tmp_path / "plan.jsonl")
    assert ("pointwise_backward", pwb.pointwise_backward_problem(8, 64, "float32", "gelu", True)) in problems
    assert {kernel for kernel, _ in problems} == {"pointwise", "pointwise_backward"}
