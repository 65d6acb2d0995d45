"""LayerNorm forward: correctness against torch in the interpreter, the search space's rules, the heuristic, SPEC."""

from __future__ import annotations

# First: it sets TRITON_INTERPRET without a GPU, and triton reads that when it is imported.
import re

import tunekit.core.backend  # noqa: F401

# isort: split

import math

import pytest
import torch
from fingerprints import H200
from kernel_checks import assert_heuristic_valid_on_grid

from tunekit.core.device import fingerprint
from tunekit.core.errors import InvalidInputError, InvalidShapeError
from tunekit.core.spec import DTYPE_NAMES, DTYPES, row_bucket
from tunekit.kernels.common import next_pow2
from tunekit.kernels.norms import layernorm as ln
from tunekit.search_spaces.norms.layernorm import SPACE
from tunekit.search_spaces.rows import single_block_n, window_block_n

INTERP = fingerprint()
DEVICES = (INTERP, H200)
CPU = torch.device("cpu")
AFFINE = [(True, True), (False, False), (True, False), (False, True)]


def _problem(m: int, n: int, dtype: str, weight: bool = True, bias: bool = True) -> dict:
    return {"rows": row_bucket(m), "cols": n, "dtype": dtype, "weight": weight, "bias": bias}


def _inputs(m: int, n: int, dtype: str, weight: bool, bias: bool, seed: int = 0) -> tuple:
    x, w, b, eps = ln.make_inputs(_problem(m, n, dtype, weight, bias), CPU, seed)
    return (x[:m], w, b, eps)  # make_inputs gives the bucket's rows; keep exactly m


def _check(config: dict, inputs: tuple) -> None:
    x = inputs[0]
    y = torch.full_like(x, math.nan)  # poisoned: an element the kernel skips stays NaN and fails the check
    ln.launch(config, inputs, (y,))
    (expected,) = ln.reference(inputs)
    tol = ln.SPEC.tolerances[DTYPE_NAMES[x.dtype]]
    torch.testing.assert_close(y, expected, atol=tol.atol, rtol=tol.rtol)


def _distinct_kernels(problem: dict) -> list[dict]:
    """One valid config per distinct kernel (variant, BLOCK_N, ROWS): launch options don't change results."""
    seen: dict[tuple, dict] = {}
    for config in SPACE.valid_configs(problem, INTERP):
        seen.setdefault((config["variant"], config["BLOCK_N"], config["ROWS"]), config)
    return list(seen.values())


# --- correctness -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("weight,bias", AFFINE)
@pytest.mark.parametrize("n", [1, 7, 33, 1023, 4097])
# 17 rows: more than one program of every multi-row config, and a partial last one (64 rows picked the same configs
# at 4x the interpreter's time: 88 s of the suite).
@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_heuristic_config_matches_torch(dtype: str, m: int, n: int, weight: bool, bias: bool) -> None:
    inputs = _inputs(m, n, dtype, weight, bias)
    _check(ln.heuristic(_problem(m, n, dtype, weight, bias), INTERP), inputs)


@pytest.mark.parametrize("m,n", [(3, 33), (17, 1023), (5, 4097), (64, 7), (2, 100)])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_every_kernel_shape_in_space_matches_torch(dtype: str, m: int, n: int) -> None:
    problem = _problem(m, n, dtype)
    configs = _distinct_kernels(problem)
    inputs = _inputs(m, n, dtype, weight=True, bias=True)
    for config in configs:
        _check(config, inputs)


def test_sampled_configs_cover_both_variants_and_multi_row_programs() -> None:
    configs = _distinct_kernels(_problem(17, 1023, "float32"))
    assert {c["variant"] for c in configs} == {"single", "looped", "window"}  # 1023 fp32 rows: unaligned
    assert any(c["variant"] == "single" and c["ROWS"] > 1 for c in configs)
    # 17 rows with ROWS=32: one program, 15 masked-off rows.
    assert any(c["ROWS"] > 17 for c in configs)


@pytest.mark.parametrize("weight,bias", [(False, False), (True, True)])
def test_looped_and_multi_row_without_affine(weight: bool, bias: bool) -> None:
    inputs = _inputs(6, 300, "float16", weight, bias)
    _check({"variant": "looped", "BLOCK_N": 64, "ROWS": 1, "num_warps": 2, "num_stages": 2}, inputs)
    _check({"variant": "single", "BLOCK_N": 512, "ROWS": 4, "num_warps": 4, "num_stages": 1}, inputs)


