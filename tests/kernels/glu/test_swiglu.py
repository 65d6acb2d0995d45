"""tunekit.ops.swiglu and the swiglu kernel (in the interpreter): silu(gate) * up against float64 over dtypes, odd
sizes and strided rows (a fused projection's halves), every config of the space, the heuristic, the int64 path,
torch's formula for what the kernel cannot take and for training, torch.compile, the hot path, and a CLI tune."""

from __future__ import annotations

import importlib
import json

import pytest
import torch
import torch.nn.functional as F
from fingerprints import H200, INTERPRETER
from helpers import cli
from kernel_checks import (
    DEV,
    INTERPRETER_NOISE,
    assert_heuristic_valid,
    assert_heuristic_valid_on_grid,
    launch_poisoned,
)

import tunekit.ops as ops
from tunekit.core.errors import InvalidInputError, InvalidShapeError
from tunekit.core.spec import DTYPE_NAMES
from tunekit.kernels.glu import swiglu as kernel
from tunekit.launch.plan import Replay, TorchCall
from tunekit.runtime import dispatch
from tunekit.runtime.dispatch import TORCH, Resolution
from tunekit.search_spaces.glu.swiglu import MAX_COLS
from tunekit.tuning.verify import check_outputs

pytestmark = INTERPRETER_NOISE
SPEC = kernel.SPEC
front = importlib.import_module("tunekit.ops.glu")  # the op module
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# 1, primes, 2^k +- 1, a 3-D shape with an odd last dim, Llama-2's intermediate size, a 0-d tensor.
SHAPES = ((1,), (7,), (3, 5, 17), (4, 1023), (2, 4097), (2, 11008), ())


def _randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32, std: float = 1.0) -> torch.Tensor:
    return (std * torch.randn(shape, generator=torch.Generator().manual_seed(seed))).to(dtype)


def _want(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """torch's formula in float64, rounded once to gate's dtype."""
    return (F.silu(gate.double()) * up.double()).to(gate.dtype)


def _assert_matches(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, what
    tol = SPEC.tolerances[DTYPE_NAMES[want.dtype]]
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol, equal_nan=True, msg=lambda m: f"{what}: {m}")


def _kernel_served() -> bool:
    return bool(dispatch.dispatcher("swiglu").served_by)


# ---- the op on the kernel ----


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_float64_over_shapes(dtype):
    for i, shape in enumerate(SHAPES):
        gate, up = _randn(*shape, seed=i, dtype=dtype, std=3.0), _randn(*shape, seed=100 + i, dtype=dtype)
        y = ops.swiglu(gate, up)
        _assert_matches(y, _want(gate, up), f"{shape}")
        assert y.is_contiguous()
    assert _kernel_served()


def test_nan_and_inf_follow_torch():
    gate = torch.tensor([float("nan"), float("inf"), -float("inf"), -100.0, 0.0, 30.0])
    up = torch.tensor([1.0, 0.0, 2.0, 3.0, float("inf"), -1.0])
    _assert_matches(ops.swiglu(gate, up), _want(gate, up))


def test_strided_rows_are_read_in_place_and_strided_columns_copied():
    """The halves of one fused gate/up projection (rows of stride 2N), a broadcast up (row stride 0), a transposed
    gate (its last dim strided: copied), and leading dims that do not merge into rows (copied)."""
    fused = _randn(3, 5, 2 * 48, seed=1, std=3.0)
    gate, up = fused[..., :48], fused[..., 48:]
    assert front._rows(gate).stride() == (96, 1)  # a view: no copy
    _assert_matches(ops.swiglu(gate, up), _want(gate, up), "fused halves")
    row = _randn(1, 40, seed=2).expand(6, 40)
    gate = _randn(6, 40, seed=3, std=3.0)
    _assert_matches(ops.swiglu(gate, row), _want(gate, row), "broadcast up")
    gate_t = _randn(40, 6, seed=4, std=3.0).T
    _assert_matches(ops.swiglu(gate_t, gate), _want(gate_t, gate), "transposed gate")
    lead = _randn(5, 3, 24, seed=5, std=3.0).transpose(0, 1)  # [3, 5, 24] whose leading dims do not merge
    _assert_matches(ops.swiglu(lead, lead.contiguous()), _want(lead, lead), "unmergeable leading dims")
    assert _kernel_served()


def test_a_neg_bit_view_is_read_as_its_values():
    gate, up = _randn(4, 24, seed=6, std=3.0), _randn(4, 24, seed=7)
    _assert_matches(ops.swiglu(torch._neg_view(-gate), up), _want(gate, up))


# ---- what the kernel does not take: torch's formula, torch's errors ----


def _fallback_cases() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    gate, up = _randn(4, 8, seed=1, std=3.0), _randn(4, 8, seed=2)
    return [
        ("mixed dtypes", gate, up.half()),
        ("float64", gate.double(), up.double()),
        ("int32", gate.int(), up.int()),
        ("up broadcast over rows", gate, up[0]),
        ("gate broadcast against up", gate[:1], up),
        ("empty", gate[:0], up[:0]),
    ]


@pytest.mark.parametrize(("what", "gate", "up"), _fallback_cases(), ids=[c[0] for c in _fallback_cases()])
def test_what_the_kernel_cannot_take_runs_torch(what, gate, up):
    if what == "int32":
        with pytest.raises(RuntimeError) as ours:
            ops.swiglu(gate, up)
        with pytest.raises(RuntimeError) as theirs:
            F.silu(gate) * up
        assert str(ours.value) == str(theirs.value)
    else:
        got, want = ops.swiglu(gate, up), F.silu(gate) * up
        assert got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want), what
    assert not _kernel_served()


