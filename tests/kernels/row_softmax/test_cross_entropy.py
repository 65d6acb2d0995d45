"""The fused cross-entropy kernel (kernels/row_softmax/) and tunekit.ops.cross_entropy, in the interpreter:
loss and gradient against float64 for every dtype and reduction, ignored and out-of-range targets, what falls back
to torch, torch.compile, and the eager hot path."""

from __future__ import annotations

# First: it sets TRITON_INTERPRET without a GPU, and triton reads that when it is imported.
import tunekit.core.backend  # noqa: F401

# isort: split
import pytest
import torch
import torch.nn.functional as F
from fingerprints import H200, INTERPRETER
from kernel_checks import (
    DEV,
    INTERPRETER_NOISE,
    assert_heuristic_valid,
    assert_heuristic_valid_on_grid,
    launch_poisoned,
)

import tunekit.ops as ops
from tunekit.core.errors import InvalidInputError
from tunekit.kernels.row_softmax import cross_entropy as ce
from tunekit.runtime import dispatch, hotpath
from tunekit.tuning.verify import check_outputs

pytestmark = [*INTERPRETER_NOISE, pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")]
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Relative to the largest value: the loss and the gradient round once to the logits' dtype.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    dispatch.reset_all()
    for hot in hotpath.ops():
        hot.stats = hotpath.Stats()


def _inputs(n: int, v: int, dtype: torch.dtype, seed: int = 0, ignored: tuple[int, ...] = (1,)) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, v, generator=gen) * 3.0 + 2.0).to(dtype)
    t = torch.randint(0, v, (n,), generator=gen)
    t[[i for i in ignored if i < n]] = -100
    return x, t


def _want(x: torch.Tensor, t: torch.Tensor, reduction: str, grad_out: torch.Tensor) -> tuple:
    x64 = x.double().requires_grad_()
    loss = F.cross_entropy(x64, t, reduction=reduction)
    (grad,) = torch.autograd.grad(loss, x64, grad_out)
    return loss.detach(), grad


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    assert got.dtype == dtype and got.shape == want.shape, what
    scale = want.abs().max().clamp_min(1e-12)
    error = float((got.detach().double() - want).abs().max() / scale)
    assert error <= TOLERANCE[dtype], f"{what}: relative error {error:.2e}"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(("n", "v"), [(16, 1000), (6, 33), (3, 5000)])  # single, single, online
def test_loss_and_grad_match_float64(n: int, v: int, dtype: torch.dtype, reduction: str) -> None:
    x, t = _inputs(n, v, dtype)
    gen = torch.Generator().manual_seed(5)
    shape = (n,) if reduction == "none" else ()
    grad_out = torch.rand(shape, generator=gen, dtype=torch.float64) + 0.5  # not 1: the backward must scale
    want, want_grad = _want(x, t, reduction, grad_out)
    leaf = x.clone().requires_grad_()
    loss = ops.cross_entropy(leaf, t, reduction=reduction)
    assert loss.requires_grad and type(loss.grad_fn).__name__.startswith("CrossEntropyEager")
    (grad,) = torch.autograd.grad(loss, leaf, grad_out.to(dtype))
    _close(loss.detach(), want, dtype, "loss")
    _close(grad, want_grad, dtype, "grad")
    assert torch.equal(grad[1], torch.zeros_like(grad[1]))  # an ignored row
    with torch.no_grad():  # the loss-only launch (no gradient written)
        _close(ops.cross_entropy(x, t, reduction=reduction), want, dtype, "loss without grad")


def test_vocab_32000_online_and_single_configs_agree() -> None:
    x, t = _inputs(3, 32000, torch.bfloat16, ignored=(0,))
    inputs = (x, t, -100, "mean")
    expected = ce.reference(inputs)
    online = ce.heuristic(ce.problem((3, 32000), "bfloat16"), H200)
    assert online["variant"] == "online"
    single = {"variant": "single", "BLOCK_N": 32768, "ROWS": 1, "num_warps": 32, "num_stages": 1}
    for config in (online, single):
        assert check_outputs(ce.SPEC, launch_poisoned(ce.SPEC, config, inputs), expected) is None, config