@pytest.mark.parametrize("variant,block_n", [("single", 1024), ("looped", 128)])
def test_large_mean_keeps_precision(variant: str, block_n: int) -> None:
    """Statistics are mean-subtracted: E[x²] - E[x]² would lose every digit of a unit variance at mean 1e4."""
    gen = torch.Generator().manual_seed(1)
    x = 1e4 + torch.randn(4, 1000, generator=gen)
    y = torch.full_like(x, math.nan)
    config = {"variant": variant, "BLOCK_N": block_n, "ROWS": 1, "num_warps": 4, "num_stages": 1}
    ln.launch(config, (x, None, None, 1e-5), (y,))
    expected = torch.nn.functional.layer_norm(x.double(), (1000,), eps=1e-5).float()
    torch.testing.assert_close(y, expected, atol=5e-3, rtol=0)


def test_launch_honours_row_stride() -> None:
    base = torch.randn(5, 48)
    x = base[:, :40]  # rows 48 apart, unit stride within a row
    w, b = torch.rand(40) + 0.5, torch.randn(40)
    config = ln.heuristic(_problem(5, 40, "float32"), INTERP)
    (y,) = outputs = ln.alloc_outputs((x, w, b, 1e-5))
    ln.launch(config, (x, w, b, 1e-5), outputs)
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (40,), w, b, 1e-5), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("problem", ln.default_problems(INTERP), ids=lambda p: f"{p['rows']}x{p['cols']}")
def test_default_interpreter_problems_pass_the_tuners_check(problem: dict) -> None:
    inputs = ln.SPEC.make_inputs(problem, CPU, 3)
    _check(ln.SPEC.heuristic(problem, INTERP), inputs)


# --- search space ------------------------------------------------------------------------------------------

SWEEP_COLS = [1, 2, 3, 7, 15, 16, 17, 100, 255, 256, 257, 768, 1000, 1023, 1024, 4097, 8191, 25600, 32768]
SWEEP_COLS += [32769, 65535, 65536, 65537, 100_000, 1 << 20, (1 << 20) + 1, 3_000_000]
SWEEP_ROWS = [1 << e for e in range(17)]


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.name)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_heuristic_is_valid_for_every_problem(dtype: str, device) -> None:
    assert_heuristic_valid_on_grid(ln.SPEC, device, SWEEP_ROWS, SWEEP_COLS, dtype=dtype, weight=True, bias=False)


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.name)
def test_baseline_problems_have_an_exhaustively_searchable_space(device) -> None:
    for problem in ln.default_problems(H200):
        count = len(SPACE.valid_configs(problem, device))
        assert 1 <= count <= 300, (problem, count)


def test_single_needs_the_row_in_one_block() -> None:
    problem = _problem(64, 1000, "float16")
    config = {"variant": "single", "BLOCK_N": 1024, "ROWS": 1, "num_warps": 4, "num_stages": 1}
    assert SPACE.is_valid(config, problem, INTERP)
    for block_n in (512, 2048):
        assert "single_block_covers_row" in SPACE.violations({**config, "BLOCK_N": block_n}, problem, INTERP)
    # Rows narrower than the smallest block use it.
    assert single_block_n(3) == 16 and next_pow2(1000) == 1024
    assert SPACE.is_valid({**config, "BLOCK_N": 16, "num_warps": 1}, _problem(64, 3, "float16"), INTERP)


def test_single_has_no_pipeline_stages() -> None:
    config = {"variant": "single", "BLOCK_N": 1024, "ROWS": 1, "num_warps": 4, "num_stages": 2}
    assert SPACE.violations(config, _problem(64, 1000, "float16"), INTERP) == ["single_one_stage"]


def test_looped_rules() -> None:
    problem = _problem(64, 4096, "float16")
    config = {"variant": "looped", "BLOCK_N": 1024, "ROWS": 1, "num_warps": 4, "num_stages": 2}
    assert SPACE.is_valid(config, problem, INTERP)
    assert "looped_block_narrower_than_row" in SPACE.violations({**config, "BLOCK_N": 4096}, problem, INTERP)
    assert "looped_one_row_per_program" in SPACE.violations({**config, "ROWS": 2}, problem, INTERP)
    assert "looped_chunks_not_tiny" in SPACE.violations({**config, "BLOCK_N": 128}, problem, INTERP)
    # Beyond 16 chunks, chunks 4096 wide or wider are still allowed.
    wide = {**config, "BLOCK_N": 4096, "num_warps": 16}
    assert SPACE.is_valid(wide, _problem(8, 3_000_000, "float16"), INTERP)
    assert not SPACE.is_valid({**wide, "BLOCK_N": 2048}, _problem(8, 3_000_000, "float16"), INTERP)


