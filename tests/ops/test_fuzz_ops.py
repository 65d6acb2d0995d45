"""Ops under fuzzed inputs (hypothesis): torch's answer within tolerance, or a TunekitError; never a wrong result.

Inputs vary in shape (0 and 1 sized dims, 0-d), dtype (supported and not), layout (transposed, step-sliced,
offset, broadcast-expanded views), device (a meta tensor stands in for a wrong device), values (a few NaN / inf),
and arguments (dims in and out of range, mismatched weight shapes, bad `approximate`). Whenever an op returns, its
result must have torch's shape and dtype and match torch computed in float64 (NaN where torch has NaN).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import check_screens
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import tunekit.ops as ops
from tunekit.core.errors import AutogradUnsupportedError, TunekitError
from tunekit.kernels.common import torch_activation

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy, on the NaN and inf inputs

FUZZ = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
SUPPORTED = [torch.float32, torch.float16, torch.bfloat16]
DTYPES = SUPPORTED * 4 + [torch.float64, torch.int32, torch.bool]  # mostly supported: most examples compute
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (6e-2, 2e-2)}
SIZES = [0, 1, 2, 3, 5, 8, 17]


@pytest.fixture(autouse=True)
def _screens_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every fuzzed call also checks the op's hot-path screen against the problems its full path resolves."""
    check_screens(monkeypatch)


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
        x = x.detach().requires_grad_(True)  # gradients flow (tests/ops/test_autograd.py checks their values)

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


# --- every op of tunekit.ops, requires_grad included -----------------------------------------------------------------
#
# CASES maps each public op (tunekit.ops.__all__) to a strategy drawing one call: its tensors, the tunekit call and
# torch's float64 reference. The test is parametrized over tunekit.ops.__all__ itself, so an op added there without a
# case here fails (KeyError), as does `test_every_op_has_a_case`. Drawn calls hold awkward shapes and layouts, dtypes
# and devices the ops refuse, and (for half of them) inputs that require grad. Whatever the op does:
# - it raises a one-line TunekitError (AutogradUnsupportedError only when an input requires grad in grad mode), or
# - its result has torch's shape and dtype and matches torch in float64 (NaN where torch has NaN), and
# - when an input requires grad, the result is attached to the graph (never silently detached) and the gradient of
#   every input matches torch's float64 gradient.

GRAD_TOLERANCE = {torch.float32: (2e-3, 2e-3), torch.float16: (3e-2, 3e-2), torch.bfloat16: (1.5e-1, 6e-2)}
# the norms' eps, wider than anyone's default: 0 (a constant row divides by zero: torch says NaN or inf too), tiny,
# usual, large (eps dominating the variance)
NORM_EPS = [0.0, 1e-12, 1e-8, 1e-6, 1e-5, 1e-3, 0.1, 1.0, 1e3]
POINTWISE_ACTIVATIONS = ["none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh"]
GEMM_ACTIVATIONS = [None, "none", "relu", "gelu", "gelu_tanh", "silu"]
OPS_INPUTS_TRIED = {"calls": 0}


@dataclass
class Call:
    tensors: dict[str, torch.Tensor | None]
    run: Callable[[dict[str, Any]], Any]  # the tunekit call
    reference: Callable[[dict[str, Any]], Any]  # torch on the float64 copies of the tensors (may raise: refuses)
    out_dtype: torch.dtype | None = None  # the result's dtype (default: the first tensor's)
    gemm: bool = False  # a matrix product: tolerance grows with K


def _param(draw: st.DrawFn, x: torch.Tensor, shape: list[int], seed: int) -> torch.Tensor | None:
    """A weight/bias-like operand of `shape` for input x: usually right, sometimes absent, misshapen or of another
    dtype."""
    kind = draw(st.sampled_from(["ok"] * 6 + ["none", "wrong-shape", "other-dtype"]))
    if kind == "none":
        return None
    size = [s + 1 for s in shape] if kind == "wrong-shape" else shape
    dtype = x.dtype if x.dtype.is_floating_point else torch.float32
    if kind == "other-dtype":
        dtype = torch.float16 if dtype != torch.float16 else torch.float32
    g = torch.Generator().manual_seed(seed)
    device = "cpu" if x.device.type == "cpu" else x.device
    return torch.randn(size, generator=g).to(dtype).to(device)