def test_every_interpreter_problem_and_config_kind_matches_the_reference() -> None:
    for seed, problem in enumerate(ce.default_problems(INTERPRETER)):
        inputs = ce.make_inputs(problem, DEV, seed)
        assert (inputs[1] == -100).any() or int(problem["rows"]) < 16
        expected = ce.reference(inputs)
        configs = [ce.heuristic(problem, INTERPRETER), ce.heuristic(problem, H200)]
        configs.append({"variant": "online", "BLOCK_N": 256, "ROWS": 1, "num_warps": 2, "num_stages": 1})
        for config in configs:
            wrong = check_outputs(ce.SPEC, launch_poisoned(ce.SPEC, config, inputs), expected)
            assert wrong is None, (problem, config, wrong)


def test_all_ignored_mean_is_nan_like_torch() -> None:
    x, t = _inputs(4, 100, torch.float32, ignored=(0, 1, 2, 3))
    leaf = x.clone().requires_grad_()
    loss = ops.cross_entropy(leaf, t)
    assert torch.isnan(loss) and torch.isnan(F.cross_entropy(x, t))
    loss.backward()
    assert leaf.grad is not None and torch.equal(leaf.grad, torch.zeros_like(x))  # as torch's gradient
    assert float(ops.cross_entropy(x, t, reduction="sum")) == 0.0


def test_out_of_range_targets_give_nan_and_touch_no_other_row() -> None:
    x, t = _inputs(4, 50, torch.float32, ignored=())
    t[2] = 50
    t[3] = -7
    for config in ({"variant": "single", "BLOCK_N": 64, "ROWS": 4, "num_warps": 1, "num_stages": 1},
                   {"variant": "online", "BLOCK_N": 16, "ROWS": 1, "num_warps": 1, "num_stages": 1}):  # fmt: skip
        loss, grad = launch_poisoned(ce.SPEC, config, (x, t, -100, "none"))
        assert torch.isnan(loss[2:]).all() and torch.isnan(grad[2:]).all()
        torch.testing.assert_close(loss[:2], F.cross_entropy(x[:2], t[:2], reduction="none"))


def test_what_the_kernel_cannot_take_runs_torch() -> None:
    x, t = _inputs(6, 20, torch.float32)
    w = torch.rand(20)
    probs = torch.softmax(torch.randn(6, 20), -1)
    cases = [
        (lambda: ops.cross_entropy(x, t, weight=w), lambda: F.cross_entropy(x, t, w)),
        (lambda: ops.cross_entropy(x, t, label_smoothing=0.1), lambda: F.cross_entropy(x, t, label_smoothing=0.1)),
        (lambda: ops.cross_entropy(x, probs), lambda: F.cross_entropy(x, probs)),
        (
            lambda: ops.cross_entropy(x[None].transpose(1, 2), t[None]),
            lambda: F.cross_entropy(x[None].transpose(1, 2), t[None]),
        ),
        (
            lambda: ops.cross_entropy(x[:0], t[:0], reduction="sum"),
            lambda: F.cross_entropy(x[:0], t[:0], reduction="sum"),
        ),
    ]
    served_before = dict(dispatch.dispatcher("cross_entropy").served_by)
    for call, want in cases:
        got, expected = call(), want()
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got, expected)
    assert dict(dispatch.dispatcher("cross_entropy").served_by) == served_before  # the kernel was not consulted
    with pytest.raises(ValueError):  # torch's own error for a bad reduction
        ops.cross_entropy(x, t, reduction="avg")
    with pytest.raises(InvalidInputError):  # dtypes no kernel of tunekit's takes are refused, as by every op
        ops.cross_entropy(x.double(), t)


