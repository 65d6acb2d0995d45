"""Pointwise backward (kernels/pointwise/pointwise_backward.py): d_input and d_bias of act(input * scale + bias) against
torch's float64 autograd, its persistent partial sums, its space and heuristic, its SPEC."""

from __future__ import annotations

# First: it sets TRITON_INTERPRET without a GPU, and triton reads that when it is imported.
import tunekit.core.backend  # noqa: F401

# isort: split

import math

import pytest
import torch
import torch.nn.functional as F
from fingerprints import H200, H200_LIMITS
from kernel_checks import DEV, HERE, INTERPRETER_NOISE, assert_heuristic_valid, launch_poisoned

from tunekit.core.errors import InvalidShapeError
from tunekit.core.spec import DTYPE_NAMES, DTYPES
from tunekit.kernels.pointwise import pointwise_backward as pwb
from tunekit.search_spaces.norms.layernorm_backward import INTERPRETER_SMS
from tunekit.search_spaces.pointwise.pointwise import ACTIVATIONS
from tunekit.search_spaces.pointwise.pointwise_backward import SPACE, row_programs
from tunekit.tuning import perf_model

pytestmark = INTERPRETER_NOISE
DEVICES = (HERE, H200)


def _config(block_n: int, rows: int, per_sm: int, warps: int = 2) -> dict:
    return {"BLOCK_N": block_n, "ROWS": rows, "PROGRAMS_PER_SM": per_sm, "num_warps": warps, "num_stages": 1}


def _inputs(shape: tuple, dtype: str, activation: str, bias: bool, seed: int = 0, want: bool = True) -> tuple:
    """Inputs of exactly `shape` (make_inputs gives the problem's bucketed rows)."""
    n = shape[-1]
    problem = pwb.pointwise_backward_problem(max(1, math.prod(shape[:-1])), n, dtype, activation, True)
    x, dy, b, _, _, scale = pwb.make_inputs(problem, DEV, seed)
    numel = math.prod(shape)
    x, dy = x.flatten()[:numel].reshape(shape), dy.flatten()[:numel].reshape(shape)
    return (x, dy, b if bias else None, want and bias, activation, scale)


def _check(config: dict, inputs: tuple) -> None:
    outputs = launch_poisoned(pwb.SPEC, config, inputs)
    expected = pwb.reference(inputs)
    assert len(outputs) == len(expected) == 1 + int(inputs[2] is not None and inputs[3])
    for got, want in zip(outputs, expected):
        tol = pwb.SPEC.tolerances[DTYPE_NAMES[got.dtype]]
        torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol, msg=lambda m: f"{config}: {m}")


def _problem_of(inputs: tuple) -> dict:
    return pwb.SPEC.problem_dict(pwb.key_of(inputs))


# --- kernel correctness ------------------------------------------------------------------------------------

# 300 columns: three 128-wide column tiles (the last ragged) or one 512-wide; 7 rows: 4 tiles of 2, the last half.
MULTI = (_config(512, 2, 2), _config(128, 2, 8))


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_every_activation_dtype_and_bias_matches_torch(activation: str, dtype: str, bias: bool) -> None:
    inputs = _inputs((7, 300), dtype, activation, bias)
    _check(pwb.heuristic(_problem_of(inputs), HERE), inputs)
    config = MULTI[0] if bias else _config(128, 1, 1)  # without a bias: 17 programs of 128 over one row of 2100
    assert SPACE.is_valid(config, _problem_of(inputs), HERE)
    _check(config, inputs)


def test_multi_program_configs_run_several_programs_per_column_tile() -> None:
    problem = _problem_of(_inputs((7, 300), "float32", "gelu", True))
    assert [row_programs(c, 7, 300, HERE.sm_count) for c in MULTI] == [4, 4]  # 4 row tiles; 16 // 3 tiles = 5
    assert all(SPACE.is_valid(c, problem, HERE) for c in MULTI)
    assert row_programs(_config(128, 1, 8), 100, 300, 0) == 8 * INTERPRETER_SMS // 3  # no SMs: the stand-in's
    assert row_programs(_config(512, 4, 8), 1000, 300, H200.sm_count) == 250  # one per row tile
    assert row_programs(_config(512, 4, 8), 100_000, 300, H200.sm_count) == 8 * 132
    assert row_programs(_config(128, 4, 8), 1000, 1 << 20, H200.sm_count) == 1  # wider than the grid: one each


# Awkward shapes: one element, odd widths, 2^k + 1, rows not a multiple of ROWS, a 3-D input.
AWKWARD = [(1, 1), (3, 7), (5, 2049), (17, 1000), (2, 3, 5)]


