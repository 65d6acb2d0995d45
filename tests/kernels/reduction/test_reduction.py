"""Reductions (sum / mean / max): the kernels against fp64 torch, the space and heuristic, and the ops' contract."""

from __future__ import annotations

# First: it sets TRITON_INTERPRET without a GPU, and triton reads that when it is imported.
import tunekit.core.backend  # noqa: F401

# isort: split

import math
import random

import pytest
import torch
from fingerprints import H200, INTERPRETER
from kernel_checks import DEV, HERE, INTERPRETER_NOISE, assert_heuristic_valid, launch_poisoned

from tunekit.core.errors import InvalidConfigError, InvalidInputError, InvalidShapeError
from tunekit.core.spec import DTYPES
from tunekit.kernels.reduction import reduction as red
from tunekit.ops import reduction as rops
from tunekit.runtime.dispatch import dispatcher
from tunekit.search_spaces.reduction.reduction import SPACE
from tunekit.tuning.verify import check_outputs

pytestmark = INTERPRETER_NOISE

DTYPE_LIST = list(DTYPES.values())
# Op-level tolerances vs an fp64 reference rounded to the output dtype: fp32 accumulation, one output rounding.
TOL = {
    torch.float32: {"atol": 1e-4, "rtol": 1e-5},
    torch.float16: {"atol": 1e-3, "rtol": 2e-3},
    torch.bfloat16: {"atol": 8e-3, "rtol": 1.6e-2},
}


def _kernel_configs(problem: dict, count: int, seed: int = 0) -> list[dict]:
    """The heuristic, one config per variant and a few random valid ones (launch options aside)."""
    valid = SPACE.valid_configs(problem, HERE)
    distinct: dict[tuple, dict] = {}
    for c in valid:
        distinct.setdefault((c["variant"], c["BLOCK_M"], c["BLOCK_N"], c["SPLIT"]), c)
    picks = [red.heuristic(problem, HERE)]
    for variant in ("inner", "outer", "outer_split"):
        picks += [c for c in distinct.values() if c["variant"] == variant][:1]
    rng = random.Random(seed)
    picks += rng.sample(list(distinct.values()), min(count, len(distinct)))
    return picks


# --- kernels through the spec ------------------------------------------------------------------------------


KERNEL_CASES = [
    ("sum", "inner", (1, 1)),
    ("sum", "inner", (3, 1023)),
    ("mean", "inner", (5, 4097)),
    ("max", "inner", (7, 33)),
    ("max", "inner", (1, 300)),
    ("sum", "outer", (1, 1000, 3)),
    ("mean", "outer", (2, 37, 20)),
    ("max", "outer", (1, 100, 5)),
    ("max", "outer", (3, 64, 17)),
    ("sum", "outer", (1, 513, 1)),
]


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("op,axis,shape", KERNEL_CASES)
def test_kernel_configs_match_fp64_reference(op: str, axis: str, shape: tuple, dtype: str) -> None:
    problem = red.problem(op, axis, shape, dtype)
    x, _, _ = red.make_inputs(problem, DEV, seed=1)
    # make_inputs uses the bucketed size; cut to the exact (awkward) shape.
    inputs = (x[: shape[0]] if axis == "inner" else x[: shape[0], : shape[1]], op, axis)
    expected = red.reference(inputs)
    for config in _kernel_configs(problem, count=2):
        wrong = check_outputs(red.SPEC, launch_poisoned(red.SPEC, config, inputs), expected)
        assert wrong is None, f"{config}: {wrong}"


def test_split_is_deterministic_and_matches_plain_outer() -> None:
    problem = red.problem("sum", "outer", (1, 256, 40), "float32")
    inputs = red.make_inputs(problem, DEV, seed=3)
    base = {"BLOCK_N": 16, "num_warps": 1, "num_stages": 1}
    split = {**base, "variant": "outer_split", "BLOCK_M": 8, "SPLIT": 8}
    first, second = launch_poisoned(red.SPEC, split, inputs)[0], launch_poisoned(red.SPEC, split, inputs)[0]
    assert torch.equal(first, second)
    plain = launch_poisoned(red.SPEC, {**base, "variant": "outer", "BLOCK_M": 8, "SPLIT": 1}, inputs)[0]
    torch.testing.assert_close(first, plain, atol=1e-4, rtol=1e-5)