def test_strided_logits_and_targets() -> None:
    base, _ = _inputs(8, 64, torch.float32)
    x = base[::2, :40]  # row stride 128, unit stride along V: read in place
    tt = torch.randint(0, 40, (8,))[::2]
    torch.testing.assert_close(ops.cross_entropy(x, tt), F.cross_entropy(x, tt))
    xt = base.t()[:8]  # [8, 8] of logits with the last dim strided: copied
    t8 = torch.randint(0, 8, (8,))
    torch.testing.assert_close(ops.cross_entropy(xt, t8), F.cross_entropy(xt, t8))


@pytest.mark.usefixtures("swapped_under_compile")
def test_torch_compile_fullgraph_trains() -> None:
    torch._dynamo.reset()
    x, t = _inputs(5, 300, torch.float32)
    compiled = torch.compile(lambda a, b: ops.cross_entropy(a, b) * 2.0, fullgraph=True, backend="aot_eager")
    leaf = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(compiled(leaf, t), leaf)
    want, want_grad = _want(x, t, "mean", torch.tensor(2.0, dtype=torch.float64))
    _close(grad, want_grad, torch.float32, "compiled grad")
    with torch.no_grad():
        _close(compiled(x, t), want * 2.0, torch.float32, "compiled loss")


def test_eager_double_backward_and_reused_graph_raise() -> None:
    x, t = _inputs(4, 30, torch.float32)
    leaf = x.clone().requires_grad_()
    (grad,) = torch.autograd.grad(ops.cross_entropy(leaf, t), leaf, create_graph=True)
    with pytest.raises(RuntimeError, match=r"differentiate twice|inplace"):
        grad.sum().backward()
    loss = ops.cross_entropy(leaf, t)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="inplace"):  # the saved gradient was scaled in place
        loss.backward()


def test_saves_the_gradient_not_the_logits() -> None:
    x, t = _inputs(4, 30, torch.bfloat16)
    leaf = x.clone().requires_grad_()
    loss = ops.cross_entropy(leaf, t)
    saved = loss.grad_fn.saved_tensors  # type: ignore[union-attr]
    assert len(saved) == 1 and saved[0].shape == x.shape and saved[0].dtype == torch.bfloat16
    assert saved[0].data_ptr() != leaf.data_ptr()


def test_hot_path_replays_the_loss_launches() -> None:
    x, t = _inputs(6, 100, torch.bfloat16)
    for reduction in ("mean", "none"):
        results = [
            ops.cross_entropy(_inputs(6, 100, torch.bfloat16, seed)[0], t, reduction=reduction) for seed in (1, 2, 3)
        ]
        assert len(results) == 3
    stats = ops.cross_entropy.stats  # type: ignore[attr-defined]
    assert (stats.watched, stats.plans, stats.replays) == (2, 2, 2), stats
    replayed = ops.cross_entropy(x, t)
    hotpath.forget_plans()
    full = ops.cross_entropy(x, t)
    assert torch.equal(replayed, full)
    torch.testing.assert_close(full, F.cross_entropy(x.float(), t).bfloat16())


def test_key_problem_and_heuristics() -> None:
    x, t = _inputs(100, 32000, torch.bfloat16)
    assert ce.key_of((x, t, -100, "sum")) == (128, 32000, "bfloat16", "sum")
    assert ce.problem_from_shape((4096, 32000), "bfloat16") == ce.problem((4096, 32000), "bfloat16")
    heuristic = ce.heuristic(ce.problem((4096, 32000), "bfloat16"), H200)
    # 16-byte vectors: 8 bf16 per load, two loads per thread per chunk of 8 warps
    assert heuristic == {"variant": "online", "BLOCK_N": 4096, "ROWS": 1, "num_warps": 8, "num_stages": 1}
    for device in (H200, INTERPRETER):
        for problem in ce.default_problems(device):
            assert_heuristic_valid(ce.SPEC, problem, device)
        for dtype in ("float32", "bfloat16"):
            rows, cols = (1, 8, 4096), (1, 33, 1000, 4097, 32000, 50257, 128256, 262144)
            assert_heuristic_valid_on_grid(ce.SPEC, device, rows, cols, dtype=dtype, reduction="mean")