def test_tensors_off_the_kernels_device_run_torch(monkeypatch):
    """CPU tensors on a GPU machine: the formula in torch, where they are."""
    monkeypatch.setattr(front, "_DEVICE_TYPE", "cuda")
    gate, up = _randn(3, 16, seed=1), _randn(3, 16, seed=2)
    assert torch.equal(ops.swiglu(gate, up), F.silu(gate) * up)
    assert not _kernel_served()


def test_rows_wider_than_the_grid_run_torch(monkeypatch):
    monkeypatch.setattr(front, "MAX_COLS", 8)
    gate, up = _randn(2, 9, seed=1), _randn(2, 9, seed=2)
    assert torch.equal(ops.swiglu(gate, up), F.silu(gate) * up)
    assert not _kernel_served()


def test_torch_errors_stay_torch_errors():
    gate, up = _randn(4, 8, seed=1), _randn(4, 7, seed=2)
    with pytest.raises(RuntimeError) as ours:
        ops.swiglu(gate, up)
    with pytest.raises(RuntimeError) as theirs:
        F.silu(gate) * up
    assert str(ours.value) == str(theirs.value)


def test_the_custom_op_refuses_what_its_kernel_cannot_take_in_one_line():
    with pytest.raises(InvalidInputError) as error:
        torch.ops.tunekit.swiglu(_randn(4, 8, seed=1), _randn(4, 8, seed=2).half())
    assert "\n" not in str(error.value) and "tunekit.ops.swiglu" in str(error.value)


def test_torch_served_problems_run_torch_formula(monkeypatch):
    """Where dispatch serves torch (an untuned problem on a GPU), the result is torch's formula, bit for bit."""
    monkeypatch.setattr(dispatch, "resolve", lambda *a: Resolution("torch", TORCH))
    gate, up = _randn(5, 48, seed=1, dtype=torch.bfloat16, std=3.0), _randn(5, 48, seed=2, dtype=torch.bfloat16)
    for _ in range(3):  # the full path, the watched call, the plan (torch's own call)
        assert torch.equal(ops.swiglu(gate, up), F.silu(gate) * up)
    assert [type(p) for p in ops.swiglu.plans.values()] == [TorchCall]  # type: ignore[attr-defined]


# ---- training: torch's formula and autograd ----


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_training_gives_torch_gradients(dtype):
    gate, up = _randn(3, 5, 24, seed=1, dtype=dtype, std=3.0), _randn(3, 5, 24, seed=2, dtype=dtype)
    for leaves in ((gate.clone().requires_grad_(), up), (gate, up.clone().requires_grad_())):
        grad = _randn(3, 5, 24, seed=3, dtype=dtype)
        y = ops.swiglu(*leaves)
        want = F.silu(leaves[0]) * leaves[1]
        assert torch.equal(y, want) and y.requires_grad
        wanted = [t for t in leaves if t.requires_grad]
        for got, expected in zip(torch.autograd.grad(y, wanted, grad), torch.autograd.grad(want, wanted, grad)):
            assert torch.equal(got, expected)
    assert not _kernel_served()  # no backward kernel: the forward is torch's too, so autograd records it


def test_training_calls_replay_as_torch_own_op():
    gate, up = _randn(4, 32, seed=1).requires_grad_(), _randn(4, 32, seed=2)
    for _ in range(3):
        (grad,) = torch.autograd.grad(ops.swiglu(gate, up).sum(), gate)
    assert [type(p) for p in ops.swiglu.plans.values()] == [TorchCall]  # type: ignore[attr-defined]
    torch.testing.assert_close(grad, torch.autograd.grad((F.silu(gate) * up).sum(), gate)[0])


# ---- torch.compile, opcheck, the hot path ----


