"""RMSNorm forward and backward: the kernels against torch (float64 autograd for gradients), their spaces and
heuristics, their SPECs; and tunekit.ops.rms_norm as a drop-in for torch.nn.functional.rms_norm in training."""

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
from kernel_checks import assert_heuristic_valid_on_grid

import tunekit.ops.norms as norm_ops
from tunekit.core.device import fingerprint
from tunekit.core.errors import InvalidInputError, InvalidShapeError
from tunekit.core.spec import DTYPE_NAMES, DTYPES, row_bucket
from tunekit.kernels.norms import rmsnorm as rms
from tunekit.kernels.norms import rmsnorm_backward as rmsb
from tunekit.runtime.dispatch import dispatcher

INTERP = fingerprint()
DEVICES = (INTERP, H200)
CPU = torch.device("cpu")
SHAPES = [(1, 1), (3, 7), (5, 1023), (2, 4097)]
TORCH_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _problem(m: int, n: int, dtype: str, weight: bool = True) -> dict:
    return {"rows": row_bucket(m), "cols": n, "dtype": dtype, "weight": weight}


def _check(spec, config: dict, inputs: tuple) -> None:
    outputs = spec.alloc_outputs(inputs)
    for out in outputs:
        out.fill_(math.nan)  # poisoned: an element the kernels skip stays NaN and fails the check
    spec.launch(config, inputs, outputs)
    expected = spec.reference(inputs)
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        tol = spec.tolerances[DTYPE_NAMES[got.dtype]]
        torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol, msg=lambda m: f"{config}: {m}")


def _forward_inputs(m: int, n: int, dtype: str, weight: bool = True, seed: int = 0) -> tuple:
    x, w, eps = rms.make_inputs(_problem(m, n, dtype, weight), CPU, seed)
    return (x[:m], w, eps)


def _backward_inputs(m: int, n: int, dtype: str, weight: bool = True, seed: int = 0) -> tuple:
    x, dy, w, want_dw, eps = rmsb.make_inputs(_problem(m, n, dtype, weight), CPU, seed)
    return (x[:m], dy[:m], w, want_dw, eps)


def _spread(configs: list[dict], count: int) -> list[dict]:
    if len(configs) <= count:
        return configs
    return [configs[round(i * (len(configs) - 1) / (count - 1))] for i in range(count)]


def _kernel_shapes(spec, problem: dict, fields: tuple[str, ...]) -> list[dict]:
    """One valid config per distinct kernel and layout: launch options don't change results."""
    seen: dict[tuple, dict] = {}
    for config in spec.space.valid_configs(problem, INTERP):
        seen.setdefault(tuple(config[f] for f in fields), config)
    return list(seen.values())


# --- both kernels ------------------------------------------------------------------------------------------

BOTH_KERNELS = pytest.mark.parametrize("spec", [rms.SPEC, rmsb.SPEC], ids=lambda s: s.name)
INPUTS = {rms.SPEC.name: _forward_inputs, rmsb.SPEC.name: _backward_inputs}


@pytest.mark.parametrize("weight", [True, False])
@pytest.mark.parametrize("m,n", SHAPES)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@BOTH_KERNELS
def test_heuristic_config_matches_torch(spec, dtype: str, m: int, n: int, weight: bool) -> None:
    _check(spec, spec.heuristic(_problem(m, n, dtype, weight), INTERP), INPUTS[spec.name](m, n, dtype, weight))


# --- forward kernel ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("m,n", [(17, 300), (5, 4097)])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_forward_configs_across_the_space_match_torch(dtype: str, m: int, n: int) -> None:
    configs = _kernel_shapes(rms.SPEC, _problem(m, n, dtype), ("variant", "BLOCK_N", "ROWS"))
    inputs = _forward_inputs(m, n, dtype)
    # The window variant is offered where rows are no whole number of 16-byte vectors (all but 300 fp32).
    unaligned = n * DTYPES[dtype].itemsize % 16 != 0
    for variant in ("single", "looped") + (("window",) if unaligned else ()):
        chosen = _spread([c for c in configs if c["variant"] == variant], 4)
        assert chosen
        for config in chosen:
            _check(rms.SPEC, config, inputs)