def test_thread_and_register_budget_rules() -> None:
    problem = _problem(64, 4096, "float32")
    config = {"variant": "single", "BLOCK_N": 4096, "ROWS": 1, "num_warps": 8, "num_stages": 1}
    assert SPACE.is_valid(config, problem, INTERP)
    assert SPACE.is_valid({**config, "num_warps": 2}, problem, INTERP)  # 64 values per thread: the limit
    assert "registers_do_not_spill" in SPACE.violations({**config, "num_warps": 1}, problem, INTERP)
    looped = {"variant": "looped", "BLOCK_N": 2048, "ROWS": 1, "num_warps": 2, "num_stages": 1}
    assert SPACE.is_valid(looped, problem, INTERP)  # 32 values per thread: the looped limit
    assert "registers_do_not_spill" in SPACE.violations({**looped, "num_warps": 1}, problem, INTERP)
    assert "tile_at_most_65536_elements" in SPACE.violations({**config, "ROWS": 32}, problem, INTERP)
    tiny = {"variant": "single", "BLOCK_N": 16, "ROWS": 1, "num_warps": 2, "num_stages": 1}
    assert "at_least_one_element_per_thread" in SPACE.violations(tiny, _problem(1, 5, "float32"), INTERP)
    assert SPACE.is_valid({**tiny, "num_warps": 1}, _problem(1, 5, "float32"), INTERP)


def test_rows_per_program_bounded_by_rows_bucket() -> None:
    config = {"variant": "single", "BLOCK_N": 256, "ROWS": 8, "num_warps": 4, "num_stages": 1}
    assert SPACE.is_valid(config, _problem(5, 256, "float16"), INTERP)  # bucket 8
    assert SPACE.violations(config, _problem(4, 256, "float16"), INTERP) == ["rows_per_program_within_problem"]


def test_pipeline_stages_must_fit_shared_memory_on_a_gpu() -> None:
    problem = _problem(64, 1 << 20, "float32")
    config = {"variant": "looped", "BLOCK_N": 32768, "ROWS": 1, "num_warps": 32, "num_stages": 4}
    assert SPACE.violations(config, problem, H200) == ["pipeline_stages_fit_shared_memory"]
    assert SPACE.is_valid(config, problem, INTERP)  # the interpreter has no shared memory limit
    assert SPACE.is_valid({**config, "num_stages": 2}, problem, H200)


# --- SPEC --------------------------------------------------------------------------------------------------


def test_problem_from_shape() -> None:
    problem = ln.problem_from_shape((3000, 1024), "bfloat16")
    assert problem == {"rows": 4096, "cols": 1024, "dtype": "bfloat16", "weight": True, "bias": True}
    assert ln.SPEC.problem_key(problem) == (4096, 1024, "bfloat16", True, True)


@pytest.mark.parametrize("shape", [(4096,), (2, 3, 4), ()])
def test_problem_from_shape_rejects_wrong_arity(shape: tuple) -> None:
    with pytest.raises(InvalidShapeError, match="2-D shape MxN"):
        ln.problem_from_shape(shape, "float16")


@pytest.mark.parametrize("shape", [(0, 8), (8, 0), (-1, 8)])
def test_problem_from_shape_rejects_non_positive_sizes(shape: tuple) -> None:
    with pytest.raises(InvalidShapeError, match=">= 1"):
        ln.problem_from_shape(shape, "float16")


def test_problem_from_shape_rejects_unknown_dtype() -> None:
    with pytest.raises(InvalidInputError, match=r"\['bfloat16', 'float16', 'float32'\].*'int8'"):
        ln.problem_from_shape((8, 8), "int8")


def test_make_inputs_is_seeded_and_never_zero() -> None:
    problem = _problem(8, 64, "float16")
    a, b = ln.make_inputs(problem, CPU, 7), ln.make_inputs(problem, CPU, 7)
    c = ln.make_inputs(problem, CPU, 8)
    for t_a, t_b in zip(a[:3], b[:3]):
        assert torch.equal(t_a, t_b)
        assert bool((t_a != 0).any())
    assert not torch.equal(a[0], c[0])
    assert a[0].shape == (8, 64) and a[0].dtype == torch.float16
    _, w, bias, _ = ln.make_inputs(_problem(8, 64, "float32", weight=False, bias=False), CPU, 0)
    assert w is None and bias is None


