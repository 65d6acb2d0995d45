"""Matrix products with an inner dimension of 1, lowered by Inductor as broadcast multiplies.

A model's rotary embedding computes its angles as `inv_freq[:, None] @ position_ids[None, :]` in fp32: a batched
GEMM whose K is 1. Compile's default mode sends it to cuBLAS, an extern call that costs a decode step more host time
than the pointwise kernel it is (and splits the angle, cos and sin work around it); max-autotune avoids it only at
decode, where N is 1 too (Inductor's own decomposition of matrix-vector products under coordinate descent). An
outer product needs no GEMM: each output element is one product, so `a * b` (broadcast) is the same value, rounded
once, and Inductor fuses it into its consumers. Under TF32 (`allow_tf32`), cuBLAS would round the operands first;
the multiply keeps them exact.

`install()` adds the rewrite to Inductor's post-grad passes for every later compile in the process (`tunekit.patch`
calls it). Its `uuid` says whether it rewrites, so Inductor's caches never mix graphs compiled with and without it.
TUNEKIT_COMPILE_OPS (set to anything) turns it off with tunekit's other compiled choices; `disabled()` turns it off
for the compiles inside it (a benchmark's compile-alone baseline).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from tunekit.runtime import compile_policy

_LOG = logging.getLogger("tunekit.compile")
_VERSION = 1  # bump when what the pass rewrites changes (Inductor's cache key holds it)
_disabled: list[bool] = []
_installed: list[bool] = []


def active() -> bool:
    """Whether a compile starting now rewrites its outer products."""
    return not _disabled and compile_policy.FORCED is None


@contextmanager
def disabled() -> Iterator[None]:
    """Compiles inside keep their outer products as GEMMs (compile's own graph)."""
    _disabled.append(True)
    try:
        yield
    finally:
        _disabled.pop()


def _static_one(size: object) -> bool:
    return isinstance(size, int) and size == 1


def rewrite(graph: torch.fx.Graph) -> int:
    """Replace every mm / bmm of `graph` whose K is statically 1 by the broadcast multiply of its operands; returns
    how many it replaced. Needs the nodes' fake values (`meta["val"]`), as a post-grad graph has them."""
    aten = torch.ops.aten
    targets = {aten.mm.default, aten.bmm.default}  # operands (A [.., M, K], B [.., K, N]), nothing else
    replaced = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in targets or len(node.args) != 2 or node.kwargs:
            continue
        a, b = node.args
        values = [getattr(x, "meta", {}).get("val") for x in (a, b)]
        if not all(isinstance(v, torch.Tensor) for v in values):
            continue
        a_val, b_val = values
        if a_val.dtype != b_val.dtype or not a_val.is_floating_point() or not _static_one(a_val.shape[-1]):
            continue
        try:
            value = a_val * b_val  # fake tensors: the product's shape, dtype and device
        except Exception:  # values this multiply cannot take (a real constant beside fake ones): the GEMM stays
            _LOG.debug("tunekit: an outer product kept as a GEMM", exc_info=True)
            continue
        if tuple(value.shape) != tuple(node.meta.get("val", value).shape):
            continue
        with graph.inserting_before(node):
            product = graph.call_function(aten.mul.Tensor, (a, b))
        product.meta = dict(node.meta)
        product.meta["val"] = value
        node.replace_all_uses_with(product)
        graph.erase_node(node)
        replaced += 1
    return replaced


def _pass_class() -> type[Any]:
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class OuterProducts(CustomGraphPass):  # type: ignore[misc]
        def __call__(self, graph: torch.fx.Graph) -> None:
            if not active():
                return
            try:
                rewrite(graph)
            except Exception:  # never the user's compile's failure: each rewrite made so far is whole and exact
                _LOG.warning("tunekit: outer products left as GEMMs in a graph", exc_info=True)

        def uuid(self) -> Any:
            return f"tunekit-outer-products-{_VERSION}-{'on' if active() else 'off'}"

    return OuterProducts


def install() -> bool:
    """Add the rewrite to Inductor's post-grad passes (once per process); False where it could not be added
    beside a pass the user set (a torch whose config holds one pass only)."""
    if _installed:
        return True
    try:
        from torch._inductor import config, custom_graph_pass
    except ImportError:  # a torch without Inductor's custom passes
        return False
    ours = _pass_class()()
    current = config.post_grad_custom_pre_pass
    if current is None:
        config.post_grad_custom_pre_pass = ours
    elif hasattr(custom_graph_pass, "get_custom_graph_passes"):  # a list of passes is accepted
        before = list(current) if isinstance(current, (list, tuple)) else [current]
        config.post_grad_custom_pre_pass = [*before, ours]
    else:
        _LOG.info("tunekit: a post-grad pass is set already; outer products stay GEMMs")
        return False
    _installed.append(True)
    return True
