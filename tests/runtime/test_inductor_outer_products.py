"""Matrix products with K = 1 lowered as broadcast multiplies (tunekit/integrations/inductor_outer_products.py): the
rewrite gives the GEMM's values bit for bit, leaves every other product alone, and runs in compiles only while on."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tunekit.integrations import inductor_outer_products as outer
from tunekit.runtime import compile_policy


def _angles(inv_freq: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """A rotary embedding's angles, as transformers computes them: an fp32 batched product with K = 1."""
    a = inv_freq[None, :, None].float().expand(positions.shape[0], -1, 1)
    return (a @ positions[:, None, :].float()).transpose(1, 2)


def _outer_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.mm(a, b) + 1


def _products(gm: torch.fx.GraphModule) -> list[str]:
    return [
        str(n.target) for n in gm.graph.nodes if n.target in (torch.ops.aten.mm.default, torch.ops.aten.bmm.default)
    ]


def _rewritten(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> tuple[torch.fx.GraphModule, int]:
    gm = make_fx(fn, tracing_mode="fake")(*args)
    replaced = outer.rewrite(gm.graph)
    gm.recompile()
    return gm, replaced


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_an_outer_product_becomes_a_multiply_with_the_same_bits(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(37, 1, generator=gen).to(dtype), torch.randn(1, 53, generator=gen).to(dtype)
    gm, replaced = _rewritten(_outer_mm, a, b)
    assert replaced == 1 and _products(gm) == []
    assert torch.equal(gm(a, b), _outer_mm(a, b))


def test_rotary_angles_lose_their_batched_gemm_and_keep_their_values() -> None:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 128, 2).float() / 128))
    positions = torch.randint(0, 32768, (4, 97), generator=torch.Generator().manual_seed(1))
    gm, replaced = _rewritten(_angles, inv_freq, positions)
    assert replaced == 1 and _products(gm) == []
    out = gm(inv_freq, positions)
    assert out.shape == (4, 97, 64) and torch.equal(out, _angles(inv_freq, positions))


@pytest.mark.parametrize(
    "shapes",
    [((5, 2), (2, 7)), ((3, 5, 2), (3, 2, 7)), ((4, 1), (1, 4))],
    ids=["mm K=2", "bmm K=2", "mm K=1"],
)
def test_only_products_with_one_inner_element_change(shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    a, b = torch.randn(shapes[0]), torch.randn(shapes[1])
    gm, replaced = _rewritten(torch.matmul, a, b)
    assert replaced == (shapes[0][-1] == 1)
    torch.testing.assert_close(gm(a, b), a @ b, rtol=0, atol=0)


def test_mixed_dtypes_and_integer_products_are_left_alone() -> None:
    a, b = torch.randint(0, 5, (4, 1)), torch.randint(0, 5, (1, 4))
    gm, replaced = _rewritten(torch.mm, a, b)
    assert replaced == 0 and len(_products(gm)) == 1


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No post-grad pass set and tunekit's not installed; the config as it was afterwards."""
    from torch._inductor import config

    monkeypatch.setattr(outer, "_installed", [])
    with config.patch(post_grad_custom_pre_pass=None):
        yield


def test_installed_once_and_its_cache_key_follows_whether_it_rewrites(
    fresh: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch._inductor import config

    assert outer.install() and outer.install()
    installed = config.post_grad_custom_pre_pass
    passes = installed if isinstance(installed, (list, tuple)) else [installed]
    assert len(passes) == 1
    ours = passes[0]
    assert ours.uuid().endswith("-on")
    with outer.disabled():
        assert ours.uuid().endswith("-off") and not outer.active()
    monkeypatch.setattr(compile_policy, "FORCED", frozenset())  # TUNEKIT_COMPILE_OPS set: tunekit's graph changes off
    assert ours.uuid().endswith("-off")


def test_a_users_pass_stays_beside_it(fresh: None) -> None:
    from torch._inductor import config, custom_graph_pass

    if not hasattr(custom_graph_pass, "get_custom_graph_passes"):
        pytest.skip("this torch's Inductor takes one post-grad pass")
    seen: list[int] = []

    def users(graph: torch.fx.Graph) -> None:
        seen.append(len(graph.nodes))

    config.post_grad_custom_pre_pass = users
    assert outer.install()
    installed = config.post_grad_custom_pre_pass
    assert isinstance(installed, list) and installed[0] is users and len(installed) == 2


def test_a_compile_runs_the_rewrite_only_while_on(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._inductor import config

    outer.install()
    calls: list[int] = []
    monkeypatch.setattr(outer, "rewrite", lambda graph: calls.append(1) or 0)
    a, b = torch.randn(6, 3), torch.randn(3, 5)

    def compiled_mm() -> None:
        torch._dynamo.reset()
        with config.patch(force_disable_caches=True):
            torch.testing.assert_close(torch.compile(torch.mm)(a, b), a @ b)

    compiled_mm()
    assert calls == [1]
    with outer.disabled():
        compiled_mm()
    assert calls == [1]


def test_a_failing_rewrite_leaves_the_compile_to_inductor(fresh: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._inductor import config

    outer.install()

    calls: list[int] = []

    def broken(graph: torch.fx.Graph) -> int:
        calls.append(1)
        raise RuntimeError("a graph this pass did not expect")

    monkeypatch.setattr(outer, "rewrite", broken)
    a, b = torch.randn(6, 3), torch.randn(3, 5)
    torch._dynamo.reset()
    with config.patch(force_disable_caches=True):
        torch.testing.assert_close(torch.compile(torch.mm)(a, b), a @ b)
    assert calls == [1]


def test_a_product_whose_values_cannot_be_multiplied_stays_a_gemm() -> None:
    a, b = torch.randn(4, 1), torch.randn(1, 6)
    gm = make_fx(_outer_mm, tracing_mode="fake")(a, b)
    mm = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.mm.default)
    mm.args[1].meta["val"] = torch.randn(2, 6)  # a real tensor of another shape beside a fake one
    assert outer.rewrite(gm.graph) == 0 and len(_products(gm)) == 1