def test_forward_window_leaves_the_neighbours_of_each_row_untouched() -> None:
    m, n, pad = 9, 21, 5
    x_buf, y_buf = torch.randn(m, n + pad).to(torch.bfloat16), torch.full((m, n + pad), -3.0, dtype=torch.bfloat16)
    x, y, w = x_buf[:, :n], y_buf[:, :n], torch.randn(n).to(torch.bfloat16)
    config = {"variant": "window", "BLOCK_N": 32, "ROWS": 4, "num_warps": 2, "num_stages": 1}
    rms.launch(config, (x, w, 1e-6), (y,))
    (expected,) = rms.reference((x, w, 1e-6))
    torch.testing.assert_close(y, expected, atol=2e-2, rtol=2e-2)
    assert torch.equal(y_buf[:, n:], torch.full((m, pad), -3.0, dtype=torch.bfloat16))


def test_forward_reference_is_torchs_rms_norm() -> None:
    x, w, eps = _forward_inputs(6, 40, "float32")
    (expected,) = rms.reference((x, w, eps))
    torch.testing.assert_close(expected, F.rms_norm(x.double(), (40,), w.double(), eps).float())
    (baseline,) = rms.torch_baseline((x, w, eps))
    torch.testing.assert_close(baseline, expected)


# --- backward kernel ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("m,n", [(17, 300), (2, 4097)])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_backward_configs_across_the_space_match_torch(dtype: str, m: int, n: int) -> None:
    fields = ("variant", "BLOCK_N", "ROWS", "PROGRAMS_PER_SM")
    configs = _kernel_shapes(rmsb.SPEC, _problem(m, n, dtype), fields)
    inputs = _backward_inputs(m, n, dtype)
    for variant in ("single", "looped"):
        chosen = _spread([c for c in configs if c["variant"] == variant], 4)
        assert chosen
        for config in chosen:
            _check(rmsb.SPEC, config, inputs)


@pytest.mark.parametrize("variant,block_n", [("single", 512), ("looped", 64)])
def test_backward_with_a_weight_that_needs_no_gradient(variant: str, block_n: int) -> None:
    x, dy, w, _, eps = _backward_inputs(9, 300, "float16")
    config = {"variant": variant, "BLOCK_N": block_n, "ROWS": 1, "PROGRAMS_PER_SM": 4, "num_warps": 2, "num_stages": 1}
    _check(rmsb.SPEC, config, (x, dy, w, False, eps))  # dx still scales by the weight; no dweight output


def test_backward_reference_is_torch_autograd() -> None:
    inputs = _backward_inputs(4, 24, "float32")
    x, dy, w, _, eps = inputs
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    F.rms_norm(x64, (24,), w64, eps).backward(dy.double())
    dx, dw = rmsb.reference(inputs)
    torch.testing.assert_close(dx, x64.grad.float())
    torch.testing.assert_close(dw, w64.grad.float())
    for got, want in zip(rmsb.torch_baseline(inputs), (dx, dw)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


# --- spaces and heuristics ---------------------------------------------------------------------------------

SWEEP_COLS = [1, 2, 3, 7, 16, 17, 100, 256, 257, 768, 1000, 1023, 2049, 4096, 4097, 8191, 8193, 16384, 25600]
SWEEP_COLS += [32769, 65536, 100_000, 1 << 20, 3_000_000]
SWEEP_ROWS = [1 << e for e in range(22)]


@BOTH_KERNELS
@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.name)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_heuristics_are_valid_for_every_problem(spec, device, dtype: str) -> None:
    for weight in (True, False):
        assert_heuristic_valid_on_grid(spec, device, SWEEP_ROWS, SWEEP_COLS, dtype=dtype, weight=weight)


@BOTH_KERNELS
def test_gpu_problems_have_an_exhaustively_searchable_space(spec) -> None:
    for problem in spec.default_problems(H200):
        count = len(spec.space.valid_configs(problem, H200))
        assert 1 <= count <= 300, (problem, count)


# --- SPECs -------------------------------------------------------------------------------------------------