def test_default_problems() -> None:
    interp = ln.default_problems(INTERP)
    assert interp and all(p["dtype"] == "float32" for p in interp)
    assert sum(int(p["rows"]) * int(p["cols"]) for p in interp) <= 50_000  # tunes in about a minute on a CPU
    gpu = ln.default_problems(H200)
    assert len(gpu) == 10 and all(p["dtype"] == "float16" for p in gpu)
    assert {"rows": 4096, "cols": 4097, "dtype": "float16", "weight": True, "bias": True} in gpu


def test_spec_declaration() -> None:
    spec = ln.SPEC
    assert spec.name == "layernorm" and spec.space is SPACE
    assert set(spec.tolerances) == set(DTYPES)
    problem = _problem(1024, 4096, "float16")
    assert spec.bytes_moved(problem) == (2 * 1024 * 4096 + 2 * 4096) * 2
    assert spec.bytes_moved({**problem, "weight": False, "bias": False}) == 2 * 1024 * 4096 * 2
    assert spec.flops(problem) == 8 * 1024 * 4096
    assert re.fullmatch(r"\d+\.[0-9a-f]{16}\.[0-9a-f]{8}", spec.source_hash)
    assert spec.torch_baseline is not None
    (y,) = spec.alloc_outputs(_inputs(3, 5, "bfloat16", True, True))
    assert y.shape == (3, 5) and y.dtype == torch.bfloat16


# --- the window variant: rows that start inside a 16-byte vector -----------------------------------------------


def _window(n: int, dtype: str, rows: int = 1) -> dict:
    return {"variant": "window", "BLOCK_N": window_block_n(n, dtype), "ROWS": rows, "num_warps": 4, "num_stages": 1}


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("m,n,rows", [(9, 1001, 1), (7, 97, 4), (13, 33, 8), (3, 15, 2)])
def test_window_matches_torch_at_every_row_offset(dtype: str, m: int, n: int, rows: int) -> None:
    """Odd widths put consecutive rows at every offset within a vector; the last program holds a partial block."""
    _check(_window(n, dtype, rows), _inputs(m, n, dtype, weight=True, bias=True))


def test_window_leaves_the_neighbours_of_each_row_untouched() -> None:
    """Rows inside a wider buffer: each row shares its edge vectors with padding that must keep its values."""
    m, n, pad = 11, 37, 3
    x_buf = torch.randn(m, n + pad).to(torch.float16)
    y_buf = torch.full_like(x_buf, -7.0)
    x, y = x_buf[:, :n], y_buf[:, :n]
    w, b = torch.randn(n).to(torch.float16), torch.randn(n).to(torch.float16)
    ln.launch(_window(n, "float16", 2), (x, w, b, 1e-5), (y,))
    (expected,) = ln.reference((x, w, b, 1e-5))
    torch.testing.assert_close(y, expected, atol=1e-2, rtol=1e-2)
    assert torch.equal(y_buf[:, n:], torch.full((m, pad), -7.0, dtype=torch.float16))


def test_window_on_tensors_it_cannot_take_falls_back_to_plain_loads() -> None:
    """A view starting 2 bytes into a vector, or an output with other strides: still correct (single's kernel)."""
    base = torch.randn(6, 102).to(torch.float16)
    x = base[:, 1:100]  # data pointer 2 bytes past the allocation's alignment
    assert x.data_ptr() % 16 != 0
    _check(_window(99, "float16", 2), (x, None, None, 1e-5))


def test_window_only_for_rows_that_are_not_whole_vectors() -> None:
    config = _window(4096, "float16")
    assert "window_only_for_unaligned_rows" in SPACE.violations(config, _problem(64, 4096, "float16"), H200)
    assert SPACE.is_valid(_window(4097, "float16"), _problem(64, 4097, "float16"), H200)
    # 4100 fp32 values are 16400 bytes, whole vectors; 4100 fp16 values are not.
    assert not SPACE.is_valid(_window(4100, "float32"), _problem(64, 4100, "float32"), H200)
    assert SPACE.is_valid(_window(4100, "float16"), _problem(64, 4100, "float16"), H200)
    assert window_block_n(4097, "float16") == 8192 and window_block_n(4089, "float16") == 4096
    wrong = {**_window(4097, "float16"), "BLOCK_N": 16384}
    assert "single_block_covers_row" in SPACE.violations(wrong, _problem(64, 4097, "float16"), H200)