@pytest.mark.parametrize("per_sm", [1, 8])
@pytest.mark.parametrize("shape", AWKWARD, ids=lambda s: "x".join(map(str, s)))
def test_awkward_shapes_with_whole_and_chunked_rows(shape: tuple, per_sm: int) -> None:
    """bf16 with a bias: one column tile over the whole row, then 4 chunks of it, in 4-row tiles."""
    width = max(16, 1 << (shape[-1] - 1).bit_length())
    inputs = _inputs(shape, "bfloat16", "gelu_tanh", True)
    for config in (_config(width, 4, per_sm, warps=4), _config(max(16, width // 4), 4, per_sm, warps=4)):
        _check(config, inputs)
    _check(_config(64, 1, 1), _inputs(shape, "float16", "silu", False))


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
def test_zero_rows_give_an_empty_d_input_and_a_zero_d_bias(bias: bool) -> None:
    x, dy, b, want, act, scale = _inputs((3, 16), "float32", "gelu", bias)
    inputs = (x[:0], dy[:0], b, want, act, scale)
    assert pwb.key_of(inputs) == ((1, 16, "float32", "gelu", True) if bias else (1, 1, "float32", "gelu", False))
    outputs = launch_poisoned(pwb.SPEC, pwb.heuristic(_problem_of(inputs), HERE), inputs)
    assert outputs[0].shape == (0, 16)
    if bias:
        assert torch.equal(outputs[1], torch.zeros(16, device=DEV))


def test_a_bias_whose_gradient_is_not_wanted_is_still_added() -> None:
    inputs = _inputs((9, 40), "float16", "tanh", True, want=False)
    assert inputs[2] is not None and len(pwb.alloc_outputs(inputs)) == 1
    _check(_config(64, 2, 4), inputs)


def test_int64_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pwb, "INT32_LIMIT", 0)  # every launch takes the int64 path
    _check(_config(128, 2, 2), _inputs((5, 300), "float32", "silu", True))
    _check(_config(128, 1, 1), _inputs((5, 300), "float32", "silu", False))


def test_results_are_bitwise_repeatable() -> None:
    inputs = _inputs((29, 100), "float32", "gelu", True)
    config = _config(128, 2, 4)
    assert row_programs(config, 29, 100, HERE.sm_count) > 1  # the partial-sum reduction runs
    first, second = launch_poisoned(pwb.SPEC, config, inputs), launch_poisoned(pwb.SPEC, config, inputs)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_relu_passes_the_gradient_through_nan_as_torch() -> None:
    """torch's threshold_backward: dz = grad where z > 0 or z is NaN, 0 elsewhere (even where grad is NaN)."""
    x, dy, b, _, _, scale = _inputs((4, 24), "float32", "relu", True)
    x[0, :3] = math.nan
    b[5] = math.nan  # a whole column of NaN z: its d_bias is the sum of its gradients
    dy[1, 0], dy[2, 2] = math.nan, math.nan
    x[2, 2] = -1.0 - abs(float(b[2])) / scale  # z < 0 under a NaN gradient
    inputs = (x, dy, b, True, "relu", scale)
    xr, br = x.clone().requires_grad_(), b.clone().requires_grad_()
    want = torch.autograd.grad(F.relu(xr * scale + br), (xr, br), dy)
    assert float(want[0][2, 2]) == 0.0 and math.isnan(float(want[0][1, 0]))
    for got, expected in zip(launch_poisoned(pwb.SPEC, _config(16, 2, 4), inputs), want):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5, equal_nan=True)


def _kernel_shapes(problem: dict) -> list[dict]:
    """One valid config per distinct program layout: launch options don't change results."""
    seen: dict[tuple, dict] = {}
    for config in SPACE.valid_configs(problem, HERE):
        seen.setdefault((config["BLOCK_N"], config["ROWS"], config["PROGRAMS_PER_SM"]), config)
    return list(seen.values())


def _spread(configs: list[dict], count: int) -> list[dict]:
    """`count` configs spread evenly over the list (first and last included): the interpreter is slow."""
    if len(configs) <= count:
        return configs
    return [configs[round(i * (len(configs) - 1) / (count - 1))] for i in range(count)]


@pytest.mark.parametrize("shape,bias", [((13, 200), True), ((13, 200), False)], ids=["bias", "no_bias"])
def test_configs_across_the_space_match_torch(shape: tuple, bias: bool) -> None:
    inputs = _inputs(shape, "float16", "gelu", bias)
    configs = _kernel_shapes(_problem_of(inputs))
    if bias:  # chunked rows, several rows per tile and several programs per column tile are all on offer
        assert not HERE.is_interpreter or {c["PROGRAMS_PER_SM"] for c in configs} == {1, 2, 4, 8}
        assert any(c["BLOCK_N"] < 200 for c in configs) and any(c["ROWS"] > 1 for c in configs)
    else:
        assert {(c["ROWS"], c["PROGRAMS_PER_SM"]) for c in configs} == {(1, 1)}
    for config in _spread(configs, 8):
        _check(config, inputs)


@pytest.mark.parametrize("problem", pwb.default_problems(HERE), ids=lambda p: f"{p['rows']}x{p['cols']}")
def test_default_interpreter_problems_pass_the_tuners_check(problem: dict) -> None:
    _check(pwb.heuristic(problem, HERE), pwb.make_inputs(problem, DEV, 3))


# --- search space and heuristic ------------------------------------------------------------------------------

SWEEP_COLS = [1, 3, 16, 17, 100, 257, 1000, 2049, 4096, 4097, 8193, 11008, 32769, 100_000, 1 << 20, 3_000_000]


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.name)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_heuristic_is_valid_for_every_problem(dtype: str, device) -> None:
    for rows in (1 << e for e in range(0, 22, 3)):
        for cols in SWEEP_COLS:
            for bias in (True, False):
                problem = pwb.pointwise_backward_problem(rows, cols, dtype, "silu", bias)
                assert_heuristic_valid(pwb.SPEC, problem, device)


