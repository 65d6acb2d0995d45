"""LayerNorm backward: the kernel against torch's float64 autograd, its space and heuristic, its SPEC; and
tunekit.ops.layer_norm in training (autograd, custom ops, torch.compile)."""

from __future__ import annotations

# First: it sets TRITON_INTERPRET without a GPU, and triton reads that when it is imported.
import re

import tunekit.core.backend  # noqa: F401

# isort: split

import math

import pytest
import torch
import torch.nn.functional as F
from fingerprints import H200

import tunekit.ops.norms as norm_ops
from tunekit.core.device import fingerprint
from tunekit.core.errors import InvalidInputError, InvalidShapeError
from tunekit.core.spec import DTYPE_NAMES, DTYPES, row_bucket
from tunekit.kernels.norms import layernorm as ln_forward
from tunekit.kernels.norms import layernorm_backward as lnb
from tunekit.runtime.dispatch import dispatcher
from tunekit.search_spaces.norms.layernorm_backward import INTERPRETER_SMS, SPACE, max_per_thread, persistent_programs

INTERP = fingerprint()
DEVICES = (INTERP, H200)
CPU = torch.device("cpu")
AFFINE = [(True, True), (False, False), (True, False), (False, True)]
SHAPES = [(1, 1), (3, 7), (5, 1023), (2, 4097)]
TORCH_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _problem(m: int, n: int, dtype: str, weight: bool = True, bias: bool = True) -> dict:
    return {"rows": row_bucket(m), "cols": n, "dtype": dtype, "weight": weight, "bias": bias}


def _inputs(m: int, n: int, dtype: str, weight: bool = True, bias: bool = True, seed: int = 0) -> tuple:
    x, dy, w, want_dw, want_db, eps = lnb.make_inputs(_problem(m, n, dtype, weight, bias), CPU, seed)
    return (x[:m], dy[:m], w, want_dw, want_db, eps)  # make_inputs gives the bucket's rows; keep exactly m


def _run(config: dict, inputs: tuple) -> tuple:
    outputs = lnb.alloc_outputs(inputs)
    for out in outputs:
        out.fill_(math.nan)  # poisoned: an element the kernels skip stays NaN and fails the check
    lnb.launch(config, inputs, outputs)
    return outputs


def _check(config: dict, inputs: tuple) -> None:
    outputs = _run(config, inputs)
    expected = lnb.reference(inputs)
    assert len(outputs) == len(expected) == 1 + int(inputs[3]) + int(inputs[4])
    for got, want in zip(outputs, expected):
        tol = lnb.SPEC.tolerances[DTYPE_NAMES[got.dtype]]
        torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol, msg=lambda m: f"{config}: {m}")


def _kernel_shapes(problem: dict) -> list[dict]:
    """One valid config per distinct kernel and program layout: launch options don't change results."""
    seen: dict[tuple, dict] = {}
    for config in SPACE.valid_configs(problem, INTERP):
        seen.setdefault((config["variant"], config["BLOCK_N"], config["ROWS"], config["PROGRAMS_PER_SM"]), config)
    return list(seen.values())


def _spread(configs: list[dict], count: int) -> list[dict]:
    """`count` configs spread evenly over the list (first and last included): the interpreter is slow."""
    if len(configs) <= count:
        return configs
    return [configs[round(i * (len(configs) - 1) / (count - 1))] for i in range(count)]


# --- kernel correctness ------------------------------------------------------------------------------------


@pytest.mark.parametrize("weight,bias", AFFINE)
@pytest.mark.parametrize("m,n", SHAPES)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_heuristic_config_matches_torch(dtype: str, m: int, n: int, weight: bool, bias: bool) -> None:
    _check(lnb.heuristic(_problem(m, n, dtype, weight, bias), INTERP), _inputs(m, n, dtype, weight, bias))


@pytest.mark.parametrize("m,n", [(17, 300), (5, 1023), (2, 4097)])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_configs_across_the_space_match_torch(dtype: str, m: int, n: int) -> None:
    configs = _kernel_shapes(_problem(m, n, dtype))
    inputs = _inputs(m, n, dtype)
    for variant in ("single", "looped"):
        for config in _spread([c for c in configs if c["variant"] == variant], 4):
            _check(config, inputs)


