"""The fused pointwise kernel and its ops against torch in float64: every activation x dtype x awkward shape,
with and without bias/residual, the nine-op gelu_tanh chain, several configs of both variants, the int64 path,
heuristic validity, the custom ops under torch.compile, and bad inputs."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Iterator

import pytest
import torch
import torch.nn.functional as F
from fingerprints import H200
from kernel_checks import assert_heuristic_valid

from tunekit.core.device import fingerprint
from tunekit.core.errors import InvalidInputError, InvalidShapeError
from tunekit.core.spec import DTYPE_NAMES, row_bucket
from tunekit.kernels.pointwise import pointwise as pw
from tunekit.ops.pointwise import bias_act, bias_act_residual, gelu
from tunekit.runtime.dispatch import dispatcher
from tunekit.search_spaces.pointwise.pointwise import ACTIVATIONS, SPACE

SPEC = pw.SPEC
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# 1, primes, 2^k +- 1, a 3-D shape with an odd last dim, tall-skinny.
SHAPES = ((1,), (7,), (1023,), (4097,), (3, 5, 17), (1000, 3))

TORCH_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda v: v,
    "relu": torch.relu,
    "gelu": F.gelu,
    "gelu_tanh": functools.partial(F.gelu, approximate="tanh"),
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}


def reference64(
    x: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    activation: str,
    scale: float = 1.0,
) -> torch.Tensor:
    """torch's ops in float64, rounded once to x's dtype."""
    v = x.double() * scale
    if bias is not None:
        v = v + bias.double()
    v = TORCH_ACTIVATIONS[activation](v)
    if residual is not None:
        v = v + residual.double()
    return v.to(x.dtype)


def assert_matches(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, what
    tol = SPEC.tolerances[DTYPE_NAMES[want.dtype]]
    torch.testing.assert_close(got, want, atol=tol.atol, rtol=tol.rtol, equal_nan=True, msg=lambda m: f"{what}: {m}")


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0, std: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (std * torch.randn(*shape, generator=g)).to(dtype)


def operands(
    shapes: Iterable[tuple[int, ...]], dtype: torch.dtype
) -> Iterator[tuple[tuple[int, ...], torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per shape: (shape, input, bias over its last dim, residual), seeded by the shape's position."""
    for i, shape in enumerate(shapes):
        yield (
            shape,
            randn(*shape, dtype=dtype, seed=i),
            randn(shape[-1], dtype=dtype, seed=100 + i, std=0.5),
            randn(*shape, dtype=dtype, seed=200 + i, std=1.0),
        )


def nine_op_gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """The classic eager chain, literally: nine separate ops."""
    cube = x * x  # 1
    cube = cube * x  # 2
    inner = cube * 0.044715  # 3
    inner = x + inner  # 4
    inner = inner * math.sqrt(2.0 / math.pi)  # 5
    t = torch.tanh(inner)  # 6
    t = 1.0 + t  # 7
    half = 0.5 * x  # 8
    return half * t  # 9


# ---------------------------------------------------------------------------------------------- ops vs torch


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: DTYPE_NAMES[d])
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_activation_matches_float64(activation: str, dtype: torch.dtype) -> None:
    for shape, x, b, r in operands(SHAPES, dtype):
        for bias in (None, b):
            what = f"{activation} {shape} bias={bias is not None}"
            assert_matches(bias_act(x, bias, activation), reference64(x, bias, None, activation), what)
            got = bias_act_residual(x, bias, r, activation)
            assert_matches(got, reference64(x, bias, r, activation), what + " residual")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: DTYPE_NAMES[d])
def test_gelu_matches_torch(dtype: torch.dtype) -> None:
    x = randn(3, 5, 17, dtype=dtype)
    assert_matches(gelu(x), F.gelu(x.double()).to(dtype))
    assert_matches(gelu(x, approximate="tanh"), F.gelu(x.double(), approximate="tanh").to(dtype))
    assert_matches(gelu(x, "none"), F.gelu(x.double()).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: DTYPE_NAMES[d])