def test_gpu_problems_have_a_searchable_space_and_a_model() -> None:
    for problem in pwb.default_problems(H200):
        valid = SPACE.valid_configs(problem, H200)
        assert 1 <= len(valid) <= 400, (problem, len(valid))
        assert perf_model.quantize("pointwise_backward", pwb.heuristic(problem, H200), problem, H200_LIMITS) is not None


def test_without_a_bias_only_the_column_tile_and_warps_are_searched() -> None:
    problem = pwb.pointwise_backward_problem(1, 1 << 24, "bfloat16", "gelu", False)
    configs = SPACE.valid_configs(problem, H200)
    assert {(c["ROWS"], c["PROGRAMS_PER_SM"]) for c in configs} == {(1, 1)}
    assert pwb.heuristic(problem, H200)["BLOCK_N"] == 2048  # the forward's flat choice


# --- the declaration ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,key",
    [
        ((17, 1000), (32, 1000, "float16", "gelu_tanh", True)),
        ((2, 3, 5), (8, 5, "float16", "gelu_tanh", True)),
        ((4097,), (1, 8192, "float16", "gelu_tanh", False)),
    ],
)
def test_spec_round_trips_shapes_problems_and_keys(shape: tuple, key: tuple) -> None:
    spec = pwb.SPEC
    problem = spec.problem_from_shape(shape, "float16")
    assert spec.problem_key(problem) == key
    assert spec.key_of(spec.make_inputs(problem, DEV, 0)) == key
    inputs = _inputs(shape if len(shape) > 1 else (1, *shape), "float16", "gelu_tanh", len(shape) > 1)
    assert spec.key_of(inputs) == key


def test_spec_declaration() -> None:
    spec = pwb.SPEC
    assert spec.name == "pointwise_backward" and spec.space is SPACE and spec.version == 1
    assert spec.problem_fields == ("rows", "cols", "dtype", "activation", "bias")
    assert set(spec.tolerances) == set(DTYPES) and spec.torch_baseline is not None
    problem = spec.problem_from_shape((1024, 4096), "bfloat16")
    assert spec.bytes_moved(problem) == (3 * 1024 * 4096 + 2 * 4096) * 2
    assert spec.bytes_moved({**problem, "rows": 1, "bias": False}) == 3 * 4096 * 2
    assert spec.flops(problem) > 0
    with pytest.raises(InvalidShapeError):
        spec.problem_from_shape((0, 8), "float32")
    inputs = _inputs((6, 40), "bfloat16", "gelu", True)
    assert [tuple(o.shape) for o in spec.alloc_outputs(inputs)] == [(6, 40), (40,)]
    for got, want in zip(spec.torch_baseline(inputs), spec.reference(inputs)):
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    problems = spec.default_problems(HERE)
    assert sum(int(p["rows"]) * int(p["cols"]) for p in problems) <= 20_000
    assert {p["bias"] for p in spec.default_problems(H200)} == {True, False}