@BOTH_KERNELS
def test_spec_declarations(spec) -> None:
    assert spec.problem_fields == ("rows", "cols", "dtype", "weight")
    assert set(spec.tolerances) == set(DTYPES) and re.fullmatch(r"\d+\.[0-9a-f]{16}\.[0-9a-f]{8}", spec.source_hash)
    assert spec.torch_baseline is not None
    problem = spec.problem_from_shape((3000, 1024), "bfloat16")
    assert problem == {"rows": 4096, "cols": 1024, "dtype": "bfloat16", "weight": True}
    assert spec.bytes_moved({**problem, "weight": False}) == (2 if spec is rms.SPEC else 3) * 4096 * 1024 * 2
    interp = spec.default_problems(INTERP)
    assert interp and sum(int(p["rows"]) * int(p["cols"]) for p in interp) <= 50_000
    gpu = spec.default_problems(H200)
    assert 4 <= len(gpu) <= 6 and {p["dtype"] for p in gpu} == {"float16", "bfloat16"}
    a, b, c = (spec.make_inputs(problem | {"rows": 8, "cols": 64}, CPU, s) for s in (7, 7, 8))
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0]) and bool((a[0] != 0).any())


@BOTH_KERNELS
@pytest.mark.parametrize(
    "shape,dtype,error,message",
    [
        ((4096,), "float16", InvalidShapeError, "2-D shape MxN"),
        ((0, 8), "float16", InvalidShapeError, ">= 1"),
        ((8, 8), "float64", InvalidInputError, r"\['bfloat16', 'float16', 'float32'\].*'float64'"),
    ],
)
def test_problem_from_shape_rejects_bad_shapes(spec, shape: tuple, dtype: str, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        spec.problem_from_shape(shape, dtype)


# --- tunekit.ops.rms_norm ----------------------------------------------------------------------------------

OP_TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 2e-2)}