def _normalized(draw: st.DrawFn, x: torch.Tensor) -> list[int]:
    k = min(draw(st.sampled_from([1, 1, 1, 2, 0])), x.dim())
    return list(x.shape[x.dim() - k :]) if k > 0 else [7]  # k == 0: a normalized_shape that does not match


@st.composite
def layer_norm_calls(draw: st.DrawFn) -> Call:
    x = draw(tensors())
    shape = _normalized(draw, x)
    eps = draw(st.sampled_from(NORM_EPS))
    t = {"x": x, "w": _param(draw, x, shape, 1), "b": _param(draw, x, shape, 2)}
    return Call(
        t,
        lambda t: ops.layer_norm(t["x"], shape, t["w"], t["b"], eps),
        lambda t: F.layer_norm(t["x"], shape, t["w"], t["b"], eps),
    )


@st.composite
def rms_norm_calls(draw: st.DrawFn) -> Call:
    x = draw(tensors())
    shape = _normalized(draw, x)
    eps = draw(st.sampled_from([None, *NORM_EPS]))
    # eps None is finfo(input dtype).eps: the reference, in float64, needs it spelled out
    ref_eps = eps if eps is not None or not x.dtype.is_floating_point else torch.finfo(x.dtype).eps
    t = {"x": x, "w": _param(draw, x, shape, 1)}
    return Call(
        t,
        lambda t: ops.rms_norm(t["x"], shape, t["w"], eps),
        lambda t: F.rms_norm(t["x"], shape, t["w"], ref_eps),
    )


def _dim(draw: st.DrawFn, x: torch.Tensor) -> int:
    dim = draw(st.integers(-4, 3))
    return dim % max(x.dim(), 1) if draw(st.sampled_from([True, True, True, False])) else dim


@st.composite
def softmax_calls(draw: st.DrawFn, log: bool) -> Call:
    x = draw(tensors())
    dim = _dim(draw, x)
    dtype = draw(st.sampled_from([None, None, torch.float32, torch.float16]))
    op, ref = (ops.log_softmax, torch.log_softmax) if log else (ops.softmax, torch.softmax)
    return Call(
        {"x": x},
        lambda t: op(t["x"], dim, dtype=dtype),
        lambda t: ref(t["x"].to(dtype or x.dtype).double(), dim),
        out_dtype=dtype or x.dtype,
    )


@st.composite
def sum_mean_calls(draw: st.DrawFn, mean: bool) -> Call:
    x = draw(tensors())
    rank = max(x.dim(), 1)
    dim = draw(st.one_of(st.integers(-4, 3), st.none(), st.lists(st.integers(-3, 2), min_size=1, max_size=2)))
    if draw(st.sampled_from([True, True, True, False])):
        dim = dim % rank if isinstance(dim, int) else tuple(sorted({d % rank for d in dim})) if dim else dim
    elif isinstance(dim, list):
        dim = tuple(dim)
    keepdim = draw(st.booleans())
    dtype = draw(st.sampled_from([None, None, torch.float32, torch.bfloat16]))
    op, ref = (ops.mean, torch.mean) if mean else (ops.sum, torch.sum)
    return Call(
        {"x": x},
        lambda t: op(t["x"], dim, keepdim, dtype=dtype),
        lambda t: ref(t["x"].to(dtype or x.dtype).double(), dim, keepdim),
        out_dtype=dtype or x.dtype,
    )


@st.composite
def max_calls(draw: st.DrawFn) -> Call:
    x = draw(tensors())
    dim = _dim(draw, x)
    keepdim = draw(st.booleans())
    return Call({"x": x}, lambda t: ops.max(t["x"], dim, keepdim), lambda t: torch.max(t["x"], dim, keepdim))