def test_wrong_config_for_axis_is_refused() -> None:
    inputs = red.make_inputs(red.problem("sum", "inner", (4, 16), "float32"), DEV, seed=0)
    config = {"variant": "outer", "BLOCK_M": 4, "BLOCK_N": 16, "SPLIT": 1, "num_warps": 1, "num_stages": 1}
    with pytest.raises(InvalidConfigError, match="cannot reduce axis"):
        red.launch(config, inputs, red.alloc_outputs(inputs))


def test_reference_catches_a_wrong_index() -> None:
    """The spec's tolerances must make an off-by-one index (float64 in the spec) fail."""
    problem = red.problem("max", "inner", (8, 1000), "float32")
    inputs = red.make_inputs(problem, DEV, seed=0)
    values, idx = red.reference(inputs)
    assert check_outputs(red.SPEC, (values, idx + 1), (values, idx)) is not None
    assert check_outputs(red.SPEC, (values, idx), (values, idx)) is None


# --- space, heuristic, spec --------------------------------------------------------------------------------


SWEEP_ROWS = [1, 2, 8, 64, 1024, 16384, 1 << 20, 1 << 24]
SWEEP_COLS = [1, 3, 7, 16, 100, 1023, 4096, 4097, 65536, 1 << 20]


@pytest.mark.parametrize("device", [INTERPRETER, H200], ids=["interpreter", "h200"])
@pytest.mark.parametrize("axis", ["inner", "outer"])
def test_heuristic_always_valid(device, axis: str) -> None:
    for op in red.OPS:
        for dtype in DTYPES:
            for batch in [1, 4, 1024] if axis == "outer" else [1]:
                for rows in SWEEP_ROWS:
                    for cols in SWEEP_COLS:
                        p = {"op": op, "axis": axis, "batch": batch, "rows": rows, "cols": cols, "dtype": dtype}
                        assert_heuristic_valid(red.SPEC, p, device)


def test_heuristic_splits_tall_skinny_outer_on_gpu_only() -> None:
    p = red.problem("sum", "outer", (1, 1 << 20, 16), "float32")
    assert red.heuristic(p, H200)["variant"] == "outer_split"
    assert red.heuristic(p, INTERPRETER)["variant"] == "outer"
    assert red.heuristic(red.problem("sum", "outer", (1, 4096, 16384), "float32"), H200)["variant"] == "outer"


def test_rules_tie_variant_to_axis_and_split() -> None:
    p = red.problem("sum", "outer", (1, 4096, 64), "float16")
    good = {"variant": "outer", "BLOCK_M": 64, "BLOCK_N": 64, "SPLIT": 1, "num_warps": 4, "num_stages": 2}
    assert SPACE.is_valid(good, p, H200)
    assert "variant_matches_axis" in SPACE.violations({**good, "variant": "inner"}, p, H200)
    assert "split_only_in_outer_split" in SPACE.violations({**good, "SPLIT": 4}, p, H200)
    assert "split_only_in_outer_split" in SPACE.violations({**good, "variant": "outer_split"}, p, H200)
    assert "block_m_within_rows" in SPACE.violations({**good, "variant": "outer_split", "SPLIT": 128}, p, H200)
    assert "outer_block_n_coalesced" in SPACE.violations({**good, "BLOCK_N": 4, "BLOCK_M": 1024}, p, H200)
    inner = red.problem("sum", "inner", (4096, 100), "float16")
    assert "block_n_within_cols" in SPACE.violations({**good, "variant": "inner", "BLOCK_N": 256}, inner, H200)


def test_every_valid_config_set_is_nonempty_for_default_problems() -> None:
    for device in (INTERPRETER, H200):
        for p in red.default_problems(device):
            assert SPACE.valid_configs(p, device), p
            assert set(p) == set(red.SPEC.problem_fields)


def test_interpreter_default_problems_are_tiny() -> None:
    assert all(int(p["rows"]) * int(p["cols"]) * int(p["batch"]) <= 1 << 16 for p in red.default_problems(INTERPRETER))