def _torch_rms(x, normalized, w, dy, eps):
    """torch's RMSNorm forward and gradients on float64 copies of the leaves that require grad."""
    leaves = [None if t is None else t.detach().double().requires_grad_(t.requires_grad) for t in (x, w)]
    y = F.rms_norm(leaves[0], normalized, leaves[1], eps)
    y.backward(dy.double())
    return y.detach(), [None if t is None else t.grad for t in leaves]


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape,normalized",
    [*(((m, n), (n,)) for m, n in SHAPES), ((2, 3, 33), (33,)), ((4, 3, 5), (3, 5))],
)
def test_rms_norm_trains_like_torch(dtype: torch.dtype, shape: tuple, normalized: tuple) -> None:
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 2 + 0.5).to(dtype).requires_grad_()
    w = (1 + 0.1 * torch.randn(normalized, generator=g)).to(dtype).requires_grad_()
    dy = torch.randn(shape, generator=g).to(dtype)
    y = norm_ops.rms_norm(x, normalized, w, 1e-6)
    y.backward(dy)
    y_ref, (dx_ref, dw_ref) = _torch_rms(x, normalized, w, dy, 1e-6)
    atol, rtol = OP_TOL[dtype]
    assert y.dtype == x.grad.dtype == w.grad.dtype == dtype and y.shape == x.shape
    torch.testing.assert_close(y.detach().double(), y_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(x.grad.double(), dx_ref, atol=atol, rtol=rtol)
    torch.testing.assert_close(w.grad.double(), dw_ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
def test_default_eps_is_torchs(dtype: torch.dtype) -> None:
    """eps=None means finfo(dtype).eps, as torch: on inputs with mean(x²) near it, any other eps shows."""
    x = (0.03 * torch.randn(4, 64, generator=torch.Generator().manual_seed(2))).to(dtype)
    y = norm_ops.rms_norm(x, (64,))
    expected = F.rms_norm(x.double(), (64,), eps=torch.finfo(dtype).eps)
    atol, rtol = OP_TOL[dtype]
    torch.testing.assert_close(y.double(), expected, atol=atol, rtol=rtol)
    assert not torch.allclose(y.double(), F.rms_norm(x.double(), (64,), eps=1e-6), atol=atol, rtol=rtol)


def test_without_weight_and_with_a_frozen_weight() -> None:
    x = torch.randn(5, 40, requires_grad=True)
    dy = torch.randn(5, 40)
    norm_ops.rms_norm(x, 40).backward(dy)
    dx_ref = _torch_rms(x, (40,), None, dy, torch.finfo(torch.float32).eps)[1][0]
    torch.testing.assert_close(x.grad.double(), dx_ref, atol=1e-5, rtol=1e-5)
    x.grad = None
    w = torch.rand(40) + 0.5  # frozen: scales dx, gets no gradient
    norm_ops.rms_norm(x, [40], w, 1e-5).backward(dy)
    torch.testing.assert_close(x.grad.double(), _torch_rms(x, (40,), w, dy, 1e-5)[1][0], atol=1e-5, rtol=1e-5)
    assert dispatcher("rmsnorm_backward").memo.keys() == {(8, 40, "float32", False), (8, 40, "float32", True)}


def test_strided_input_broadcast_gradient_and_empty_input() -> None:
    x = torch.randn(24, 9).t().requires_grad_()
    w = torch.rand(24, requires_grad=True)
    norm_ops.rms_norm(x, 24, w, 1e-6).sum().backward()
    _, (dx_ref, dw_ref) = _torch_rms(x, (24,), w, torch.ones(9, 24), 1e-6)
    torch.testing.assert_close(x.grad.double(), dx_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(w.grad.double(), dw_ref, atol=1e-5, rtol=1e-5)
    empty = torch.randn(0, 8, requires_grad=True)
    w8 = torch.ones(8, requires_grad=True)
    y = norm_ops.rms_norm(empty, (8,), w8)
    y.sum().backward()
    assert y.shape == empty.grad.shape == (0, 8) and torch.equal(w8.grad, torch.zeros(8))


def test_eager_path_without_grad_skips_autograd() -> None:
    x = torch.randn(3, 8)
    w = torch.ones(8, requires_grad=True)
    assert norm_ops.rms_norm(x, (8,), w).grad_fn is not None
    assert norm_ops.rms_norm(x, (8,)).grad_fn is None
    with torch.no_grad():
        assert norm_ops.rms_norm(x, (8,), w).grad_fn is None


def test_custom_ops_pass_opcheck() -> None:
    x, w = torch.randn(3, 8, requires_grad=True), torch.randn(8, requires_grad=True)
    torch.library.opcheck(torch.ops.tunekit.rms_norm.default, (x, [8], w, 1e-6))
    args = (torch.randn(3, 8), x.detach(), w.detach(), [8], 1e-6, True)
    torch.library.opcheck(torch.ops.tunekit.rms_norm_backward.default, args)


def test_compiled_training_step() -> None:
    w = torch.nn.Parameter(torch.rand(16) + 0.5)

    def step(x: torch.Tensor) -> torch.Tensor:
        return norm_ops.rms_norm(x, (16,), w).pow(2).sum()

    x = torch.randn(3, 16, requires_grad=True)
    torch.compile(step, fullgraph=True, backend="eager")(x).backward()
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    F.rms_norm(x64, (16,), w64, torch.finfo(torch.float32).eps).pow(2).sum().backward()
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(w.grad.double(), w64.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: norm_ops.rms_norm(torch.randn(2, 8, dtype=torch.float64), (8,)), "input dtype must be one of"),
        (lambda: norm_ops.rms_norm(torch.randn(2, 8), (8,), torch.randn(7)), "weight must have shape"),
        (lambda: norm_ops.rms_norm(torch.randn(2, 8), (4,)), "must match the trailing dims"),
        (lambda: norm_ops.rms_norm(torch.randn(2, 8), (8,), eps="small"), "eps must be a Python float"),
        (lambda: norm_ops.rms_norm(torch.randn(2, 8, device="meta"), (8,)), "must be on the kernel's device"),
        (lambda: norm_ops.rms_norm((1.0, 2.0), (2,)), "input must be a tensor"),
    ],
)
def test_bad_inputs_are_refused_clearly(call, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        call()
