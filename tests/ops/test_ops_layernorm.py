"""tunekit.ops.layer_norm as a drop-in for torch.nn.functional.layer_norm, and its dispatch path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tunekit.ops
from tunekit.core.errors import InvalidInputError
from tunekit.runtime.dispatch import dispatcher

TOL = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}


def reference(x, shape, w, b, eps=1e-5):
    return F.layer_norm(x.double(), shape, None if w is None else w.double(), None if b is None else b.double(), eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "shape, normalized", [((5, 7), (7,)), ((2, 3, 33), (33,)), ((4, 3, 5), (3, 5)), ((1, 1), (1,))]
)
def test_matches_torch_with_leading_dims(dtype, shape, normalized):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g) * 3 + 1).to(dtype)
    w = (1 + 0.1 * torch.randn(normalized, generator=g)).to(dtype)
    b = (0.1 * torch.randn(normalized, generator=g)).to(dtype)
    y = tunekit.ops.layer_norm(x, normalized, w, b, eps=1e-6)
    assert y.shape == x.shape and y.dtype == dtype
    torch.testing.assert_close(y.double(), reference(x, normalized, w, b, 1e-6), atol=TOL[dtype], rtol=TOL[dtype])


def test_non_contiguous_input_and_optional_affine():
    x = torch.randn(16, 9).t()  # [9, 16], strided
    y = tunekit.ops.layer_norm(x, 16)
    torch.testing.assert_close(y.double(), reference(x, (16,), None, None), atol=1e-4, rtol=1e-4)


def test_empty_input_gives_empty_output():
    x = torch.randn(0, 8)
    assert tunekit.ops.layer_norm(x, (8,)).shape == (0, 8)


def test_dispatch_memoises_per_problem_key():
    d = dispatcher("layernorm")
    x = torch.randn(3, 20)
    for _ in range(3):  # a miss, a memo hit (watched by the hot path), then a replay that skips dispatch
        tunekit.ops.layer_norm(x, (20,))
    assert d.counters == {"heuristic": 1} and d.memo_hits == 1
    tunekit.ops.layer_norm(torch.randn(4, 20), (20,))  # 3 and 4 rows share a bucket: same key
    tunekit.ops.layer_norm(torch.randn(3, 21), (21,))
    assert d.counters == {"heuristic": 2} and d.memo_hits == 2


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: tunekit.ops.layer_norm(torch.randn(2, 8, dtype=torch.float64), (8,)), "input dtype must be one of"),
        (lambda: tunekit.ops.layer_norm(torch.randint(0, 4, (2, 8)), (8,)), "input dtype must be one of"),
        (lambda: tunekit.ops.layer_norm(torch.randn(2, 8), (8,), torch.randn(7)), "weight must have shape"),
        (lambda: tunekit.ops.layer_norm(torch.randn(2, 8), (8,), None, torch.randn(2, 8)), "bias must have shape"),
        (lambda: tunekit.ops.layer_norm(torch.randn(2, 8), (4,)), "must match the trailing dims"),
        (lambda: tunekit.ops.layer_norm(torch.randn(8), (2, 8)), "must match the trailing dims"),
        (lambda: tunekit.ops.layer_norm(torch.randn(2, 8, device="meta"), (8,)), "must be on the kernel's device"),
        (lambda: tunekit.ops.layer_norm([1.0, 2.0], (2,)), "input must be a tensor"),
    ],
)
def test_bad_inputs_are_refused_clearly(call, message):
    with pytest.raises(InvalidInputError, match=message):
        call()