def test_problem_from_shape() -> None:
    assert red.problem_from_shape((1000, 4097), "float16") == {
        "op": "sum", "axis": "inner", "batch": 1, "rows": 1024, "cols": 4097, "dtype": "float16",
    }  # fmt: skip
    assert red.problem_from_shape((3, 1000, 7), "float32")["axis"] == "outer"
    with pytest.raises(InvalidShapeError, match="MxN"):
        red.problem_from_shape((5,), "float32")
    with pytest.raises(InvalidShapeError, match=">= 1"):
        red.problem_from_shape((0, 5), "float32")
    with pytest.raises(InvalidInputError, match="dtype"):
        red.problem_from_shape((4, 5), "float64")


# --- ops against torch -------------------------------------------------------------------------------------


def _unique_max_input(shape: tuple, dim: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Values with one unique maximum along `dim`: a random permutation plants the max at a random position."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).clamp_(-4, 4)
    if x.dim() > 0 and x.shape[dim] > 0:
        n = x.shape[dim]
        order = torch.stack([torch.randperm(n, generator=g) for _ in range(x.numel() // n)])  # [lines, n]
        moved = x.movedim(dim, -1).contiguous()
        flat = moved.reshape(-1, n)
        flat.scatter_(1, order[:, :1], flat.amax(dim=1, keepdim=True) + 1.0)
        x = moved.movedim(-1, dim)
    return (x + 0.5).to(dtype).to(DEV)


OP_SHAPES = [(1, 1), (1, 7), (3, 1023), (5, 4097), (1000, 3), (2, 3, 5)]


def _dims(shape: tuple) -> list[int]:
    return [*range(len(shape)), -1]


@pytest.mark.parametrize("dtype", DTYPE_LIST, ids=str)
@pytest.mark.parametrize("shape", OP_SHAPES, ids=str)
def test_ops_match_torch(shape: tuple, dtype: torch.dtype) -> None:
    for dim in _dims(shape):
        x = _unique_max_input(shape, dim, dtype, seed=len(shape) + dim)
        xd = x.double()
        for keepdim in (False, True):
            got = rops.sum(x, dim, keepdim)
            torch.testing.assert_close(got, xd.sum(dim, keepdim).to(dtype), **TOL[dtype])
            assert got.dtype == dtype and got.shape == torch.sum(x, dim, keepdim).shape
            torch.testing.assert_close(rops.mean(x, dim, keepdim), xd.mean(dim, keepdim).to(dtype), **TOL[dtype])
            got_max = rops.max(x, dim, keepdim)
            want = torch.max(xd, dim, keepdim)
            assert isinstance(got_max, torch.return_types.max)
            torch.testing.assert_close(got_max.values, want.values.to(dtype), atol=0, rtol=0)
            assert got_max.indices.dtype == torch.int64
            assert torch.equal(got_max.indices, want.indices)


def test_ops_route_to_the_expected_kernel_family() -> None:
    x = torch.randn(6, 10, 12, device=DEV)
    rops.sum(x, -1)
    rops.sum(x, 1)
    rops.sum(x, 0)
    rops.max(x.reshape(-1), 0)
    served = set(dispatcher("reduction").served_by)
    assert ("sum", "inner", 1, 64, 12, "float32") in served  # last dim: [60, 12]
    assert ("sum", "outer", 8, 16, 12, "float32") in served  # middle dim: batch 6 of [10, 12]
    assert ("sum", "outer", 1, 8, 120, "float32") in served  # dim 0: [6, 120]
    assert ("max", "outer", 1, 1024, 1, "float32") in served  # a whole vector: [720, 1]


def test_ops_use_the_dispatched_config() -> None:
    """A config planted in the memo is the one launched: a split config must still give the right answer."""
    x = torch.randn(300, 24, device=DEV)
    key = ("sum", "outer", 1, 512, 24, "float32")
    config = {"variant": "outer_split", "BLOCK_M": 4, "BLOCK_N": 16, "SPLIT": 16, "num_warps": 1, "num_stages": 1}
    dispatcher("reduction").memo[key] = config
    torch.testing.assert_close(rops.sum(x, 0), x.double().sum(0).float(), atol=1e-4, rtol=1e-5)
    # A config for the wrong family proves the memo entry is what the op runs.
    dispatcher("reduction").memo[key] = {**config, "variant": "inner", "SPLIT": 1}
    with pytest.raises(InvalidConfigError):
        rops.sum(x, 0)


def test_max_ties_give_the_first_index() -> None:
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 5.0, 5.0], [0.0, -0.0, 0.0, -1.0]], device=DEV)
    for dim in (0, 1):
        for dtype in DTYPE_LIST:
            got = rops.max(x.to(dtype), dim)
            assert torch.equal(got.indices, torch.max(x.to(dtype).cpu(), dim).indices.to(DEV)), (dim, dtype)
    # Ties 2048 and 4096 apart land in the same lane of every power-of-two block: the lane must keep the first.
    wide = torch.zeros(3, 6000, device=DEV)
    wide[:, [1000, 3048, 5096]] = 1.0
    assert rops.max(wide, 1).indices.tolist() == [1000] * 3
    assert rops.max(wide.t().contiguous(), 0).indices.tolist() == [1000] * 3
    assert rops.max(wide.reshape(-1), 0).indices.item() == 1000


def test_max_propagates_nan_with_the_first_nan_index() -> None:
    nan, inf = math.nan, math.inf
    x = torch.tensor([[1.0, nan, 3.0, nan], [-inf, -inf, -inf, -inf], [2.0, inf, nan, 1.0]], device=DEV)
    # NaNs 2048 and 4096 apart fall in the same lane of every power-of-two block: the first must stay.
    wide = torch.randn(3, 6000, device=DEV)
    wide[:, [1000, 3048, 5096]] = nan
    for dim, xx in ((1, x), (0, x.t().contiguous()), (1, wide), (0, wide.t().contiguous())):
        got, want = rops.max(xx, dim), torch.max(xx.cpu(), dim)
        torch.testing.assert_close(got.values.cpu(), want.values, equal_nan=True)
        assert torch.equal(got.indices.cpu(), want.indices)


@pytest.mark.parametrize("split,block_m", [(2, 8), (4, 4), (8, 2)])
def test_split_max_ties_nan_and_all_minus_inf_columns(split: int, block_m: int) -> None:
    """The split's second pass must keep torch's index across splits: ties, NaNs, and a column of only -inf."""
    x = torch.randn(2, 64, 5, device=DEV)
    x[:, :, 0] = -math.inf
    x[:, [3, 40, 41], 1] = 9.0  # a tie across splits
    x[:, [20, 50], 2] = math.nan
    x[:, [60, 61], 3] = math.inf
    config = {"variant": "outer_split", "BLOCK_M": block_m, "BLOCK_N": 8, "SPLIT": split}
    values, indices = launch_poisoned(red.SPEC, {**config, "num_warps": 1, "num_stages": 1}, (x, "max", "outer"))
    want = torch.max(x.cpu(), 1)
    torch.testing.assert_close(values.cpu(), want.values, equal_nan=True)
    assert torch.equal(indices.cpu().long(), want.indices)


def test_sum_and_mean_with_dtype_argument() -> None:
    x = torch.randn(7, 300, device=DEV).to(torch.float16)
    got = rops.sum(x, 1, dtype=torch.float32)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, x.double().sum(1).float(), atol=1e-4, rtol=1e-5)
    narrow = rops.mean(x.float(), 0, dtype=torch.bfloat16)
    assert narrow.dtype == torch.bfloat16
    torch.testing.assert_close(narrow, torch.mean(x.float(), 0, dtype=torch.bfloat16), **TOL[torch.bfloat16])