def _activation_ref(v: torch.Tensor, activation: str | None) -> torch.Tensor:
    # torch's own activation of that name; an unknown name raises a ValueError: the reference refuses too
    return torch_activation(v, activation or "none")


@st.composite
def gelu_calls(draw: st.DrawFn) -> Call:
    x = draw(tensors())
    approximate = draw(st.sampled_from(["none", "tanh", "none", "exact"]))
    return Call({"x": x}, lambda t: ops.gelu(t["x"], approximate), lambda t: F.gelu(t["x"], approximate=approximate))


@st.composite
def bias_act_calls(draw: st.DrawFn, residual: bool) -> Call:
    x = draw(tensors())
    t = {"x": x, "b": _param(draw, x, list(x.shape[-1:]), 1)}
    if residual:
        t["r"] = _param(draw, x, list(x.shape), 2)
    activation = draw(st.sampled_from([*POINTWISE_ACTIVATIONS, "swish"]))
    scale = draw(st.sampled_from([1.0, 0.5, -2.0, 3]))

    def ref(t: dict[str, Any]) -> torch.Tensor:
        if t["b"] is not None and t["x"].dim() == 0:
            raise ValueError("no last dim to add a bias over")
        v = t["x"] * scale + (t["b"] if t["b"] is not None else 0)
        v = _activation_ref(v, activation)
        return v + t["r"] if residual else v

    if residual:
        return Call(t, lambda t: ops.bias_act_residual(t["x"], t["b"], t["r"], activation, scale=scale), ref)
    return Call(t, lambda t: ops.bias_act(t["x"], t["b"], activation, scale=scale), ref)


GEMM_SIZES = [0, 1, 2, 3, 5, 8, 17]