def test_gelu_tanh_is_the_nine_op_chain(dtype: torch.dtype) -> None:
    # Random values plus a dense sweep through both tails and the bend.
    x = torch.cat([randn(4097, dtype=dtype), torch.linspace(-12.0, 12.0, 2001).to(dtype)])
    chain = nine_op_gelu_tanh(x.double())
    torch.testing.assert_close(chain, F.gelu(x.double(), approximate="tanh"), atol=1e-12, rtol=1e-12)
    assert_matches(gelu(x, approximate="tanh"), chain.to(dtype), "fused vs nine-op chain")
    assert_matches(bias_act(x, None, "gelu_tanh"), chain.to(dtype), "bias_act vs nine-op chain")


def test_gelu_tanh_keeps_relative_precision_in_the_negative_tail() -> None:
    # 1 + tanh(z) cancels here; the kernel's sigmoid form must not (the nine-op chain in fp32 does).
    x = torch.linspace(-8.0, -2.0, 601)
    x64 = x.double()
    exact = x64 * torch.sigmoid(2.0 * math.sqrt(2.0 / math.pi) * (x64 + 0.044715 * x64**3))
    torch.testing.assert_close(gelu(x, approximate="tanh").double(), exact, atol=0.0, rtol=2e-5)


def test_tanh_keeps_relative_precision_near_zero() -> None:
    # 2*sigmoid(2v) - 1 would be off by ~1e-7 absolute, i.e. 100% relative at 1e-7.
    x = torch.cat([torch.logspace(-8, 0, 400), -torch.logspace(-8, 0, 400)])
    torch.testing.assert_close(bias_act(x, None, "tanh").double(), torch.tanh(x.double()), atol=0.0, rtol=2e-6)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, in the interpreter, on inf * 0 and the like
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_special_values_follow_torch(activation: str) -> None:
    inf, nan = math.inf, math.nan
    values = [0.0, -0.0, 1e-30, -1e-30, 1e-4, -1e-4, 0.6, -0.65, 5.0, -5.0, 20.0, -20.0, 90.0, -90.0, 1e4, -1e4]
    x = torch.tensor([*values, 3e38, -3e38, inf, -inf, nan])
    got = bias_act(x, None, activation)
    want = TORCH_ACTIVATIONS[activation](x.double()).float()
    assert torch.equal(torch.isnan(got), torch.isnan(want)), (got, want)
    assert_matches(got, want, activation)


def test_scale_and_strided_inputs() -> None:
    base = randn(40, 34)
    x = base[:, 1:33:2]  # strided rows and columns: [40, 16]
    xt = randn(16, 40, seed=1).t()  # transposed: [40, 16]
    bias = randn(32, seed=2)[::2]  # stride 2
    residual = randn(16, 40, seed=3).t()
    for inp in (x, xt):
        got = bias_act_residual(inp, bias, residual, "silu", scale=0.375)
        assert got.is_contiguous()
        assert_matches(got, reference64(inp, bias, residual, "silu", 0.375))
    assert_matches(bias_act(x, bias, "gelu", scale=-2), reference64(x, bias, None, "gelu", -2.0))


def test_zero_dim_input() -> None:
    x = torch.tensor(0.75)
    assert_matches(gelu(x), F.gelu(x.double()).float())
    assert_matches(bias_act_residual(x, None, torch.tensor(2.0), "tanh"), torch.tanh(x.double()).float() + 2.0)


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 5), (2, 0, 4)])
def test_empty_inputs_give_empty_outputs(shape: tuple[int, ...]) -> None:
    x = torch.empty(shape, dtype=torch.float16)
    bias = torch.randn(shape[-1]).half()
    for y in (gelu(x), bias_act(x, bias, "relu"), bias_act_residual(x, bias, torch.empty_like(x), "silu")):
        assert y.shape == x.shape and y.dtype == x.dtype


# --------------------------------------------------------------------------------------- the spec directly


def _problem_for(x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None, activation: str):
    return pw.pointwise_problem(
        x.numel(), x.shape[-1], DTYPE_NAMES[x.dtype], activation, bias is not None, residual is not None
    )


