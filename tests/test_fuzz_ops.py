"""Ops under fuzzed inputs (hypothesis): torch's answer within tolerance, or a TunekitError; never a wrong result.

Inputs vary in shape (0 and 1 sized dims, 0-d), dtype (supported and not), layout (transposed, step-sliced,
offset, broadcast-expanded views), device (a meta tensor stands in for a wrong device), values (a few NaN / inf),
and arguments (dims in and out of range, mismatched weight shapes, bad `approximate`). Whenever an op returns, its
result must have torch's shape and dtype and match torch computed in float64 (NaN where torch has NaN).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import tunekit.ops as ops
from tunekit.errors import TunekitError

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, on the NaN and inf inputs

FUZZ = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
SUPPORTED = [torch.float32, torch.float16, torch.bfloat16]
DTYPES = SUPPORTED * 4 + [torch.float64, torch.int32, torch.bool]  # mostly supported: most examples compute
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (6e-2, 2e-2)}
SIZES = [0, 1, 2, 3, 5, 8, 17]


def _make(shape: list[int], dtype: torch.dtype, layout: str, special: bool, seed: int) -> torch.Tensor:
    """A tensor of `shape` whose memory layout is `layout`."""
    g = torch.Generator().manual_seed(seed)
    full = list(shape)
    if layout == "strided" and shape:
        full[-1] *= 2
    elif layout == "offset" and shape:
        full[-1] += 1
    elif layout == "expanded" and shape:
        full[0] = 1
    elif layout == "transposed" and len(shape) >= 2:
        full[-1], full[-2] = full[-2], full[-1]
    if dtype.is_floating_point:
        base = torch.randn(full, generator=g, dtype=torch.float64)
        if special and base.numel():
            flat = base.view(-1)
            for value, at in zip((math.nan, math.inf, -math.inf), torch.randint(0, flat.numel(), (3,), generator=g)):
                flat[int(at)] = value
        base = base.to(dtype)
    elif dtype == torch.bool:
        base = torch.rand(full, generator=g) > 0.5
    else:
        base = torch.randint(-5, 5, full, generator=g, dtype=dtype)
    if layout == "strided" and shape:
        return base[..., ::2]
    if layout == "offset" and shape:
        return base[..., 1:]
    if layout == "expanded" and shape:
        return base.expand(shape)
    if layout == "transposed" and len(shape) >= 2:
        return base.transpose(-1, -2)
    return base


@st.composite
def tensors(draw: st.DrawFn, min_dims: int = 0) -> torch.Tensor:
    shape = draw(st.lists(st.sampled_from(SIZES), min_size=min_dims, max_size=3))
    if math.prod(shape) > 600:
        shape = shape[:2]
    dtype = draw(st.sampled_from(DTYPES))
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided", "offset", "expanded"]))
    special = draw(st.booleans()) and draw(st.booleans())  # a quarter of the float inputs hold NaN and inf
    x = _make(shape, dtype, layout, special, draw(st.integers(0, 2**16)))
    if draw(st.sampled_from(["cpu"] * 19 + ["meta"])) == "meta":
        x = torch.empty_like(x, device="meta")  # not the kernels' device
    return x


def _expect(run, reference) -> None:
    """Either `run()` raises a TunekitError, or it matches `reference()` (a tensor, or None: torch refuses too)."""
    try:
        got = run()
    except TunekitError as exc:
        assert str(exc) and "\n" not in str(exc)
        event("refused")  # --hypothesis-show-statistics shows how many examples computed
        return
    event("compared")
    want = reference()
    assert want is not None, "tunekit returned a result where torch refuses the input"
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    atol, rtol = TOLERANCE[got.dtype]
    g, w = got.double(), want.double()
    both_nan = torch.isnan(g) & torch.isnan(w)
    assert bool((torch.isnan(g) == torch.isnan(w)).all()), "NaN where torch has none, or the other way round"
    close = torch.isclose(g, w, atol=atol, rtol=rtol) | both_nan
    assert bool(close.all()), f"max error {(g - w).abs().nan_to_num(0).max().item():.3g} over tolerance"


def _torch_or_none(fn):
    try:
        return fn()
    except (RuntimeError, ValueError, TypeError, IndexError, NotImplementedError):
        return None


def _is_cpu_float(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype in TOLERANCE


@FUZZ
@given(
    x=tensors(),
    k=st.sampled_from([1, 1, 2, 3, 0]),
    weight=st.sampled_from(["ok", "none", "ok", "wrong-shape", "other-dtype"]),
    bias=st.sampled_from(["ok", "none", "ok", "wrong-shape"]),
    eps=st.sampled_from([1e-5, 1e-2, 0.0]),
)
def test_layer_norm(x, k, weight, bias, eps):
    k = min(k, x.dim())
    shape = list(x.shape[x.dim() - k :]) if k > 0 else [7]  # k == 0: a normalized_shape that does not match
    device = "cpu" if x.device.type == "cpu" else x.device

    def param(kind: str, seed: int):
        if kind == "none":
            return None
        size = [s + 1 for s in shape] if kind == "wrong-shape" else shape
        dtype = torch.float32 if kind == "other-dtype" and x.dtype != torch.float32 else x.dtype
        if not dtype.is_floating_point:
            dtype = torch.float32
        return torch.randn(size, generator=torch.Generator().manual_seed(seed)).to(dtype).to(device)

    w, b = param(weight, 1), param(bias, 2)

    def reference():
        if not _is_cpu_float(x):
            return None
        w64 = None if w is None else w.double()
        b64 = None if b is None else b.double()
        return _torch_or_none(lambda: F.layer_norm(x.double(), shape, w64, b64, eps).to(x.dtype))

    _expect(lambda: ops.layer_norm(x, shape, w, b, eps), reference)


@FUZZ
@given(
    x=tensors(),
    dim=st.integers(-4, 3),
    in_range=st.sampled_from([True, True, True, False]),
    dtype=st.sampled_from([None, None, torch.float32, torch.float16]),
)
def test_softmax(x, dim, in_range, dtype):
    if in_range:
        dim = dim % max(x.dim(), 1)

    def reference():
        if not _is_cpu_float(x):
            return None
        out_dtype = dtype or x.dtype
        return _torch_or_none(lambda: torch.softmax(x.to(out_dtype).double(), dim).to(out_dtype))

    _expect(lambda: ops.softmax(x, dim, dtype=dtype), reference)


@FUZZ
@given(
    x=tensors(),
    dim=st.one_of(st.integers(-4, 3), st.none(), st.lists(st.integers(-3, 2), min_size=1, max_size=2).map(tuple)),
    in_range=st.sampled_from([True, True, True, False]),
    keepdim=st.booleans(),
    dtype=st.sampled_from([None, None, torch.float32, torch.bfloat16]),
)
def test_sum(x, dim, in_range, keepdim, dtype):
    rank = max(x.dim(), 1)
    if in_range and isinstance(dim, int):
        dim = dim % rank
    elif in_range and isinstance(dim, tuple):
        dim = tuple(sorted({d % rank for d in dim}))

    def reference():
        if not _is_cpu_float(x):
            return None
        out_dtype = dtype or x.dtype
        return _torch_or_none(lambda: torch.sum(x.to(out_dtype).double(), dim, keepdim).to(out_dtype))

    _expect(lambda: ops.sum(x, dim, keepdim, dtype=dtype), reference)


@FUZZ
@given(
    x=tensors(),
    approximate=st.sampled_from(["none", "tanh", "none", "tanh", "exact", None]),
    grad=st.sampled_from([False, False, False, True]),
)
def test_gelu(x, approximate, grad):
    if grad and x.dtype.is_floating_point:
        x = x.detach().requires_grad_(True)  # gradients flow (tests/test_autograd.py checks their values)

    def reference():
        if not _is_cpu_float(x) or approximate not in ("none", "tanh"):
            return None
        return _torch_or_none(lambda: F.gelu(x.detach().double(), approximate=approximate).to(x.dtype))

    _expect(lambda: ops.gelu(x, approximate), reference)


@pytest.mark.parametrize(
    "call",
    [
        lambda: ops.layer_norm(torch.randn(4, 8), (7,)),
        lambda: ops.layer_norm(torch.randn(4, 8), (8,), torch.randn(8).half()[:4]),
        lambda: ops.layer_norm(torch.randn(4, 8, dtype=torch.float64), (8,)),
        lambda: ops.softmax(torch.randn(4, 8), 2),
        lambda: ops.softmax(torch.randint(0, 3, (4, 8)), 1),
        lambda: ops.sum(torch.randn(4, 8, 3), (0, 2)),
        lambda: ops.sum(torch.randn(4, 8), 0, dtype=torch.int64),
        lambda: ops.gelu(torch.randn(4, 8), "exact"),
        lambda: ops.gelu(torch.randn(4, 8, device="meta")),
    ],
)
def test_bad_inputs_are_clear_errors(call):
    with pytest.raises(TunekitError):
        call()