def test_space_offers_both_variants_multi_row_tiles_and_program_counts() -> None:
    configs = _kernel_shapes(_problem(17, 300, "float32"))
    assert {c["variant"] for c in configs} == {"single", "looped"}
    assert any(c["variant"] == "single" and c["ROWS"] > 1 for c in configs)
    assert {c["PROGRAMS_PER_SM"] for c in configs} == {1, 2, 4, 8}  # 17 tiles > 4 × 2 interpreter SMs


def _config(variant: str, block_n: int, rows: int, per_sm: int, warps: int = 2) -> dict:
    return {
        "variant": variant,
        "BLOCK_N": block_n,
        "ROWS": rows,
        "PROGRAMS_PER_SM": per_sm,
        "num_warps": warps,
        "num_stages": 1,
    }


@pytest.mark.parametrize(
    "config",
    [
        _config("single", 512, 4, 1),
        _config("single", 512, 1, 8),
        _config("looped", 64, 1, 2),
        _config("looped", 128, 1, 8),
    ],
    ids=lambda c: f"{c['variant']}-{c['BLOCK_N']}-{c['ROWS']}-{c['PROGRAMS_PER_SM']}",
)
@pytest.mark.parametrize("weight,bias", AFFINE)
def test_variants_with_every_affine_combination(config: dict, weight: bool, bias: bool) -> None:
    _check(config, _inputs(7, 300, "float16", weight, bias))


# Awkward shapes: one element, rows fewer than programs, rows not a multiple of the tile, widths 2^k ± 1.
AWKWARD = [(1, 1), (3, 7), (17, 1023), (33, 2049), (5, 4097)]


