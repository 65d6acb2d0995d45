"""Softmax / log_softmax: the kernels against fp64 torch, the space and heuristic, and the ops' contract."""

from __future__ import annotations

# First: it sets TRITON_INTERPRET without a GPU, and triton reads that when it is imported.
import tunekit.core.backend  # noqa: F401

# isort: split

import math

import pytest
import torch
from fingerprints import H200, INTERPRETER
from kernel_checks import DEV, HERE, INTERPRETER_NOISE, assert_heuristic_valid, launch_poisoned

from tunekit.core.errors import InvalidInputError, InvalidShapeError
from tunekit.core.spec import DTYPES
from tunekit.kernels.row_softmax import softmax as sm
from tunekit.ops import row_softmax as rops
from tunekit.runtime.dispatch import dispatcher
from tunekit.search_spaces.row_softmax.softmax import SPACE
from tunekit.search_spaces.rows import single_block_n
from tunekit.tuning.verify import check_outputs

# Besides the interpreter's usual noise: inf arithmetic on all -inf rows.
pytestmark = [*INTERPRETER_NOISE, pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")]

DTYPE_LIST = list(DTYPES.values())
TOL = {
    torch.float32: {"atol": 1e-6, "rtol": 1e-4},
    torch.float16: {"atol": 1e-5, "rtol": 2e-3},
    torch.bfloat16: {"atol": 1e-4, "rtol": 1.6e-2},
}


def _configs(problem: dict) -> list[dict]:
    """The heuristic and every distinct kernel shape per variant, thinned to keep the interpreter quick."""
    distinct: dict[tuple, dict] = {}
    for c in SPACE.valid_configs(problem, HERE):
        distinct.setdefault((c["variant"], c["BLOCK_N"], c["ROWS"]), c)
    picks = [sm.heuristic(problem, HERE)]
    for variant in ("single", "online", "looped", "window"):
        of_variant = [c for c in distinct.values() if c["variant"] == variant]
        picks += of_variant[:: max(1, len(of_variant) // 2)]
    return picks


# --- kernels through the spec ------------------------------------------------------------------------------


@pytest.mark.parametrize("log", [False, True])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("m,n", [(1, 1), (1, 7), (3, 1023), (5, 4097), (1000, 3), (9, 130)])
def test_kernel_configs_match_fp64_reference(m: int, n: int, dtype: str, log: bool) -> None:
    problem = sm.problem((m, n), dtype, log)
    x, _ = sm.make_inputs(problem, DEV, seed=m + n)
    inputs = (x[:m], log)
    expected = sm.reference(inputs)
    for config in _configs(problem):
        wrong = check_outputs(sm.SPEC, launch_poisoned(sm.SPEC, config, inputs), expected)
        assert wrong is None, f"{config}: {wrong}"


@pytest.mark.parametrize(
    "variant,block_n,rows", [("single", 16, 2), ("online", 16, 1), ("looped", 16, 1), ("window", 32, 2)]
)
def test_edge_values_match_torch(variant: str, block_n: int, rows: int) -> None:
    """-inf entries, an all -inf row (NaN), a NaN (whole row NaN), huge values (needs the max shift)."""
    inf = math.inf
    x = torch.tensor(
        [
            [-inf, 1.0, 2.0, -inf, 0.5, 3.0, -inf, 1.0, 2.0, 7.0, 1.0, 1.0, 0.0, 0.0, -1.0, 2.0, 3.0, 4.0, 5.0],
            [-inf] * 19,
            [1.0, math.nan] + [0.0] * 17,
            [1e4, -1e4] + [9e3] * 17,
        ],
        device=DEV,
    )
    config = {"variant": variant, "BLOCK_N": block_n if variant not in ("single", "window") else 32, "ROWS": rows}
    config |= {"num_warps": 1, "num_stages": 1}
    for log in (False, True):
        (y,) = launch_poisoned(sm.SPEC, config, (x, log))
        want = (torch.log_softmax if log else torch.softmax)(x.double().cpu(), -1)
        torch.testing.assert_close(y.double().cpu(), want, equal_nan=True, atol=1e-6, rtol=1e-5)


def test_window_is_offered_for_unaligned_rows_and_leaves_neighbours_untouched() -> None:
    problem = sm.problem((64, 4097), "float16")
    assert any(c["variant"] == "window" and c["BLOCK_N"] == 8192 for c in SPACE.valid_configs(problem, H200))
    assert not any(c["variant"] == "window" for c in SPACE.valid_configs(sm.problem((64, 4096), "float16"), H200))
    m, n, pad = 7, 45, 3
    x_buf, y_buf = torch.randn(m, n + pad, device=DEV), torch.full((m, n + pad), -5.0, device=DEV)
    config = {"variant": "window", "BLOCK_N": 64, "ROWS": 2, "num_warps": 2, "num_stages": 1}
    sm.launch(config, (x_buf[:, :n], False), (y_buf[:, :n],))
    torch.testing.assert_close(y_buf[:, :n], torch.softmax(x_buf[:, :n], -1), **TOL[torch.float32])
    assert torch.equal(y_buf[:, n:], torch.full((m, pad), -5.0, device=DEV))


# --- space, heuristic, spec --------------------------------------------------------------------------------


@pytest.mark.parametrize("device", [INTERPRETER, H200], ids=["interpreter", "h200"])
def test_heuristic_always_valid(device) -> None:
    for dtype in DTYPES:
        for log in (False, True):
            for rows in [1, 2, 3, 64, 1024, 1 << 16, 1 << 22]:
                for cols in [1, 7, 16, 100, 1023, 4096, 4097, 32768, 32769, 50257, 131072, 1 << 20]:
                    assert_heuristic_valid(sm.SPEC, sm.problem((rows, cols), dtype, log), device)


def test_rules() -> None:
    p = sm.problem((4096, 4096), "float16")
    single = {"variant": "single", "BLOCK_N": 4096, "ROWS": 1, "num_warps": 8, "num_stages": 1}
    assert SPACE.is_valid(single, p, H200)
    assert "single_block_covers_row" in SPACE.violations({**single, "BLOCK_N": 2048}, p, H200)
    assert "single_one_stage" in SPACE.violations({**single, "num_stages": 2}, p, H200)
    online = {**single, "variant": "online", "BLOCK_N": 1024}
    assert SPACE.is_valid(online, p, H200)
    assert "looped_block_narrower_than_row" in SPACE.violations({**online, "BLOCK_N": 4096}, p, H200)
    assert "looped_one_row_per_program" in SPACE.violations({**online, "ROWS": 2}, p, H200)
    assert "looped_at_most_16_chunks" in SPACE.violations({**online, "BLOCK_N": 128, "num_warps": 1}, p, H200)
    assert "at_most_64_elements_per_thread" in SPACE.violations({**single, "num_warps": 1}, p, H200)
    assert single_block_n(1) == 16 and single_block_n(4097) == 8192


def test_default_problems() -> None:
    for device in (INTERPRETER, H200):
        for p in sm.default_problems(device):
            assert set(p) == set(sm.SPEC.problem_fields)
            assert SPACE.valid_configs(p, device), p
    assert all(int(p["rows"]) * int(p["cols"]) <= 1 << 15 for p in sm.default_problems(INTERPRETER))


def test_problem_from_shape() -> None:
    assert sm.problem_from_shape((1000, 4097), "bfloat16") == {
        "rows": 1024, "cols": 4097, "dtype": "bfloat16", "log": False,
    }  # fmt: skip
    with pytest.raises(InvalidShapeError, match="MxN"):
        sm.problem_from_shape((2, 3, 4), "float16")
    with pytest.raises(InvalidShapeError, match=">= 1"):
        sm.problem_from_shape((4, 0), "float16")
    with pytest.raises(InvalidInputError, match="dtype"):
        sm.problem_from_shape((4, 5), "int8")


# --- ops against torch -------------------------------------------------------------------------------------


OP_SHAPES = [(1, 1), (1, 7), (3, 1023), (5, 4097), (1000, 3), (2, 3, 5)]


@pytest.mark.parametrize("dtype", DTYPE_LIST, ids=str)
@pytest.mark.parametrize("shape", OP_SHAPES, ids=str)
def test_ops_match_torch(shape: tuple, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(len(shape))
    x = (torch.randn(shape, generator=g) * 3.0).to(dtype).to(DEV)
    xd = x.double()
    for dim in [*range(len(shape)), -1]:
        y = rops.softmax(x, dim)
        assert y.dtype == dtype and y.shape == x.shape
        torch.testing.assert_close(y, torch.softmax(xd, dim).to(dtype), **TOL[dtype])
        torch.testing.assert_close(rops.log_softmax(x, dim), torch.log_softmax(xd, dim).to(dtype), **TOL[dtype])


def test_rows_sum_to_one_and_log_is_log_of_softmax() -> None:
    torch.manual_seed(7)  # seeded: at a 1e-5 tolerance an unseeded draw failed once
    x = torch.randn(37, 2049, device=DEV) * 4.0
    y = rops.softmax(x, -1)
    torch.testing.assert_close(y.double().sum(-1), torch.ones(37, dtype=torch.float64, device=DEV), atol=1e-5, rtol=0)
    assert (y >= 0).all()
    torch.testing.assert_close(rops.log_softmax(x, -1), torch.log(y), atol=1e-5, rtol=1e-5)
    z = rops.softmax(x, 0)
    torch.testing.assert_close(z.double().sum(0), torch.ones(2049, dtype=torch.float64, device=DEV), atol=1e-5, rtol=0)


def test_dtype_argument() -> None:
    x = (torch.randn(6, 300, device=DEV) * 3).to(torch.bfloat16)
    y = rops.softmax(x, 1, dtype=torch.float32)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, torch.softmax(x, 1, dtype=torch.float32), atol=1e-6, rtol=1e-4)
    z = rops.log_softmax(x.float(), 0, dtype=torch.float16)
    assert z.dtype == torch.float16
    want = torch.log_softmax(x.float().to(torch.float16).float(), 0).half()
    torch.testing.assert_close(z, want, **TOL[torch.float16])


def test_non_contiguous_and_other_dims() -> None:
    base = torch.randn(6, 10, 12, device=DEV) * 2
    for x in (base.transpose(0, 2), base[:, ::2, 1:], base.permute(1, 2, 0), base[:, :, :7]):
        for dim in range(3):
            torch.testing.assert_close(rops.softmax(x, dim), torch.softmax(x, dim), atol=1e-6, rtol=1e-4)
            torch.testing.assert_close(rops.log_softmax(x, dim), torch.log_softmax(x, dim), atol=1e-5, rtol=1e-4)
    dispatcher("softmax").clear()
    rops.softmax(base, 1)  # a middle dim runs as rows of length 10 (moved to the last dim)
    assert set(dispatcher("softmax").served_by) == {(128, 10, "float32", False)}


def test_ops_use_the_dispatched_config() -> None:
    x = torch.randn(40, 300, device=DEV)
    key = (64, 300, "float32", True)
    dispatcher("softmax").memo[key] = {"variant": "looped", "BLOCK_N": 32, "ROWS": 1, "num_warps": 1, "num_stages": 1}
    torch.testing.assert_close(rops.log_softmax(x, 1), torch.log_softmax(x, 1), atol=1e-5, rtol=1e-4)
    assert dispatcher("softmax").memo_hits >= 1


def test_empty_and_scalar() -> None:
    assert rops.softmax(torch.empty(0, 5, device=DEV), 1).shape == (0, 5)
    assert rops.log_softmax(torch.empty(3, 0, device=DEV), 1).shape == (3, 0)
    s = torch.tensor(2.0, device=DEV)
    assert rops.softmax(s, 0).item() == 1.0 and rops.log_softmax(s, -1).item() == 0.0


def test_bad_inputs() -> None:
    x = torch.randn(4, 5, device=DEV)
    with pytest.raises(InvalidInputError, match="must be a tensor"):
        rops.softmax(x.tolist(), 0)
    with pytest.raises(InvalidInputError, match="dtype"):
        rops.softmax(x.double(), 0)
    with pytest.raises(InvalidInputError, match="dtype must be None"):
        rops.log_softmax(x, 0, dtype=torch.float64)
    with pytest.raises(InvalidInputError, match=r"dim must be in \[-2, 1\]"):
        rops.softmax(x, -3)
    with pytest.raises(InvalidInputError, match="dim must be an int"):
        rops.softmax(x, None)
    with pytest.raises(InvalidInputError, match="device"):
        rops.softmax(torch.empty(4, 5, device="meta"), 0)


def test_autograd_matches_torch() -> None:
    x = torch.randn(5, 9, device=DEV, requires_grad=True)
    g = torch.randn(5, 9, device=DEV)
    for dim in (0, 1):
        for fn, ref in ((rops.softmax, torch.softmax), (rops.log_softmax, torch.log_softmax)):
            (got,) = torch.autograd.grad(fn(x, dim), x, g)
            (want,) = torch.autograd.grad(ref(x, dim), x, g)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_torch_compile_fullgraph() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return rops.softmax(x, -1) + rops.log_softmax(x, 0).exp()

    x = torch.randn(4, 33, device=DEV)
    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    want = torch.softmax(x, -1) + torch.log_softmax(x, 0).exp()
    torch.testing.assert_close(compiled(x), want, atol=1e-5, rtol=1e-4)