def _spread(configs: list[dict], limit: int) -> list[dict]:
    """Configs distinct in what the interpreter can tell apart (num_warps is a GPU launch option)."""
    seen, distinct = set(), []
    for c in configs:
        k = (c["variant"], c["BLOCK"], c["BLOCK_N"])
        if k not in seen:
            seen.add(k)
            distinct.append(c)
    step = max(1, len(distinct) // limit)
    return distinct[::step]


@pytest.mark.parametrize(
    "rows, cols, activation, dtype",
    [
        (37, 48, "gelu_tanh", torch.float16),  # aligned, ragged row count
        (21, 33, "silu", torch.bfloat16),  # unaligned, ragged everything
        (1000, 3, "gelu", torch.float32),  # tall-skinny
        (3, 1100, "tanh", torch.float32),  # wide rows, several column tiles
    ],
)
def test_several_configs_write_every_element(rows: int, cols: int, activation: str, dtype: torch.dtype) -> None:
    x = randn(rows, cols, dtype=dtype)
    bias = randn(cols, dtype=dtype, seed=1, std=0.5)
    residual = randn(rows, cols, dtype=dtype, seed=2, std=1.0)
    inputs = (x, bias, residual, 0.75, activation)
    problem = _problem_for(x, bias, residual, activation)
    configs = SPACE.valid_configs(problem, fingerprint())
    chosen = _spread([c for c in configs if c["variant"] == "rows"], 8)
    chosen += _spread([c for c in configs if c["variant"] == "flat"], 4)
    assert {c["variant"] for c in chosen} == {"flat", "rows"}
    want = reference64(x, bias, residual, activation, 0.75)
    for config in chosen:
        (y,) = outputs = SPEC.alloc_outputs(inputs)
        y.fill_(float("nan"))
        SPEC.launch(config, inputs, outputs)
        assert_matches(y, want, str(config))


@pytest.mark.parametrize("variant", ["flat", "rows"])
def test_int64_offsets_path(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kernel_name = "_pointwise_flat" if variant == "flat" else "_pointwise_rows"
    kernel, flags = getattr(pw, kernel_name), []

    class Spy:  # records which offset width each launch compiles, then launches for real
        def __getitem__(self, grid):
            def run(*args, **kwargs):
                flags.append(kwargs["INT64"])
                return kernel[grid](*args, **kwargs)

            return run

    monkeypatch.setattr(pw, kernel_name, Spy())
    x = randn(19, 40)
    bias = randn(40, seed=1, std=0.5)
    residual = randn(19, 40, seed=2)
    config = {"variant": variant, "BLOCK": 256, "BLOCK_N": 16 if variant == "rows" else 256}
    config |= {"num_warps": 2, "num_stages": 1}
    want = reference64(x, bias, residual, "gelu", 1.5)
    for limit in (pw.INT32_LIMIT, 0):  # 0: every offset "overflows", so the int64-offset kernel runs
        monkeypatch.setattr(pw, "INT32_LIMIT", limit)
        (y,) = outputs = SPEC.alloc_outputs((x,))
        y.fill_(float("nan"))
        SPEC.launch(config, (x, bias, residual, 1.5, "gelu"), outputs)
        assert_matches(y, want, f"INT32_LIMIT={limit}")
    assert flags == [False, True]


def test_spec_reference_agrees_with_torch() -> None:
    problem = pw.pointwise_problem(2048, 48, "float32", "silu", has_residual=True)
    x, bias, residual, scale, activation = inputs = SPEC.make_inputs(problem, torch.device("cpu"), 0)
    (ref,) = SPEC.reference(inputs)
    torch.testing.assert_close(ref, reference64(x, bias, residual, activation, scale), atol=0, rtol=0)
    (baseline,) = SPEC.torch_baseline(inputs)
    assert_matches(baseline, ref, "torch baseline")


def test_default_problems_tune_cleanly_and_match_their_inputs() -> None:
    device = fingerprint()
    for problem in SPEC.default_problems(device):
        assert SPACE.is_valid(SPEC.heuristic(problem, device), problem, device)
        inputs = SPEC.make_inputs(problem, torch.device("cpu"), 0)
        x, bias, residual, _, activation = inputs
        assert _problem_for(x, bias, residual, activation) == problem  # the inputs are of this very problem
        assert x.count_nonzero() > 0.9 * x.numel()
        assert bias is None or bias.count_nonzero() > 0.9 * bias.numel()
        (y,) = outputs = SPEC.alloc_outputs(inputs)
        y.fill_(float("nan"))
        SPEC.launch(SPEC.heuristic(problem, device), inputs, outputs)
        assert_matches(y, SPEC.reference(inputs)[0], SPEC.describe_problem(problem))
    for problem in SPEC.default_problems(H200):
        assert SPACE.is_valid(SPEC.heuristic(problem, H200), problem, H200)
        cols = int(problem["cols"])
        rows = max(1, int(problem["numel"]) // cols) if cols else 1
        assert row_bucket(rows * (cols or int(problem["numel"]))) == problem["numel"]


def test_op_key_is_the_spec_problem_key() -> None:
    d = dispatcher("pointwise")
    x = randn(3, 5, 48, dtype=torch.bfloat16)
    bias = randn(48, dtype=torch.bfloat16, seed=1)
    bias_act_residual(x, bias, x, "relu")
    gelu(x, approximate="tanh")
    expected = {
        SPEC.problem_key(pw.pointwise_problem(720, 48, "bfloat16", "relu", True, True)),
        SPEC.problem_key(pw.pointwise_problem(720, 48, "bfloat16", "gelu_tanh", False, False)),
    }
    assert set(d.memo) == expected
    assert all(layer == "heuristic" for layer in d.served_by.values())


def test_heuristic_is_valid_everywhere() -> None:
    checked = 0
    for device in (fingerprint(), H200):
        for log_numel in range(0, 35, 2):
            numel = 1 << log_numel
            for cols in (0, 1, 3, 16, 48, 96, 128, 1000, 1024, 4096, 4097, 11008, 65536):
                if cols > numel:
                    continue
                for dtype in ("float16", "float32"):
                    for has_residual in (False, True):
                        problem = pw.pointwise_problem(numel, max(cols, 1), dtype, "gelu", cols > 0, has_residual)
                        assert_heuristic_valid(SPEC, problem, device)
                        checked += 1
    assert checked > 500


def test_heuristic_picks_rows_for_a_bias_and_flat_otherwise() -> None:
    # What the H200 measurements behind the heuristic showed (kernels/pointwise/pointwise.py, above TARGET_BLOCK).
    expected = {
        (8192 * 4096, 4096, True): ("rows", 1024),
        (4096 * 11008, 11008, True): ("rows", 256),
        (8192 * 4097, 4097, True): ("rows", 256),
        (1000 * 3, 3, True): ("flat", None),  # a 16-wide tile of 3 columns is mostly masked lanes
        (1 << 27, 1, False): ("flat", None),
    }
    for (numel, cols, has_bias), (variant, block_n) in expected.items():
        config = SPEC.heuristic(pw.pointwise_problem(numel, cols, "bfloat16", "gelu", has_bias), H200)
        assert config["variant"] == variant, (numel, cols, config)
        assert block_n is None or config["BLOCK_N"] == block_n, (numel, cols, config)


def test_rules_prune_what_they_say() -> None:
    device = fingerprint()
    no_bias = pw.pointwise_problem(1 << 20, 1, "float16", "relu", has_bias=False)
    configs = SPACE.valid_configs(no_bias, device)
    assert configs and all(c["variant"] == "flat" and c["BLOCK_N"] == c["BLOCK"] for c in configs)
    assert all(32 * c["num_warps"] <= c["BLOCK"] <= 64 * 32 * c["num_warps"] for c in configs)
    tiny = pw.pointwise_problem(5, 5, "float32", "relu")
    assert {c["BLOCK"] for c in SPACE.valid_configs(tiny, device)} == {128}
    narrow = pw.pointwise_problem(4096, 48, "float32", "relu")
    rows = [c for c in SPACE.valid_configs(narrow, device) if c["variant"] == "rows"]
    assert rows and max(c["BLOCK_N"] for c in rows) == 64
    assert all(c["BLOCK"] // c["BLOCK_N"] <= 128 for c in rows)  # ceil(4096 / 48) = 86 rows -> 128


def test_problem_from_shape() -> None:
    flat = SPEC.problem_from_shape((134217728,), "float32")
    assert flat == pw.pointwise_problem(1 << 27, 1, "float32", "gelu_tanh", has_bias=False)
    assert flat["cols"] == 0 and flat["aligned16"] is True
    rows = SPEC.problem_from_shape((8, 1000, 4097), "float16")
    assert (rows["numel"], rows["cols"], rows["aligned16"], rows["has_bias"]) == (1 << 25, 4097, False, True)
    with pytest.raises(InvalidShapeError, match="sizes must be >= 1"):
        SPEC.problem_from_shape((0, 4), "float16")
    with pytest.raises(InvalidInputError, match="dtype must be one of"):
        SPEC.problem_from_shape((4, 4), "float64")


def test_bytes_and_flops() -> None:
    headline = pw.pointwise_problem(1 << 27, 1, "float32", "gelu_tanh", has_bias=False)
    assert SPEC.bytes_moved(headline) == 2 * 4 * (1 << 27)
    fused = pw.pointwise_problem(1 << 24, 1024, "float16", "silu", has_residual=True)
    assert SPEC.bytes_moved(fused) == (3 * (1 << 24) + 1024) * 2
    assert SPEC.flops(fused) > SPEC.flops(pw.pointwise_problem(1 << 24, 1024, "float16", "none"))


# ------------------------------------------------------------------------------------ custom ops, compile


@pytest.mark.usefixtures("swapped_under_compile")
def test_custom_ops_trace_under_torch_compile() -> None:
    x = randn(4, 6, 48)
    bias = randn(48, seed=1, std=0.5)
    residual = randn(4, 6, 48, seed=2)

    def fn(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        a = gelu(x, approximate="tanh")
        b = bias_act(a, bias, "silu", scale=0.5)
        return bias_act_residual(b, None, residual, "tanh") * 2.0

    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, bias, residual), fn(x, bias, residual), atol=0, rtol=0)
    a = F.gelu(x.double(), approximate="tanh")
    want = (torch.tanh(F.silu(a * 0.5 + bias.double())) + residual.double()) * 2.0
    torch.testing.assert_close(compiled(x, bias, residual).double(), want, atol=1e-4, rtol=1e-4)


def test_custom_ops_pass_opcheck() -> None:
    x = randn(5, 16)
    bias = randn(16, seed=1)
    torch.library.opcheck(torch.ops.tunekit.gelu.default, (x, "tanh"))
    torch.library.opcheck(torch.ops.tunekit.bias_act.default, (x, bias, "relu", 2.0))
    torch.library.opcheck(torch.ops.tunekit.bias_act.default, (x, None, "sigmoid", 1.0))
    torch.library.opcheck(torch.ops.tunekit.bias_act_residual.default, (x, bias, x, "gelu", 0.5))
    dy = randn(5, 16, seed=2)
    for b, want_dbias in ((bias, True), (bias, False), (None, False)):
        torch.library.opcheck(torch.ops.tunekit.pointwise_backward.default, (dy, x, b, "silu", 0.5, want_dbias))


# ------------------------------------------------------------------------------------------- bad inputs

_X = torch.randn(4, 8)
_B = torch.randn(8)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: bias_act(_X.double(), None, "relu"), "input dtype must be one of"),
        (lambda: bias_act(_X.to(torch.int32), None, "relu"), "input dtype must be one of"),
        (lambda: bias_act([1.0, 2.0], None, "relu"), "input must be a tensor"),
        (lambda: bias_act(_X, _B.half(), "relu"), "bias dtype must match input dtype torch.float32"),
        (lambda: bias_act_residual(_X, _B, _X.bfloat16(), "relu"), "residual dtype must match input dtype"),
        (lambda: bias_act(_X, torch.randn(9), "relu"), r"bias must have shape \[input.shape\[-1\]\] = \[8\]"),
        (lambda: bias_act(_X, torch.randn(1, 8), "relu"), "bias must have shape"),
        (lambda: bias_act(_X, 1.0, "relu"), "bias must be a tensor or None"),
        (lambda: bias_act(torch.tensor(1.0), torch.randn(1), "relu"), "input is 0-dim"),
        (lambda: bias_act_residual(_X, None, torch.randn(8), "relu"), "residual must have shape input.shape"),
        (lambda: bias_act_residual(_X, None, None, "relu"), "residual must be a tensor"),
        (lambda: bias_act(_X, None, "swish"), "activation must be one of"),
        (lambda: bias_act(_X, None, "relu", scale="2"), "scale must be a Python float"),
        (lambda: gelu(_X, approximate="fast"), "approximate must be one of"),
        (lambda: gelu(_X.to("meta")), "must be on the kernel's device"),
        (lambda: bias_act(_X, _B.to("meta"), "relu"), "bias must be on cpu"),
    ],
)
def test_bad_inputs_raise_clear_errors(call: Callable[[], object], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        call()


def test_requires_grad_is_fine_under_no_grad() -> None:
    x = randn(3, 8).requires_grad_()
    with torch.no_grad():
        assert_matches(gelu(x), F.gelu(x.detach().double()).float())