def test_multi_dim_and_full_reductions() -> None:
    x = torch.randn(4, 5, 6, device=DEV)
    torch.testing.assert_close(rops.sum(x, (1, 2)), x.sum((1, 2)), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(rops.mean(x, [-1, -2], keepdim=True), x.mean((-1, -2), keepdim=True))
    torch.testing.assert_close(rops.sum(x, None), x.sum(), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(rops.mean(x, ()), x.mean(()))
    s = torch.tensor(2.5, device=DEV)
    assert rops.sum(s, 0).shape == () and rops.sum(s, -1, keepdim=True).item() == 2.5
    assert rops.max(s, 0).indices.item() == 0


def test_non_contiguous_inputs() -> None:
    base = torch.randn(8, 6, 10, device=DEV)
    cases = [base.transpose(0, 2), base.permute(1, 2, 0), base[:, ::2, 1:], base[::3], base[:, :, 2:7]]
    for x in cases:
        for dim in range(x.dim()):
            torch.testing.assert_close(rops.sum(x, dim), x.double().sum(dim).float(), atol=1e-4, rtol=1e-5)
            got, want = rops.max(x, dim, keepdim=True), torch.max(x, dim, keepdim=True)
            assert torch.equal(got.values, want.values) and torch.equal(got.indices, want.indices)
    t = torch.randn(50, 33, device=DEV).t()
    torch.testing.assert_close(rops.mean(t, 1), t.mean(1))


def test_empty_tensors() -> None:
    e = torch.empty(3, 0, device=DEV)
    assert torch.equal(rops.sum(e, 1), torch.zeros(3, device=DEV))
    assert rops.mean(e, 1).isnan().all() and rops.mean(e, 1).shape == (3,)
    assert rops.sum(e, 0).shape == (0,) and rops.sum(e, 0, keepdim=True).shape == (1, 0)
    assert rops.max(torch.empty(0, 4, device=DEV), 1).values.shape == (0,)
    with pytest.raises(InvalidInputError, match="non-empty"):
        rops.max(e, 1)


def test_bad_inputs() -> None:
    x = torch.randn(4, 5, device=DEV)
    with pytest.raises(InvalidInputError, match="must be a tensor"):
        rops.sum([1.0, 2.0], 0)
    with pytest.raises(InvalidInputError, match="dtype"):
        rops.sum(x.double(), 0)
    with pytest.raises(InvalidInputError, match="dtype"):
        rops.max(x.to(torch.int32), 0)
    with pytest.raises(InvalidInputError, match="dtype must be None"):
        rops.sum(x, 0, dtype=torch.int64)
    with pytest.raises(InvalidInputError, match=r"dim must be in \[-2, 1\]"):
        rops.mean(x, 2)
    with pytest.raises(InvalidInputError, match="dim must be an int"):
        rops.max(x, (0,))
    with pytest.raises(InvalidInputError, match="dim must be an int"):
        rops.sum(x, 1.0)
    with pytest.raises(InvalidInputError, match="dim must be an int"):
        rops.sum(x, True)
    with pytest.raises(InvalidInputError, match="adjacent"):
        rops.sum(torch.randn(2, 3, 4, device=DEV), (0, 2))
    with pytest.raises(InvalidInputError, match="once"):
        rops.sum(x, (1, -1))
    with pytest.raises(InvalidInputError, match="device"):
        rops.sum(torch.empty(4, 5, device="meta"), 0)


def test_autograd_matches_torch() -> None:
    x = torch.randn(5, 7, device=DEV, requires_grad=True)
    g = torch.randn(5, device=DEV)
    for fn, ref in ((rops.sum, torch.sum), (rops.mean, torch.mean)):
        (got,) = torch.autograd.grad(fn(x, 1), x, g)
        (want,) = torch.autograd.grad(ref(x, 1), x, g)
        torch.testing.assert_close(got, want)
    (got,) = torch.autograd.grad(rops.max(x, 1).values, x, g)
    (want,) = torch.autograd.grad(torch.max(x, 1).values, x, g)
    torch.testing.assert_close(got, want)


@pytest.mark.usefixtures("swapped_under_compile")
def test_torch_compile_fullgraph() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        m = rops.max(x, 0)
        return rops.sum(x, -1, keepdim=True).squeeze(-1) + rops.mean(x, 1) + m.values[:1] + m.indices[:1]

    x = torch.randn(3, 17, device=DEV)
    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), fn(x))
    m = torch.max(x, 0)
    want = x.sum(-1) + x.mean(1) + m.values[:1] + m.indices[:1]
    torch.testing.assert_close(compiled(x), want, atol=1e-4, rtol=1e-5)


def test_exported_names() -> None:
    assert set(rops.__all__) == {"sum", "mean", "max"}
    assert all(callable(getattr(rops, name)) for name in rops.__all__)