@pytest.mark.parametrize("per_sm", [1, 2, 8])
@pytest.mark.parametrize("m,n", AWKWARD)
def test_persistent_programs_over_awkward_shapes(m: int, n: int, per_sm: int) -> None:
    """Every program count, single (2-row tiles) and looped (4 chunks), bf16 with weight and bias."""
    width = max(16, 1 << (n - 1).bit_length())
    inputs = _inputs(m, n, "bfloat16")
    for config in (_config("single", width, 2, per_sm, warps=4), _config("looped", width // 4, 1, per_sm, warps=4)):
        _check(config, inputs)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("weight,bias", [(True, True), (False, False)])
def test_rows_fewer_than_programs_and_ragged_tiles(dtype: str, weight: bool, bias: bool) -> None:
    """13 rows in 4-row tiles: 4 tiles, the last one row; 8 per SM would be 16 programs, the launch has 4."""
    config = _config("single", 128, 4, 8)
    assert persistent_programs(config, 13, INTERP.sm_count) == 4
    assert persistent_programs(config, 1000, INTERP.sm_count) == 8 * INTERPRETER_SMS
    assert persistent_programs(config, 100_000, H200.sm_count) == 8 * 132
    _check(config, _inputs(13, 100, dtype, weight, bias))


@pytest.mark.parametrize("variant,block_n", [("single", 1024), ("looped", 128)])
def test_large_mean_keeps_precision(variant: str, block_n: int) -> None:
    """Statistics are mean-subtracted (Welford when looped): E[x²] - E[x]² would lose every digit at mean 1e4."""
    gen = torch.Generator().manual_seed(1)
    x = 1e4 + torch.randn(4, 1000, generator=gen)
    dy = torch.randn(4, 1000, generator=gen)
    w = 1 + 0.1 * torch.randn(1000, generator=gen)
    inputs = (x, dy, w, True, True, 1e-5)
    config = _config(variant, block_n, 1, 1, warps=4)
    for got, want in zip(_run(config, inputs), lnb.reference(inputs)):
        torch.testing.assert_close(got, want, atol=5e-3, rtol=1e-3)


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # the interpreter's rsqrt(0) on that row
def test_masked_rows_do_not_poison_dweight_when_eps_is_zero() -> None:
    """3 rows in a 4-row tile: the padding row has variance 0, and rsqrt(0 + 0) = inf must not reach dweight."""
    x, dy, w, _, _, _ = _inputs(3, 40, "float32")
    inputs = (x, dy, w, True, True, 0.0)
    config = _config("single", 64, 4, 1, warps=1)
    for got, want in zip(_run(config, inputs), lnb.reference(inputs)):
        assert bool(torch.isfinite(got).all())
        torch.testing.assert_close(got, want, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize(
    "config", [_config("single", 128, 2, 4), _config("looped", 32, 1, 8)], ids=lambda c: str(c["variant"])
)
def test_results_are_bitwise_repeatable(config: dict) -> None:
    inputs = _inputs(29, 100, "float32")
    first, second = _run(config, inputs), _run(config, inputs)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    _check(config, inputs)


def test_zero_rows_give_zero_parameter_gradients() -> None:
    x, dy, w, _, _, eps = _inputs(1, 8, "float32")
    inputs = (x[:0], dy[:0], w, True, True, eps)
    dx, dw, db = _run(lnb.heuristic(_problem(1, 8, "float32"), INTERP), inputs)
    assert dx.shape == (0, 8) and torch.equal(dw, torch.zeros(8)) and torch.equal(db, torch.zeros(8))


@pytest.mark.parametrize(
    "config", [_config("single", 64, 2, 2), _config("looped", 16, 1, 4)], ids=lambda c: str(c["variant"])
)
def test_row_strides_are_honoured(config: dict) -> None:
    x, dy, w, _, _, eps = _inputs(5, 48, "float32")
    inputs = (x[:, :40], dy[:, :40], w[:40].contiguous(), True, True, eps)  # rows 48 apart, unit stride in a row
    _check(lnb.heuristic(_problem(5, 40, "float32"), INTERP), inputs)
    _check(config, inputs)
    dx = torch.full((5, 67), math.nan)[:, 3:43]  # dx rows 67 apart, starting off a 16-byte boundary: DIV is 1
    lnb.launch(config, inputs, (dx, torch.empty(40), torch.empty(40)))
    torch.testing.assert_close(dx, lnb.reference(inputs)[0], atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("problem", lnb.default_problems(INTERP), ids=lambda p: f"{p['rows']}x{p['cols']}")
def test_default_interpreter_problems_pass_the_tuners_check(problem: dict) -> None:
    _check(lnb.heuristic(problem, INTERP), lnb.make_inputs(problem, CPU, 3))


# --- search space ------------------------------------------------------------------------------------------

SWEEP_COLS = [1, 2, 3, 7, 15, 16, 17, 100, 255, 256, 257, 768, 1000, 1023, 1024, 2049, 4095, 4096, 4097, 8191]
SWEEP_COLS += [8192, 8193, 16384, 25600, 32768, 32769, 65536, 100_000, 1 << 20, 3_000_000]
SWEEP_ROWS = [1 << e for e in range(22)]


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.name)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_heuristic_is_valid_for_every_problem(dtype: str, device) -> None:
    for rows in SWEEP_ROWS:
        for cols in SWEEP_COLS:
            for weight, bias in AFFINE:
                problem = {"rows": rows, "cols": cols, "dtype": dtype, "weight": weight, "bias": bias}
                config = lnb.heuristic(problem, device)
                assert SPACE.check_membership(config) == config
                assert SPACE.violations(config, problem, device) == [], (problem, config)


def test_gpu_problems_have_an_exhaustively_searchable_space() -> None:
    for problem in lnb.default_problems(H200):
        count = len(SPACE.valid_configs(problem, H200))
        assert 1 <= count <= 300, (problem, count)


def test_register_budget_per_thread() -> None:
    # ptxas on sm_90 squeezes to ~8 + 7 registers per element within min(255, 65536 / threads).
    assert [max_per_thread("single", w) for w in (1, 2, 4, 8, 16, 32)] == [32, 32, 32, 32, 16, 8]
    assert [max_per_thread("looped", w) for w in (1, 2, 4, 8, 16, 32)] == [16, 16, 16, 16, 16, 8]
    problem = _problem(64, 4096, "bfloat16")
    config = _config("single", 4096, 1, 1, warps=16)
    assert SPACE.is_valid(config, problem, INTERP)
    assert SPACE.is_valid({**config, "num_warps": 4}, problem, INTERP)  # 32 per thread
    assert "registers_do_not_spill" in SPACE.violations({**config, "num_warps": 2}, problem, INTERP)
    assert "registers_do_not_spill" in SPACE.violations({**config, "num_warps": 32, "ROWS": 4}, problem, INTERP)
    wide = _config("single", 8192, 1, 1, warps=32)  # 8 per thread: 64 registers, no spill
    assert SPACE.is_valid(wide, _problem(64, 8192, "bfloat16"), H200)
    looped = {**config, "variant": "looped", "BLOCK_N": 2048, "num_warps": 4}  # 16 per thread: the looped limit
    assert SPACE.is_valid(looped, problem, INTERP)
    assert "registers_do_not_spill" in SPACE.violations({**looped, "num_warps": 2}, problem, INTERP)
    tiny = {**config, "BLOCK_N": 16, "num_warps": 2}
    assert "at_least_one_element_per_thread" in SPACE.violations(tiny, _problem(1, 5, "float32"), INTERP)
    assert SPACE.is_valid({**tiny, "num_warps": 1}, _problem(1, 5, "float32"), INTERP)


def test_layout_rules() -> None:
    problem = _problem(16, 1000, "float16")
    config = _config("single", 1024, 2, 1, warps=4)
    assert SPACE.is_valid(config, problem, INTERP)
    assert "single_block_covers_row" in SPACE.violations({**config, "BLOCK_N": 2048}, problem, INTERP)
    assert "rows_per_program_within_problem" in SPACE.violations({**config, "ROWS": 32}, problem, INTERP)
    looped = {**config, "variant": "looped", "BLOCK_N": 256, "ROWS": 1}
    assert SPACE.is_valid(looped, problem, INTERP)
    assert "looped_one_row_per_tile" in SPACE.violations({**looped, "ROWS": 2}, problem, INTERP)
    assert "looped_block_narrower_than_row" in SPACE.violations({**looped, "BLOCK_N": 1024}, problem, INTERP)
    assert "looped_chunks_not_tiny" in SPACE.violations({**looped, "BLOCK_N": 32}, problem, INTERP)


def test_programs_per_sm_rules() -> None:
    problem = _problem(65536, 768, "bfloat16")
    config = _config("single", 1024, 2, 4, warps=8)  # 8 per thread: ~80 registers, 3 programs fit an SM
    assert SPACE.violations(config, problem, H200) == ["programs_per_sm_resident"]
    assert SPACE.is_valid({**config, "PROGRAMS_PER_SM": 2}, problem, H200)
    wide = _config("single", 8192, 1, 2, warps=32)  # 2 × 32 warps fit, 2 × 1024 threads × 64 registers do not
    assert SPACE.violations(wide, _problem(4096, 8192, "bfloat16"), H200) == ["programs_per_sm_resident"]
    # 128 tiles: 2 per SM on 132 SMs launches what 1 per SM does.
    few = _problem(256, 768, "bfloat16")
    assert SPACE.violations({**config, "PROGRAMS_PER_SM": 2}, few, H200) == ["programs_per_sm_have_work"]
    assert SPACE.is_valid({**config, "PROGRAMS_PER_SM": 1}, few, H200)


def test_heuristic_on_a_132_sm_hopper() -> None:
    """64 bytes of a tile per thread, tiles of at least 8 KiB, 8 warps per SM (the H200 sweep's pattern)."""
    picks = {n: lnb.heuristic(_problem(16384, n, "bfloat16"), H200) for n in (1536, 2049, 4096, 5121, 8192, 16384)}
    assert picks[1536] == _config("single", 2048, 2, 2, warps=4)
    assert picks[2049] == picks[4096] == _config("single", 4096, 1, 2, warps=4)
    assert picks[5121] == picks[8192] == _config("single", 8192, 1, 1, warps=8)
    assert picks[16384]["variant"] == "looped"
    fp32 = lnb.heuristic(_problem(16384, 1536, "float32"), H200)
    assert fp32 == _config("single", 2048, 1, 2, warps=4)  # 64 bytes: 16 fp32 values per thread
    for n, pick in picks.items():
        assert SPACE.is_valid(pick, _problem(16384, n, "bfloat16"), H200), n


# --- SPEC --------------------------------------------------------------------------------------------------


def test_problem_from_shape() -> None:
    problem = lnb.problem_from_shape((3000, 1024), "bfloat16")
    assert problem == {"rows": 4096, "cols": 1024, "dtype": "bfloat16", "weight": True, "bias": True}
    assert lnb.SPEC.problem_key(problem) == (4096, 1024, "bfloat16", True, True)


@pytest.mark.parametrize(
    "shape,dtype,error,message",
    [
        ((4096,), "float16", InvalidShapeError, "2-D shape MxN"),
        ((2, 3, 4), "float16", InvalidShapeError, "2-D shape MxN"),
        ((0, 8), "float16", InvalidShapeError, ">= 1"),
        ((8, -1), "float16", InvalidShapeError, ">= 1"),
        ((8, 8), "int8", InvalidInputError, r"\['bfloat16', 'float16', 'float32'\].*'int8'"),
    ],
)
def test_problem_from_shape_rejects_bad_shapes(shape: tuple, dtype: str, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        lnb.problem_from_shape(shape, dtype)


def test_make_inputs_is_seeded_and_never_zero() -> None:
    problem = _problem(8, 64, "float16")
    a, b, c = (lnb.make_inputs(problem, CPU, s) for s in (7, 7, 8))
    for t_a, t_b in zip(a[:3], b[:3]):
        assert torch.equal(t_a, t_b) and bool((t_a != 0).any())
    assert not torch.equal(a[0], c[0]) and not torch.equal(a[1], c[1])
    assert a[0].shape == a[1].shape == (8, 64) and a[0].dtype == torch.float16
    assert a[3:5] == (True, True)
    _, _, w, want_dw, want_db, _ = lnb.make_inputs(_problem(8, 64, "float32", weight=False, bias=False), CPU, 0)
    assert w is None and not want_dw and not want_db


def test_default_problems() -> None:
    interp = lnb.default_problems(INTERP)
    assert interp and sum(int(p["rows"]) * int(p["cols"]) for p in interp) <= 50_000
    gpu = lnb.default_problems(H200)
    assert 4 <= len(gpu) <= 6 and {p["dtype"] for p in gpu} == {"float16", "bfloat16"}
    forward_shapes = {(p["rows"], p["cols"]) for p in ln_forward.default_problems(H200)}
    assert {(p["rows"], p["cols"]) for p in gpu} <= forward_shapes


def test_spec_declaration() -> None:
    spec = lnb.SPEC
    assert spec.name == "layernorm_backward" and spec.space is SPACE
    assert spec.problem_fields == ("rows", "cols", "dtype", "weight", "bias")
    assert set(spec.tolerances) == set(DTYPES)
    problem = _problem(1024, 4096, "float16")
    assert spec.bytes_moved(problem) == (3 * 1024 * 4096 + 3 * 4096) * 2
    assert spec.bytes_moved({**problem, "weight": False, "bias": False}) == 3 * 1024 * 4096 * 2
    assert re.fullmatch(r"\d+\.[0-9a-f]{16}\.[0-9a-f]{8}", spec.source_hash) and spec.torch_baseline is not None
    inputs = _inputs(3, 5, "bfloat16", True, False)
    assert [tuple(o.shape) for o in spec.alloc_outputs(inputs)] == [(3, 5), (5,)]
    for got, want in zip(spec.torch_baseline(inputs), spec.reference(inputs)):
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


# --- tunekit.ops.layer_norm in training --------------------------------------------------------------------

OP_TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 2e-2)}


def _leaves(shape: tuple, normalized: tuple, dtype: torch.dtype, weight: bool, bias: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 2 + 0.5).to(dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(normalized, generator=g)).to(dtype).requires_grad_() if weight else None
    b = (0.1 * torch.randn(normalized, generator=g)).to(dtype).requires_grad_() if bias else None
    dy = torch.randn(shape, generator=g).to(dtype)
    return x, w, b, dy


def _torch_grads(x, normalized, w, b, dy, eps=1e-5):
    """torch's LayerNorm forward and gradients on float64 copies of the leaves that require grad."""
    leaves = [None if t is None else t.detach().double().requires_grad_(t.requires_grad) for t in (x, w, b)]
    y = F.layer_norm(leaves[0], normalized, leaves[1], leaves[2], eps)
    y.backward(dy.double())
    return y.detach(), [None if t is None else t.grad for t in leaves]


def _assert_grads(ours, theirs, dtype) -> None:
    atol, rtol = OP_TOL[dtype]
    for got, want in zip(ours, theirs):
        assert (got is None) == (want is None)
        if got is not None:
            torch.testing.assert_close(got.double(), want, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape,normalized",
    [
        ((1, 1), (1,)),
        ((3, 7), (7,)),
        ((5, 1023), (1023,)),
        ((2, 4097), (4097,)),
        ((2, 3, 33), (33,)),
        ((4, 3, 5), (3, 5)),
    ],
)
def test_layer_norm_trains_like_torch(dtype: torch.dtype, shape: tuple, normalized: tuple) -> None:
    x, w, b, dy = _leaves(shape, normalized, dtype, True, True)
    y = norm_ops.layer_norm(x, normalized, w, b)
    y.backward(dy)
    y_ref, grads_ref = _torch_grads(x, normalized, w, b, dy)
    atol, rtol = OP_TOL[dtype]
    torch.testing.assert_close(y.detach().double(), y_ref, atol=atol, rtol=rtol)
    _assert_grads([x.grad, w.grad, b.grad], grads_ref, dtype)
    assert x.grad.dtype == w.grad.dtype == b.grad.dtype == dtype


@pytest.mark.parametrize("weight,bias", AFFINE)
def test_layer_norm_gradients_with_optional_affine(weight: bool, bias: bool) -> None:
    x, w, b, dy = _leaves((6, 50), (50,), torch.float32, weight, bias)
    norm_ops.layer_norm(x, (50,), w, b).backward(dy)
    _assert_grads(
        [x.grad, None if w is None else w.grad, None if b is None else b.grad],
        _torch_grads(x, (50,), w, b, dy)[1],
        torch.float32,
    )


def test_only_parameters_that_require_grad_get_one() -> None:
    x, w, b, dy = _leaves((4, 24), (24,), torch.float32, True, True)
    w.requires_grad_(False)  # a frozen weight still scales dx
    norm_ops.layer_norm(x, (24,), w, b).backward(dy)
    assert w.grad is None
    _assert_grads([x.grad, None, b.grad], _torch_grads(x, (24,), w, b, dy)[1], torch.float32)
    x2 = x.detach()  # an input that needs no grad: only the parameters get one
    b.grad = None
    w.requires_grad_(True)
    norm_ops.layer_norm(x2, (24,), w, b).backward(dy)
    _assert_grads([None, w.grad, b.grad], _torch_grads(x2, (24,), w, b, dy)[1], torch.float32)


def test_strided_input_and_broadcast_gradient() -> None:
    base = torch.randn(24, 9)
    x = base.t().requires_grad_()  # [9, 24], strided along the normalised dim
    w = torch.rand(24, requires_grad=True)
    norm_ops.layer_norm(x, 24, w).sum().backward()  # the upstream gradient is an expanded (stride 0) tensor
    _assert_grads([x.grad, w.grad], _torch_grads(x, (24,), w, None, torch.ones(9, 24))[1][:2], torch.float32)


def test_empty_input_trains() -> None:
    x = torch.randn(0, 8, requires_grad=True)
    w, b = torch.ones(8, requires_grad=True), torch.zeros(8, requires_grad=True)
    y = norm_ops.layer_norm(x, (8,), w, b)
    y.sum().backward()
    assert y.shape == (0, 8) and x.grad.shape == (0, 8)
    assert torch.equal(w.grad, torch.zeros(8)) and torch.equal(b.grad, torch.zeros(8))


def test_backward_dispatches_through_the_backward_kernel() -> None:
    x, w, b, dy = _leaves((3, 20), (20,), torch.float32, True, True)
    for _ in range(2):
        norm_ops.layer_norm(x, (20,), w, b).backward(dy)
    backward = dispatcher("layernorm_backward")
    # Resolved once; the forward also asks which implementation serves the backward (torch's whole op if torch).
    assert backward.counters == {"heuristic": 1} and backward.memo_hits == 3
    assert list(backward.memo) == [(4, 20, "float32", True, True)]


def test_eager_path_without_grad_skips_autograd() -> None:
    x = torch.randn(3, 8, requires_grad=True)
    assert norm_ops.layer_norm(x, (8,)).grad_fn is not None
    with torch.no_grad():
        assert norm_ops.layer_norm(x, (8,)).grad_fn is None
    assert norm_ops.layer_norm(x.detach(), (8,)).grad_fn is None


def test_custom_ops_pass_opcheck() -> None:
    """Schema, fake (meta) implementation and autograd registration, as torch checks them."""
    x, w, b, dy = _leaves((3, 8), (8,), torch.float32, True, True)
    torch.library.opcheck(torch.ops.tunekit.layer_norm.default, (x, [8], w, b, 1e-5))
    args = (dy, x.detach(), w.detach(), [8], 1e-5, True, torch.float32)
    torch.library.opcheck(torch.ops.tunekit.layer_norm_backward.default, args)


class _Block(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.ln_w = torch.nn.Parameter(1 + 0.1 * torch.randn(n))
        self.ln_b = torch.nn.Parameter(0.1 * torch.randn(n))
        self.rms_w = torch.nn.Parameter(1 + 0.1 * torch.randn(n))

    def forward(self, x: torch.Tensor, layer_norm, rms_norm) -> torch.Tensor:
        h = layer_norm(x, (x.shape[-1],), self.ln_w, self.ln_b, 1e-5)
        return (rms_norm(h * 2 + 1, [x.shape[-1]], self.rms_w, 1e-6) ** 2).sum()


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.usefixtures("swapped_under_compile")
def test_compiled_training_step_matches_torch(backend: str) -> None:
    """fullgraph: the custom ops trace without graph breaks; aot_eager also traces the backward's fake kernels."""
    torch.manual_seed(0)
    block = _Block(16)
    x = torch.randn(2, 3, 16, requires_grad=True)
    compiled = torch.compile(block, fullgraph=True, backend=backend)
    loss = compiled(x, norm_ops.layer_norm, norm_ops.rms_norm)
    loss.backward()
    ours = [x.grad] + [p.grad for p in block.parameters()]
    x_ref = x.detach().double().requires_grad_()
    ref_block = _Block(16).double()
    ref_block.load_state_dict({k: v.double() for k, v in block.state_dict().items()})
    loss_ref = ref_block(x_ref, F.layer_norm, F.rms_norm)
    loss_ref.backward()
    theirs = [x_ref.grad] + [p.grad for p in ref_block.parameters()]
    torch.testing.assert_close(loss.double(), loss_ref.detach(), atol=1e-3, rtol=1e-5)
    for got, want in zip(ours, theirs):
        torch.testing.assert_close(got.double(), want, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: norm_ops.layer_norm(torch.randn(2, 8), (8,), eps=None), "eps must be a Python float"),
        (lambda: norm_ops.layer_norm(torch.randn(2, 8), (8,), eps=True), "eps must be a Python float"),
        (lambda: norm_ops.layer_norm(torch.randn(2, 8), (8,), torch.ones(8, dtype=torch.int32)), "weight dtype"),
        (lambda: norm_ops.layer_norm(torch.randn(2, 8), (8,), None, [0.0] * 8), "bias must be a tensor or None"),
        (lambda: norm_ops.layer_norm(torch.randn(2, 8), [], None), "must match the trailing dims"),
    ],
)
def test_bad_inputs_are_refused_clearly(call, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        call()