def _matrix(draw: st.DrawFn, rows: int, cols: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    layout = draw(st.sampled_from(["contiguous", "contiguous", "transposed", "strided"]))
    if rows == 0 or cols == 0:
        layout = "contiguous"
    return _make([rows, cols], dtype, layout, False, seed)


@st.composite
def matmul_calls(draw: st.DrawFn) -> Call:
    m, n, k = (draw(st.sampled_from(GEMM_SIZES)) for _ in range(3))
    dtype = draw(st.sampled_from(DTYPES))
    a = _matrix(draw, m, k, dtype, 1)
    b = _matrix(draw, k + draw(st.sampled_from([0, 0, 0, 0, 1])), n, dtype, 2)  # sometimes K does not match
    t = {"a": a, "b": b, "bias": _param(draw, a, [n], 3), "r": _param(draw, a, [m, n], 4)}
    activation = draw(st.sampled_from(GEMM_ACTIVATIONS))
    alpha, beta = draw(st.sampled_from([1.0, 0.5])), draw(st.sampled_from([1.0, -1.0]))

    def ref(t: dict[str, Any]) -> torch.Tensor:
        v = alpha * (t["a"] @ t["b"]) + (t["bias"] if t["bias"] is not None else 0)
        v = _activation_ref(v, activation)
        return v + beta * t["r"] if t["r"] is not None else v

    run = lambda t: ops.matmul(  # noqa: E731
        t["a"], t["b"], bias=t["bias"], activation=activation, alpha=alpha, beta=beta, residual=t["r"]
    )
    return Call(t, run, ref, gemm=True)


@st.composite
def linear_calls(draw: st.DrawFn) -> Call:
    lead = draw(st.lists(st.sampled_from(GEMM_SIZES), min_size=0, max_size=2))
    k, n = draw(st.sampled_from(GEMM_SIZES)), draw(st.sampled_from(GEMM_SIZES))
    dtype = draw(st.sampled_from(DTYPES))
    x = _make([*lead, k], dtype, draw(st.sampled_from(["contiguous", "strided", "expanded"])), False, 1)
    w = _matrix(draw, n, k + draw(st.sampled_from([0, 0, 0, 0, 1])), dtype, 2)
    t = {"x": x, "w": w, "b": _param(draw, x, [n], 3), "r": _param(draw, x, [*lead, n], 4)}
    activation = draw(st.sampled_from(GEMM_ACTIVATIONS))

    def ref(t: dict[str, Any]) -> torch.Tensor:
        v = _activation_ref(F.linear(t["x"], t["w"], t["b"]), activation)
        return v + t["r"] if t["r"] is not None else v

    return Call(t, lambda t: ops.linear(t["x"], t["w"], t["b"], activation, t["r"]), ref, gemm=True)


def _rotary_operand(draw: st.DrawFn, shape: list[int], heads_dim: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """q or k of `shape` in a layout models produce: contiguous, a transposed projection (the [B, S, H, D] buffer
    seen as [B, H, S, D] or the other way), a prefix of a wider head dim (GPT-NeoX's partial rotary), or one of
    the general layouts (a strided or offset last dim, a broadcast batch)."""
    layout = draw(st.sampled_from(["contiguous", "transposed", "prefix", "strided", "offset", "expanded"]))
    special = draw(st.booleans()) and draw(st.booleans())
    if layout == "transposed":
        other = 3 - heads_dim
        swapped = list(shape)
        swapped[heads_dim], swapped[other] = shape[other], shape[heads_dim]
        return _make(swapped, dtype, "contiguous", special, seed).transpose(1, 2)
    if layout == "prefix":
        return _make([*shape[:3], shape[3] + 4], dtype, "contiguous", special, seed)[..., : shape[3]]
    return _make(shape, dtype, layout, special, seed)


@st.composite
def rotary_embedding_calls(draw: st.DrawFn) -> Call:
    """q [B, Hq, S, D] and k [B, Hk, S, D] (or [B, S, H, D] with unsqueeze_dim 2, negative dims too), cos and sin
    [B or 1, S or 1, D], odd and empty sizes; cos and sin are leaves (torch's formula) or constants."""
    dtype = draw(st.sampled_from(SUPPORTED))
    batch, seq, q_heads, k_heads = (draw(st.sampled_from([0, 1, 2, 2, 3, 3])) for _ in range(4))
    dim = draw(st.sampled_from([0, 1, 3, 6, 8, 8, 8, 10, 16]))
    unsqueeze_dim = draw(st.sampled_from([1, 2, -3, -2]))
    heads_dim = unsqueeze_dim % 4

    def operand(heads: int, seed: int) -> torch.Tensor:
        shape = [batch, heads, seq, dim] if heads_dim == 1 else [batch, seq, heads, dim]
        return _rotary_operand(draw, shape, heads_dim, dtype, seed)

    cos_shape = [draw(st.sampled_from([batch, 1])), draw(st.sampled_from([seq, seq, 1])), dim]
    cos_dtype = draw(st.sampled_from([dtype] * 5 + [torch.float16]))  # the latter: torch promotes, or refuses
    cos, sin = (_make(cos_shape, cos_dtype, "contiguous", False, s).clamp(-1, 1) for s in (3, 4))
    t = {"q": operand(q_heads, 1), "k": operand(k_heads, 2)}
    leaves = draw(st.booleans())
    if leaves:
        t.update(cos=cos, sin=sin)

    def rotary(fn: Callable[..., tuple[torch.Tensor, torch.Tensor]], t: dict[str, Any], wide: bool) -> torch.Tensor:
        c, s = (t["cos"], t["sin"]) if leaves else (cos, sin)
        if wide:  # complex cos or sin stay complex: torch's formula keeps their imaginary parts
            c, s = (x.to(torch.complex128) if x.is_complex() else x.double() for x in (c, s))
        q_embed, k_embed = fn(t["q"], t["k"], c, s, unsqueeze_dim)
        return torch.cat((q_embed.flatten(), k_embed.flatten()))

    def reference(q, k, c, s, unsqueeze_dim):  # transformers' formula
        c, s = c.unsqueeze(unsqueeze_dim), s.unsqueeze(unsqueeze_dim)
        half = dim // 2
        return tuple(x * c + torch.cat((-x[..., half:], x[..., :half]), -1) * s for x in (q, k))

    out_dtype = torch.promote_types(dtype, cos_dtype)
    return Call(t, lambda t: rotary(ops.rotary_embedding, t, False), lambda t: rotary(reference, t, True), out_dtype)


@st.composite
def swiglu_calls(draw: st.DrawFn) -> Call:
    """gate and up of one shape (0-d, empty and odd sizes, NaN and inf among the values), each in a layout of its
    own; or the two halves of one fused [..., 2N] projection; or a half-precision up with a float32 gate (torch
    promotes; a half gate would round silu in its own dtype first, which torch does too), or of a shape that
    broadcasts against gate's (torch's formula; shapes torch refuses keep torch's error: tests/kernels/glu/)."""
    shape = draw(st.lists(st.sampled_from(SIZES), min_size=0, max_size=3))
    if math.prod(shape) > 600:
        shape = shape[:2]
    layouts = st.sampled_from(["contiguous", "transposed", "strided", "offset", "expanded"])
    special = draw(st.booleans()) and draw(st.booleans())
    kind = draw(st.sampled_from(["same"] * 5 + ["fused", "other-dtype", "broadcast"]))
    dtype = torch.float32 if kind == "other-dtype" else draw(st.sampled_from(SUPPORTED))
    up_dtype = draw(st.sampled_from([torch.float16, torch.bfloat16])) if kind == "other-dtype" else dtype
    seed = draw(st.integers(0, 2**16))
    if kind == "fused" and shape:
        both = _make([*shape[:-1], 2 * shape[-1]], dtype, "contiguous", special, seed)
        gate, up = both[..., : shape[-1]], both[..., shape[-1] :]
    else:
        up_shape = shape[-1:] if kind == "broadcast" else shape
        gate = _make(shape, dtype, draw(layouts), special, seed)
        up = _make(up_shape, up_dtype, draw(layouts), special, seed + 1)
    return Call(
        {"gate": gate, "up": up},
        lambda t: ops.swiglu(t["gate"], t["up"]),
        lambda t: F.silu(t["gate"]) * t["up"],
        out_dtype=torch.promote_types(dtype, up_dtype),
    )


@st.composite
def cross_entropy_calls(draw: st.DrawFn) -> Call:
    """Logits [N, V] (odd V, strided rows, NaN and inf among them), int64 targets (some ignored, the target not a
    leaf: it is closed over), each reduction."""
    n, v = draw(st.sampled_from([0, 1, 2, 5, 9])), draw(st.sampled_from([1, 2, 7, 33, 130]))
    x = _make([n, v], draw(st.sampled_from(DTYPES)), draw(st.sampled_from(["contiguous", "strided"])),
              draw(st.booleans()), 1)  # fmt: skip
    target = torch.randint(0, v, (n,), generator=torch.Generator().manual_seed(draw(st.integers(0, 999))))
    if n and draw(st.booleans()):
        target[0] = -100
    reduction = draw(st.sampled_from(["mean", "sum", "none"]))

    def call(fn: Callable[..., torch.Tensor]) -> Callable[[dict[str, Any]], torch.Tensor]:
        return lambda t: fn(t["x"], target.to(t["x"].device), reduction=reduction)

    return Call({"x": x}, call(ops.cross_entropy), call(F.cross_entropy))


CASES: dict[str, Callable[[], st.SearchStrategy[Call]]] = {
    "cross_entropy": cross_entropy_calls,
    "bias_act": lambda: bias_act_calls(residual=False),
    "bias_act_residual": lambda: bias_act_calls(residual=True),
    "gelu": gelu_calls,
    "layer_norm": layer_norm_calls,
    "linear": linear_calls,
    "log_softmax": lambda: softmax_calls(log=True),
    "matmul": matmul_calls,
    "max": max_calls,
    "mean": lambda: sum_mean_calls(mean=True),
    "rms_norm": rms_norm_calls,
    "rotary_embedding": rotary_embedding_calls,
    "softmax": lambda: softmax_calls(log=False),
    "sum": lambda: sum_mean_calls(mean=False),
    "swiglu": swiglu_calls,
}


def test_every_op_has_a_case():
    """A new op in tunekit.ops is fuzzed only once it has a case here: its absence fails the suite."""
    public = {name for name in ops.__all__ if callable(getattr(ops, name))}
    assert public == set(CASES), f"ops without a fuzz case: {sorted(public - set(CASES))}"


def _close(got: torch.Tensor, want: torch.Tensor, tolerance: tuple[float, float], what: str) -> None:
    """Equal NaN positions, and within tolerance elsewhere (atol scaled by the reference's magnitude)."""
    g, w = got.detach().double(), want.detach().double()
    assert bool((torch.isnan(g) == torch.isnan(w)).all()), f"{what}: NaN where torch has none, or the other way"
    finite = w[torch.isfinite(w)]
    peak = float(finite.abs().max()) if finite.numel() else 0.0
    atol, rtol = tolerance[0] * max(1.0, peak), tolerance[1]
    close = torch.isclose(g, w, atol=atol, rtol=rtol) | (torch.isnan(g) & torch.isnan(w))
    assert bool(close.all()), f"{what}: max error {(g - w).abs().nan_to_num(0).max().item():.3g} over tolerance"


def _runs_in_float64(t: torch.Tensor | None) -> bool:
    return t is None or (t.device.type == "cpu" and t.dtype in TOLERANCE)


def _check_call(call: Call, grad: bool, seed: int) -> None:
    OPS_INPUTS_TRIED["calls"] += 1
    leaves: dict[str, Any] = dict(call.tensors)
    if grad:
        for name, t in leaves.items():
            finite = t is not None and (t.device.type == "meta" or bool(torch.isfinite(t).all()))
            if finite and t.dtype.is_floating_point:  # gradients through NaN and inf compare nothing useful
                leaves[name] = t.detach().requires_grad_(True)
    wants_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in leaves.values())
    try:
        got = call.run(leaves)
    except AutogradUnsupportedError as exc:
        assert wants_grad, f"refused autograd without an input that requires grad: {exc}"
        assert "does not support autograd yet" in str(exc) and "\n" not in str(exc)
        event("refused: no autograd yet")
        return
    except TunekitError as exc:
        assert str(exc) and "\n" not in str(exc)
        event("refused")
        return
    values, indices = (got[0], got[1]) if isinstance(got, tuple) else (got, None)
    if not all(_runs_in_float64(t) for t in leaves.values()):
        raise AssertionError("tunekit returned a result for an input torch cannot take here")
    leaves64 = {
        name: None if t is None else t.detach().double().requires_grad_(t.requires_grad) for name, t in leaves.items()
    }
    want = _torch_or_none(lambda: call.reference(leaves64))
    assert want is not None, "tunekit returned a result where torch refuses the input"
    want_values, want_indices = (want[0], want[1]) if isinstance(want, tuple) else (want, None)
    first = next(t for t in leaves.values() if t is not None)
    out_dtype = call.out_dtype or first.dtype
    assert values.shape == want_values.shape and values.dtype == out_dtype, (values.shape, values.dtype)
    tolerance = TOLERANCE[out_dtype]
    if call.gemm:  # K products summed: fp32 accumulation of low-precision rounding grows with K
        tolerance = (tolerance[0] * 4, tolerance[1] * 4)
    _close(values, want_values.to(out_dtype), tolerance, "forward")
    if indices is not None:
        assert torch.equal(indices, want_indices), "max: indices differ from torch's"
    event("compared")
    if not wants_grad:
        return
    assert values.requires_grad, "an input requires grad, but the result is detached from the graph"
    if values.numel() == 0:
        return
    g = torch.Generator().manual_seed(seed)
    upstream = torch.randn(values.shape, generator=g, dtype=torch.float64)
    names = [name for name, t in leaves.items() if t is not None and t.requires_grad]
    grads = torch.autograd.grad(values, [leaves[n] for n in names], upstream.to(values.dtype), allow_unused=True)
    want_grads = torch.autograd.grad(want_values, [leaves64[n] for n in names], upstream, allow_unused=True)
    for name, got_grad, want_grad in zip(names, grads, want_grads):
        leaf = leaves[name]
        got_grad = torch.zeros_like(leaf) if got_grad is None else got_grad
        want_grad = torch.zeros_like(leaves64[name]) if want_grad is None else want_grad
        assert got_grad.shape == leaf.shape and got_grad.dtype == leaf.dtype, (name, got_grad.shape, got_grad.dtype)
        # The upstream gradient is rounded to the output's dtype (e.g. mean(..., dtype=bfloat16) of a float32 input):
        # the looser of the two dtypes' tolerances applies.
        tolerance = max(GRAD_TOLERANCE[leaf.dtype], GRAD_TOLERANCE[values.dtype])
        _close(got_grad, want_grad, tolerance, f"gradient of {name}")
    event(f"gradients compared ({str(first.dtype).removeprefix('torch.')})")


# Examples per op: 100 by default (the examples differ from run to run: no database, so runs add up), more with
# OPS_FUZZ_EXAMPLES=N. 200 took 134 s of the suite on a 2-core machine.
OPS_FUZZ = settings(
    max_examples=int(os.environ.get("OPS_FUZZ_EXAMPLES", "100")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@pytest.mark.parametrize("name", ops.__all__)
@OPS_FUZZ
@given(data=st.data(), grad=st.booleans(), seed=st.integers(0, 2**16))
def test_every_op_matches_torch_or_refuses(name, data, grad, seed):
    call = data.draw(CASES[name](), label=name)
    _check_call(call, grad, seed)


def test_linear_and_matmul_train_instead_of_detaching():
    """The issue's case: linear and matmul returned requires_grad=False for inputs that require grad."""
    a, w, b = torch.randn(4, 8, requires_grad=True), torch.randn(3, 8), torch.randn(3, requires_grad=True)
    r = torch.randn(4, 3, requires_grad=True)
    calls = [
        (lambda: ops.linear(a, w), [a]),
        (lambda: ops.matmul(a, w.T), [a]),
        (lambda: ops.linear(a.detach(), w, b), [b]),
        (lambda: ops.matmul(a.detach(), w.T, residual=r), [r]),
    ]
    for call, leaves in calls:
        out = call()
        assert out.requires_grad
        grads = torch.autograd.grad(out.sum(), leaves)
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
    with torch.no_grad():  # no grad mode: nothing to detach from
        assert not ops.linear(a, w).requires_grad
    assert not ops.linear(a.detach(), w).requires_grad


# --- every view kind torch has ---------------------------------------------------------------------------------------
#
# A kernel reads raw memory, so what matters is how a tensor's values sit there. Besides the layouts above: torch's
# negative bit (`torch._neg_view`, and `.imag` of a conjugated complex tensor, public API, no copy: memory holds the
# negated values), the conjugate bit (complex: the ops refuse the dtype), the real part of a complex tensor (stride
# 2), a diagonal, windows that overlap in memory (unfold-like as_strided), every dim permuted, a select from a
# broadcast, a storage offset of one element (misaligned), channels_last (4-d), and tensors without plain strided
# storage (sparse COO, nested), which the ops refuse with a clear error.

VIEW_KINDS = [
    "neg_bit", "conj_imag", "conj_real", "diagonal", "overlapping", "permuted", "broadcast_select", "misaligned",
    "channels_last", "conj_complex", "sparse", "nested",
]  # fmt: skip


def _view_of(t: torch.Tensor, kind: str) -> torch.Tensor:
    """`t`'s values (or, for overlapping windows and the refused kinds, values of its shape) held the `kind` way."""
    if t.device.type == "meta" or t.dtype == torch.bool:
        return t
    shape = list(t.shape)
    if kind == "neg_bit":
        return torch._neg_view(-t)
    if kind in ("conj_imag", "conj_real", "conj_complex"):
        if t.dtype not in (torch.float32, torch.float64):
            return torch._neg_view(-t)  # no complex dtype to hold it: the negative bit alone
        if kind == "conj_imag":  # conj(0 - i t) = 0 + i t: .imag is t, with the negative bit over -t in memory
            return torch.complex(torch.zeros_like(t), -t).conj().imag
        z = torch.complex(t, torch.ones_like(t)).conj()
        return z.real if kind == "conj_real" else z
    if kind == "diagonal" and shape:
        base = torch.zeros([*shape, shape[-1]], dtype=t.dtype)
        view = base.diagonal(dim1=-2, dim2=-1)
        view.copy_(t)
        return view
    if kind == "overlapping" and len(shape) >= 2 and t.numel():
        rows = math.prod(shape[:-1])
        base = torch.randn(rows + shape[-1], generator=torch.Generator().manual_seed(7)).to(t.dtype)
        row_strides = torch.empty(shape[:-1]).stride()
        return base.as_strided(shape, [*row_strides, 1])  # row r starts at element r: rows overlap
    if kind == "permuted" and len(shape) >= 2:
        order = list(reversed(range(len(shape))))
        return t.permute(order).contiguous().permute(order)
    if kind == "broadcast_select":
        return t.unsqueeze(0).expand(2, *shape)[1]
    if kind == "misaligned" and t.numel():
        flat = torch.empty(t.numel() + 1, dtype=t.dtype)
        flat[1:].copy_(t.reshape(-1))
        return flat[1:].view(shape)
    if kind == "channels_last" and len(shape) == 4:
        return t.contiguous(memory_format=torch.channels_last)
    if kind == "sparse" and shape:
        return t.to_sparse()
    if kind == "nested" and len(shape) >= 2 and t.dtype.is_floating_point:
        return torch.nested.nested_tensor(list(t.unbind(0)))
    return t


@pytest.mark.parametrize("name", ops.__all__)
@settings(max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), grad=st.booleans(), seed=st.integers(0, 2**16))
@pytest.mark.filterwarnings("ignore::UserWarning")  # nested tensors are a prototype
def test_every_op_on_every_view_kind(name, data, grad, seed):
    """Each tensor of a drawn call held as one of torch's view kinds: torch's answer (gradients included), or a
    clear TunekitError. Never the un-negated values of a negative-bit view."""
    call = data.draw(CASES[name](), label=name)
    kinds = {key: data.draw(st.sampled_from(VIEW_KINDS), label=f"{key} view") for key in call.tensors}
    call.tensors = {key: None if t is None else _view_of(t, kinds[key]) for key, t in call.tensors.items()}
    if any(t is not None and (t.is_sparse or t.is_nested or t.is_complex()) for t in call.tensors.values()):
        # The float64 reference cannot take these: tunekit refuses them, or gives torch's own answer on them.
        try:
            got = call.run(call.tensors)
        except TunekitError as exc:
            assert str(exc) and "\n" not in str(exc)
            return
        want = _torch_or_none(lambda: call.reference(call.tensors))
        assert want is not None, f"tunekit computed where torch refuses ({kinds})"
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            w = w.to(g.dtype)  # the reference may run wider (float64 cos and sin)
            assert g.shape == w.shape and torch.allclose(g, w, 1e-3, 1e-3, equal_nan=True), f"not torch's ({kinds})"
        return
    _check_call(call, grad, seed)


@pytest.mark.parametrize("name", ops.__all__)
@settings(max_examples=8, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_plan_never_reads_a_negated_view_raw(name, data):
    """The hot path replays a call by its signature: a negative-bit view with the shape, strides and dtype of the
    tensors a plan was built for must not be replayed raw (its memory holds the negated values)."""
    call = data.draw(CASES[name](), label=name)
    plain = {k: t if t is None or t.device.type == "meta" else t.contiguous() for k, t in call.tensors.items()}
    negated = {k: t if t is None or not t.dtype.is_floating_point else torch._neg_view(-t) for k, t in plain.items()}
    try:
        for _ in range(3):  # full path, watched (the plan is built), replayed
            want = call.run(plain)
    except TunekitError:
        return
    got = call.run(negated)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(0), w.nan_to_num(0)), (
            f"{name} on a negative-bit view differs from the same values without the bit"
        )