@pytest.mark.usefixtures("swapped_under_compile")
def test_torch_compile_fullgraph_inference_and_training():
    torch._dynamo.reset()
    compiled = torch.compile(ops.swiglu, fullgraph=True, backend="aot_eager")
    gate, up = _randn(3, 5, 40, seed=1, std=3.0), _randn(3, 5, 40, seed=2)
    _assert_matches(compiled(gate, up), _want(gate, up), "compiled")
    assert _kernel_served()
    leaf = gate.clone().requires_grad_()
    (got,) = torch.autograd.grad(compiled(leaf, up).sum(), leaf)
    torch.testing.assert_close(got, torch.autograd.grad((F.silu(leaf) * up).sum(), leaf)[0])


def test_the_custom_op_passes_opcheck():
    gate, up = _randn(3, 5, 24, seed=1), _randn(3, 5, 24, seed=2)
    torch.library.opcheck(torch.ops.tunekit.swiglu.default, (gate, up))


def test_inference_calls_replay_their_plan():
    gate, up = _randn(6, 48, seed=1, dtype=torch.float16), _randn(6, 48, seed=2, dtype=torch.float16)
    stats = ops.swiglu.stats  # type: ignore[attr-defined]
    before = (stats.watched, stats.plans, stats.replays)
    results = [ops.swiglu(gate, up) for _ in range(4)]
    assert (stats.watched, stats.plans, stats.replays) == (before[0] + 1, before[1] + 1, before[2] + 2)
    (plan,) = ops.swiglu.plans.values()  # type: ignore[attr-defined]
    assert isinstance(plan, Replay) and len(plan.fires) == 1
    assert all(torch.equal(r, results[0]) for r in results[1:])


# ---- the kernel ----


def _assert_writes_the_reference(config: dict, inputs: tuple) -> None:
    outputs = launch_poisoned(SPEC, config, inputs)
    assert check_outputs(SPEC, outputs, SPEC.reference(inputs)) is None, config


def test_default_problems_heuristic_and_key():
    for device in (INTERPRETER, H200):
        for problem in SPEC.default_problems(device):
            assert_heuristic_valid(SPEC, problem, device)
    for seed, problem in enumerate(SPEC.default_problems(INTERPRETER)):
        inputs = SPEC.make_inputs(problem, DEV, seed)
        assert SPEC.key_of(inputs) == SPEC.problem_key(problem)
        _assert_writes_the_reference(SPEC.heuristic(problem, INTERPRETER), inputs)
    # a Llama prefill: 16-byte vectors and about 2048 elements per program
    config = SPEC.heuristic(kernel.swiglu_problem(4096, 14336, "bfloat16"), H200)
    assert config["BLOCK_N"] >= 256 and config["ROWS"] * config["BLOCK_N"] >= 2048 and config["num_warps"] >= 4


def test_the_heuristic_is_valid_everywhere():
    rows, cols = (1, 2, 8, 64, 4096, 2**20), (1, 3, 16, 1000, 4097, 11008, 14336, 18944, 2**20, MAX_COLS)
    for device in (INTERPRETER, H200):
        for dtype in ("float32", "bfloat16"):
            assert_heuristic_valid_on_grid(SPEC, device, rows, cols, dtype=dtype)


def test_every_config_of_the_space_writes_every_element():
    problem = kernel.swiglu_problem(3, 40, "float32")  # ragged rows and columns for most tiles
    inputs = SPEC.make_inputs(problem, DEV, 1)
    inputs = (inputs[0][:3], inputs[1][:3])
    configs = SPEC.space.valid_configs(problem, INTERPRETER)
    assert len(configs) >= 15
    for config in configs:
        _assert_writes_the_reference(config, inputs)


def test_the_int64_offsets_path(monkeypatch):
    monkeypatch.setattr(kernel, "INT32_LIMIT", 16)  # every launch now forms offsets past the limit
    problem = kernel.swiglu_problem(8, 40, "float32")
    _assert_writes_the_reference(SPEC.heuristic(problem, INTERPRETER), SPEC.make_inputs(problem, DEV, 2))


def test_problem_from_shape_sizes_and_its_errors():
    assert SPEC.problem_from_shape((2, 2000, 11008), "bfloat16") == kernel.swiglu_problem(4096, 11008, "bfloat16")
    assert SPEC.problem_from_shape((11008,), "float16") == kernel.swiglu_problem(1, 11008, "float16")
    with pytest.raises(InvalidShapeError, match="at most"):
        SPEC.problem_from_shape((2, MAX_COLS + 1), "float16")
    with pytest.raises(InvalidShapeError):
        SPEC.problem_from_shape((4, 0), "float16")
    problem = kernel.swiglu_problem(4, 8, "float16")
    assert SPEC.bytes_moved(problem) == 3 * 4 * 8 * 2 and SPEC.flops(problem) == 7 * 4 * 8


def test_a_quick_tune_through_the_cli():
    result = cli("tune", "--kernel", "swiglu", "--shape", "8x48", "--trials", "3", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)["results"]
    assert row["kernel"] == "swiglu" and row["config"]["BLOCK_N"] >= 16, row
