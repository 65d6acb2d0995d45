"""No silent detach: every op in tunekit.ops, with every tensor argument requiring grad, either gives torch's
gradients (compared in float64) within the dtype's tolerance, or raises a one-line TunekitError."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from op_cases import CASES, Case

import tunekit.ops as ops
from tunekit.core.errors import TunekitError
from tunekit.ops.declaration import PUBLIC

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TOLERANCE = {torch.float32: 2e-3, torch.float16: 2e-2, torch.bfloat16: 6e-2}  # relative to the largest gradient


def test_every_op_is_covered():
    assert sorted(CASES) == sorted(ops.__all__)


def _relative_error(got: torch.Tensor | None, want: torch.Tensor) -> float:
    assert got is not None, "a gradient was silently dropped"
    return float((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-6))


def _check(name: str, dtype: torch.dtype, call_of: Callable[[Case], Callable[..., torch.Tensor]]) -> None:
    case = CASES[name]
    shapes, _, torch_call = case
    gen = torch.Generator().manual_seed(len(name))
    leaves64 = [torch.randn(s, generator=gen, dtype=torch.float64).requires_grad_() for s in shapes]
    leaves = [t.detach().to(dtype).requires_grad_() for t in leaves64]
    try:
        out = call_of(case)(*leaves)
    except TunekitError as exc:  # refusing is allowed: with one clear line
        assert "\n" not in str(exc)
        return
    assert out.requires_grad, f"{name} silently detached its output"
    want = torch_call(*leaves64)
    grad_out = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad(out, leaves, grad_out.to(dtype), allow_unused=True)
    grads_want = torch.autograd.grad(want, leaves64, grad_out)
    for i, (got, expected) in enumerate(zip(grads, grads_want)):
        error = _relative_error(got, expected)
        assert error <= TOLERANCE[dtype], f"{name} {dtype} argument {i}: relative error {error:.2e}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_match_torch_or_refuse(name, dtype):
    _check(name, dtype, lambda case: case[1])


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.usefixtures("swapped_under_compile")
def test_gradients_under_torch_compile_fullgraph(name):
    torch._dynamo.reset()
    _check(name, torch.float32, lambda case: torch.compile(case[1], fullgraph=True, backend="aot_eager"))


# ---- never slower than torch: on a GPU, a problem with no entry of its own runs torch's own op ----


@pytest.mark.parametrize("name", sorted(CASES))
def test_untuned_problems_run_torch_and_train(name, untuned_gpu):
    _check(name, torch.float32, lambda case: case[1])
    served = {layer for d in untuned_gpu._DISPATCHERS.values() for layer in d.served_by.values()}
    # No kernel of the op has an entry here, so its calls go straight to torch without consulting dispatch.
    assert served <= {"torch"} and getattr(ops, name).stats.torch_direct > 0, served


def test_untuned_triton_setting_serves_the_kernels(untuned_gpu, monkeypatch):
    monkeypatch.setenv("TUNEKIT_UNTUNED", "triton")
    _check("layer_norm", torch.float32, lambda case: case[1])
    assert set(untuned_gpu.dispatcher("layernorm").served_by.values()) <= {"nearest", "heuristic"}


# ---- eager training skips the custom-op dispatcher (its host cost), with the same numbers ----

# From the declarations (an op added needs no row here): ops whose declaration builds an eager autograd Function, and
# ops that declare no autograd at all (torch's formula trains them).
EAGER_TRAINED = tuple(sorted(name for name, op in PUBLIC.items() if op.eager is not None))


def _spy_on_custom_ops(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the torch.ops.tunekit ops called from now on (the list fills as they are)."""
    called: list[str] = []
    real_ops = torch.ops.tunekit

    class Spy:
        def __getattr__(self, attr: str) -> object:
            called.append(attr)
            return getattr(real_ops, attr)

    monkeypatch.setattr(torch.ops, "tunekit", Spy())
    return called


@pytest.mark.parametrize("name", EAGER_TRAINED)
def test_eager_training_takes_the_autograd_function_not_the_custom_op(name, monkeypatch):
    """Eager calls whose gradients flow run the op's eager autograd Function: no tunekit custom op is called,
    forward or backward, and the gradients still match torch's."""
    called = _spy_on_custom_ops(monkeypatch)
    _check(name, torch.float32, lambda case: case[1])
    assert called == [], f"{name} went through torch.ops.tunekit.{called}"


@pytest.mark.parametrize("name", EAGER_TRAINED)
def test_eager_double_backward_raises(name):
    shapes, call, _ = CASES[name]
    leaves = [torch.randn(s).requires_grad_() for s in shapes]
    out = call(*leaves)
    grads = torch.autograd.grad(out.square().sum(), leaves[0], create_graph=True)
    with pytest.raises(RuntimeError, match="differentiate twice"):
        grads[0].sum().backward()


# ---- ops without a backward kernel: where gradients flow, the call is torch's own formula ----

TORCH_TRAINED = tuple(sorted(name for name, op in PUBLIC.items() if op.declaration.autograd is None))


def test_the_declarations_say_how_each_op_trains() -> None:
    """Every public op trains one way: its eager Function, torch's formula, or its custom op's registered autograd
    (the reductions and softmax); the lists above are not empty by accident."""
    through_custom_op = {name for name, op in PUBLIC.items() if op.eager is None and op.declaration.autograd}
    assert "layer_norm" in EAGER_TRAINED and "swiglu" in TORCH_TRAINED and "softmax" in through_custom_op
    assert sorted([*EAGER_TRAINED, *TORCH_TRAINED, *through_custom_op]) == sorted(ops.__all__)


@pytest.mark.parametrize("name", TORCH_TRAINED)
def test_training_calls_run_torch_own_formula(name, monkeypatch):
    """No tunekit custom op runs, forward or backward: torch's autograd records torch's ops, so the gradients are
    torch's (double backward included)."""
    called = _spy_on_custom_ops(monkeypatch)
    _check(name, torch.float32, lambda case: case[1])
    shapes, call, _ = CASES[name]
    leaves = [torch.randn(s).requires_grad_() for s in shapes]
    (grad,) = torch.autograd.grad(call(*leaves).square().sum(), leaves[0], create_graph=True)
    grad.sum().backward()
    assert called == [], f"{name} went through torch.ops.tunekit.{called}"
