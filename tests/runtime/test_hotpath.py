"""The eager hot path (tunekit/runtime/hotpath.py): a signature's plan is built once, reused, invalidated on reset,
and gives the full path's results on every op, on odd and strided inputs; calls that need autograd never take it."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable

import pytest
import torch
from fingerprints import gpu
from helpers import check_screens, cli, make_entry
from op_cases import CASES

import tunekit.ops as ops
from tunekit.core import backend
from tunekit.core.errors import CacheMissError
from tunekit.core.registry import get_spec
from tunekit.launch.plan import Replay, TorchCall
from tunekit.ops.declaration import PUBLIC, SELF, DeclaredOp
from tunekit.runtime import compile_policy, dispatch, hotpath
from tunekit.runtime.dispatch import TORCH, Resolution
from tunekit.store.entry import TrialRecord
from tunekit.store.key import CacheKey
from tunekit.store.store import Store


@pytest.fixture(autouse=True)
def _fresh() -> None:
    dispatch.reset_all()
    for hot in hotpath.ops():
        hot.stats = hotpath.Stats()


def _stats(op: Callable[..., object]) -> hotpath.Stats:
    assert isinstance(op, hotpath.HotPath)
    return op.stats


def _leaves(name: str, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen) for s in CASES[name][0]]


def _same(a: object, b: object) -> None:
    if isinstance(a, tuple):
        assert isinstance(b, tuple) and type(a) is type(b)
        for x, y in zip(a, b):
            _same(x, y)
        return
    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    assert a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride()
    assert torch.equal(a, b)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_op_replays_its_full_path(name: str) -> None:
    """Third and later calls are replays; with new data of the same signature they equal the full path bitwise."""
    call = CASES[name][1]
    op = getattr(ops, name)
    for seed in range(3):
        call(*_leaves(name, seed))
    stats = _stats(op)
    assert (stats.watched, stats.plans, stats.replays) == (1, 1, 1), stats
    fresh = _leaves(name, 7)
    replayed = call(*fresh)
    hotpath.forget_plans()
    _same(replayed, call(*fresh))  # after forgetting: the full path


def test_a_plan_is_bound_once_per_signature() -> None:
    w, b = torch.randn(64), torch.randn(64)
    for _ in range(10):
        ops.layer_norm(torch.randn(5, 64), (64,), w, b)
    stats = _stats(ops.layer_norm)
    assert (stats.watched, stats.plans, stats.replays) == (1, 1, 8)
    for _ in range(3):  # another shape is another signature: one more watch and plan
        ops.layer_norm(torch.randn(6, 64), (64,), w, b)
    assert (stats.watched, stats.plans, stats.replays) == (2, 2, 9)


def test_reset_all_forgets_plans() -> None:
    x = torch.randn(4, 40)
    for _ in range(3):
        ops.softmax(x, -1)
    assert _stats(ops.softmax).replays == 1
    dispatch.reset_all()
    for _ in range(2):  # a full call, then a watched one: no replay until a plan is rebuilt
        ops.softmax(x, -1)
    assert _stats(ops.softmax).replays == 1
    ops.softmax(x, -1)
    assert _stats(ops.softmax).replays == 2


@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 3, 1023), (0, 16), (5, 2049)])
def test_odd_shapes(shape: tuple[int, ...]) -> None:
    n = shape[-1]
    w = torch.randn(n)
    outs = [ops.rms_norm(x, (n,), w, 1e-6) for x in [torch.randn(shape) for _ in range(3)]]
    x = torch.randn(shape)
    torch.testing.assert_close(ops.rms_norm(x, (n,), w, 1e-6), torch.nn.functional.rms_norm(x, (n,), w, 1e-6))
    assert len(outs) == 3 and _stats(ops.rms_norm).replays >= 1


def test_strided_input_copies_so_keeps_the_full_path() -> None:
    """A transposed input is copied to rows by the op: a plan would skip the copy, so none is built."""
    x = torch.randn(48, 6).T  # [6, 48], last dim strided
    for _ in range(3):
        y = ops.layer_norm(x, (48,))
    stats = _stats(ops.layer_norm)
    assert stats.plans == 0 and stats.replays == 0 and len(stats.refused) == 1
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (48,)))


def test_offset_views_replay_at_their_own_pointer() -> None:
    """Row slices of one buffer share a signature when aligned alike; each replay reads its own rows."""
    base = torch.randn(64, 32)
    views = [base[i * 8 : i * 8 + 4] for i in range(4)]  # 8 rows * 128 bytes apart: same 16-byte alignment
    outs = [ops.softmax(v, -1) for v in views]
    assert _stats(ops.softmax).replays == 2
    for v, y in zip(views, outs):
        torch.testing.assert_close(y, torch.softmax(v, -1))


def test_aliased_arguments_are_another_signature() -> None:
    a, b = torch.randn(16, 16), torch.randn(16, 16)
    for _ in range(3):
        ops.matmul(a, b)
    ops.matmul(a, a)  # same shapes, one pointer twice: not the plan of (a, b)
    assert _stats(ops.matmul).replays == 1
    torch.testing.assert_close(ops.matmul(a, a), a @ a, atol=1e-3, rtol=1e-3)


def test_autograd_calls_never_take_the_hot_path() -> None:
    w = torch.randn(24, requires_grad=True)
    for _ in range(4):
        y = ops.rms_norm(torch.randn(3, 24), (24,), w, 1e-6)
    stats = _stats(ops.rms_norm)
    assert y.requires_grad and (stats.plans, stats.replays, stats.refused) == (0, 0, {"autograd": 1})
    with torch.no_grad():  # the same tensors' signature without autograd: a plan of its own
        for _ in range(3):
            y = ops.rms_norm(torch.randn(3, 24), (24,), w, 1e-6)
    assert not y.requires_grad and (stats.plans, stats.replays) == (1, 1)


def test_torch_served_signature_calls_torch_directly(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where dispatch serves TORCH, the plan is torch's own op: nothing of tunekit's runs around it."""
    monkeypatch.setattr(dispatch, "resolve", lambda *a: Resolution("torch", TORCH))
    x, w, b = torch.randn(4, 40), torch.randn(40), torch.randn(40)
    for _ in range(3):
        y = ops.layer_norm(x, (40,), w, b)
    plan = ops.layer_norm.plans  # type: ignore[attr-defined]
    assert [type(p) for p in plan.values()] == [TorchCall]
    assert _stats(ops.layer_norm).replays == 1
    torch.testing.assert_close(y, torch.nn.functional.layer_norm(x, (40,), w, b))


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_torch_served_op_replays_torch(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every op's torch equivalent takes the op's own arguments (gelu's approximate positionally, too)."""
    monkeypatch.setattr(dispatch, "resolve", lambda *a: Resolution("torch", TORCH))
    call, op = CASES[name][1], getattr(ops, name)
    leaves = _leaves(name)
    results = [call(*leaves) for _ in range(3)]
    assert [type(p) for p in op.plans.values()] == [TorchCall] and _stats(op).replays == 1
    _same(results[2], results[1])
    torch.testing.assert_close(results[2], CASES[name][2](*leaves))


@pytest.mark.skipif(
    not backend.INTERPRETED,
    reason="in the interpreter any problem is served a kernel; on a GPU an untuned one is torch's",
)
def test_triton_plans_replay_launches() -> None:
    x = torch.randn(4, 40)
    for _ in range(2):
        ops.gelu(x)
    (plan,) = ops.gelu.plans.values()  # type: ignore[attr-defined]
    assert isinstance(plan, Replay) and len(plan.fires) == 1 and len(plan.allocations) == 1


def test_record_problems_bypasses_plans(tmp_path: object) -> None:
    """Recording problems needs every call to reach dispatch: plans step aside while a recorder is active."""
    import tunekit

    x = torch.randn(4, 40)
    for _ in range(3):
        ops.softmax(x, -1)
    with tunekit.record_problems() as recorded:
        ops.softmax(x, -1)
    assert any(kernel == "softmax" for kernel, _ in recorded.problems)


def test_bench_host_needs_a_gpu_and_says_so() -> None:
    """The benchmark command times eager launches; on the CPU it refuses in one line."""

    result = cli("bench-host")
    assert result.exit_code == 1 and "needs a CUDA GPU" in result.output and result.output.count("\n") == 1


# The ops that train eagerly through an autograd Function of their own (the rest through their custom op).
EAGER_TRAINED = sorted(name for name, op in PUBLIC.items() if op.eager is not None)


def _bodies_and_plans(name: str) -> tuple[int, int]:
    """The inner bodies an eager training step replays, and the plans each holds: a forward body and a backward
    body, one plan each; an op whose gradients run through itself (GEMM: forward, dA, dB) one body with three
    plans; an op whose backward is torch ops on a saved buffer (cross-entropy) its forward body alone."""
    through = PUBLIC[name].declaration.autograd.through  # type: ignore[union-attr]
    if through == SELF:
        return 1, 3
    return (2, 1) if isinstance(through, DeclaredOp) else (1, 1)


@pytest.mark.parametrize("name", EAGER_TRAINED)
def test_eager_training_replays_the_forward_and_backward_bodies(name: str) -> None:
    """The public op never plans an autograd call, but the bodies its eager autograd Function runs (grad mode off)
    do: after a few steps (the op's own watched step runs them as they are), forward and backward are replays, with
    the full path's bits; reset forgets them."""
    leaves = [t.requires_grad_() for t in _leaves(name)]
    call = CASES[name][1]
    inner = hotpath._INNER
    for hot in inner:
        hot.stats = hotpath.Stats()
    steps = []
    for _ in range(5):
        y = call(*leaves)
        dy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
        steps.append((y.detach(), *torch.autograd.grad(y, leaves, dy)))
    for step in steps[1:]:
        _same(step, steps[0])
    used = [hot for hot in inner if hot.stats.replays]
    bodies, plans = _bodies_and_plans(name)
    assert len(used) == bodies and all(h.stats.plans == plans and h.stats.replays >= 2 for h in used), [
        h.stats for h in inner
    ]
    dispatch.reset_all()
    assert all(not hot.plans for hot in inner)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_torch_served_training_call_becomes_torch_own_op(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Served TORCH throughout, a call that autograd records has torch's own op as its plan: torch records the
    graph itself, the gradients are torch's, and nothing of tunekit's runs around it."""
    monkeypatch.setattr(dispatch, "resolve", lambda *a: Resolution("torch", TORCH))
    op = getattr(ops, name)
    leaves = [t.requires_grad_() for t in _leaves(name)]
    call, torch_call = CASES[name][1], CASES[name][2]
    grads = []
    for _ in range(3):
        grads.append(torch.autograd.grad(call(*leaves).sum(), leaves))
    assert [type(p) for p in op.plans.values()] == [TorchCall]
    assert _stats(op).replays == 1
    want = torch.autograd.grad(torch_call(*leaves).sum(), leaves)
    for got in grads:
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w)


def test_a_training_call_with_a_tunekit_backward_is_never_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forward served TORCH but the backward problem served a kernel: the call's graph runs tunekit's backward, so
    it keeps the full path (a torch plan would swap in torch's backward)."""
    real = dispatch.resolve
    monkeypatch.setattr(
        dispatch, "resolve", lambda spec, *a: Resolution("torch", TORCH) if spec.name == "layernorm" else real(spec, *a)
    )
    leaves = [t.requires_grad_() for t in _leaves("layer_norm")]
    for _ in range(3):
        y = CASES["layer_norm"][1](*leaves)
    assert type(y.grad_fn).__name__.startswith("LayerNormEager")
    stats = _stats(ops.layer_norm)
    assert (stats.plans, stats.replays, stats.refused) == (0, 0, {"autograd": 1})


# A GPU with no shipped database: nothing of tunekit's can serve there until something is tuned for it.
_UNTUNED_GPU = gpu("nvidia", "NVIDIA A-GPU-nothing-ships-for", "8.9", 128, 101376, 75497472, "12.8")


def _on_untuned_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dispatch, "fingerprint", lambda: _UNTUNED_GPU)
    dispatch.reset_all()


def test_an_op_torch_serves_everywhere_calls_torch_with_no_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU where no kernel of the op has an entry (the default policy serves torch), a call is torch's own:
    no signature, no problem key, no dispatch lookup."""
    _on_untuned_gpu(monkeypatch)

    def no_lookup(*_: object) -> None:
        raise AssertionError("dispatch was consulted")

    monkeypatch.setattr(dispatch.Dispatcher, "config", no_lookup)
    x, w, b = torch.randn(4, 40), torch.randn(40), torch.randn(40)
    for _ in range(3):
        torch.testing.assert_close(ops.layer_norm(x, (40,), w, b), torch.nn.functional.layer_norm(x, (40,), w, b))
    assert _stats(ops.layer_norm).torch_direct == 3 and not ops.layer_norm.plans  # type: ignore[attr-defined]


def _entry_serving_a_kernel(kernel: str, problem: dict[str, object]) -> None:
    """Store an entry of `kernel` for `problem` on the untuned GPU that dispatch would serve (its own source hash,
    no torch time, not launch-bound)."""
    spec = get_spec(kernel)
    config = dict(spec.heuristic(problem, _UNTUNED_GPU))
    entry = make_entry(_UNTUNED_GPU, 1.0, problem=problem)
    key = CacheKey.make(kernel, spec.source_hash, _UNTUNED_GPU.key, problem)
    entry = dataclasses.replace(entry, key=key, config=config, trials=(TrialRecord(config, "ok", 1.0),))
    with Store() as store:
        store.put(entry)
        assert [e.key for e in store.entries()] == [key]  # a valid entry: stored and read back
    dispatch.reset_all()


_LN_PROBLEM = {"rows": 4, "cols": 40, "dtype": "float32", "weight": True, "bias": False}


def test_an_entry_of_the_forward_kernel_keeps_the_dispatch_path_for_its_row_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After an entry serving the forward kernel lands (reset_all, as after an import), calls of its row length
    take the dispatch path again; calls of another row length (the screen) and other ops stay torch's own."""
    _on_untuned_gpu(monkeypatch)
    x, w, other = torch.randn(4, 40), torch.randn(40), torch.randn(4, 24)
    ops.layer_norm(x, (40,), w)
    assert _stats(ops.layer_norm).torch_direct == 1
    _entry_serving_a_kernel("layernorm", _LN_PROBLEM)
    monkeypatch.setattr(dispatch, "resolve", lambda *a: Resolution("torch", TORCH))
    for _ in range(2):
        ops.layer_norm(x, (40,), w)
        ops.layer_norm(other, 24, torch.randn(24))
        ops.rms_norm(x, (40,), w)
    assert _stats(ops.layer_norm).torch_direct == 3 and len(ops.layer_norm.plans) == 1  # type: ignore[attr-defined]
    assert _stats(ops.rms_norm).torch_direct == 2


def test_a_call_screened_out_never_consults_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    _on_untuned_gpu(monkeypatch)
    _entry_serving_a_kernel("layernorm", _LN_PROBLEM)

    def no_lookup(*_: object) -> None:
        raise AssertionError("dispatch was consulted")

    monkeypatch.setattr(dispatch.Dispatcher, "config", no_lookup)
    x, w, b = torch.randn(3, 2, 12), torch.randn(2, 12), torch.randn(2, 12)
    for _ in range(3):  # normalized over two dims: 24 elements a row, not 40
        want = torch.nn.functional.layer_norm(x, (2, 12), w, b)
        torch.testing.assert_close(ops.layer_norm(x, normalized_shape=(2, 12), weight=w, bias=b), want)
    assert _stats(ops.layer_norm).torch_direct == 3 and not ops.layer_norm.plans  # type: ignore[attr-defined]


def test_a_gemm_entry_keeps_only_the_token_counts_its_bucket_may_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GEMM entry at the bucket edge m = 16 may serve its own m and, through the bucket layer, 9..15 (the counts
    above the edge before it): linear calls of those keep the dispatch path; the same n and k at 3 or 40 tokens
    (an edge no entry holds) call torch directly."""
    from tunekit.kernels.gemm import SPEC, make_problem

    assert SPEC.token_buckets is not None
    ceiling = SPEC.token_buckets.ceiling
    assert [ceiling(m) for m in (1, 3, 4, 9, 16, 17, 300, 385, 1 << 21)] == [1, 4, 4, 16, 16, 32, 384, 512, 1 << 21]
    _on_untuned_gpu(monkeypatch)
    _entry_serving_a_kernel("gemm", make_problem(16, 24, 40, "float32", b_layout="col"))
    monkeypatch.setattr(dispatch, "resolve", lambda *a: Resolution("torch", TORCH))
    w = torch.randn(24, 40)
    for rows in (16, 3, 12, 40):
        for _ in range(2):
            ops.linear(torch.randn(rows, 40), w)
    assert _stats(ops.linear).torch_direct == 4  # 3 and 40 tokens: no entry may serve them
    assert len(ops.linear.plans) == 2  # type: ignore[attr-defined]


def test_a_reduction_entry_keeps_only_its_own_op_and_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sum entry for 4 rows of 40 (the reduction's whole key: op, axis, bucketed rows, cols, dtype) keeps sums of
    that problem on the dispatch path; a mean, a max or a sum over other rows calls torch directly."""
    _on_untuned_gpu(monkeypatch)
    problem = {"op": "sum", "axis": "inner", "batch": 1, "rows": 4, "cols": 40, "dtype": "float32"}
    _entry_serving_a_kernel("reduction", problem)
    monkeypatch.setattr(dispatch, "resolve", lambda *a: Resolution("torch", TORCH))
    x, other = torch.randn(3, 40), torch.randn(9, 40)  # 3 rows: bucket 4; 9 rows: bucket 16
    for _ in range(2):
        ops.sum(x, -1)
        ops.mean(x, -1)
        ops.max(x, 1)
        ops.sum(other, 1)
    assert _stats(ops.sum).torch_direct == 2 and len(ops.sum.plans) == 1  # type: ignore[attr-defined]
    assert _stats(ops.mean).torch_direct == 2 and _stats(ops.max).torch_direct == 2


def test_a_backward_entry_keys_training_calls_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry of the backward kernel alone: a call without autograd is torch's own (the forward kernel serves
    no problem here), a call that trains takes the dispatch path, which decides forward and backward."""
    _on_untuned_gpu(monkeypatch)
    _entry_serving_a_kernel("layernorm_backward", _LN_PROBLEM)
    seen: list[str] = []
    config = dispatch.Dispatcher.config
    monkeypatch.setattr(dispatch.Dispatcher, "config", lambda self, key: seen.append(self.kernel) or config(self, key))
    monkeypatch.setattr(dispatch, "resolve", lambda *a: Resolution("torch", TORCH))
    x, w = torch.randn(4, 40), torch.randn(40)
    ops.layer_norm(x, (40,), w)
    assert _stats(ops.layer_norm).torch_direct == 1 and not seen
    ops.layer_norm(x.requires_grad_(), (40,), w).sum().backward()
    assert _stats(ops.layer_norm).torch_direct == 1 and "layernorm_backward" in seen


def test_every_screen_holds_for_the_problems_its_op_dispatches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The screen of each op (a value from its arguments, checked before any signature) equals that value of every
    problem its forward kernel resolves in the full path, here on every op's case and on other dims and layouts
    (tests/ops/test_fuzz_ops.py checks the same on every fuzzed call)."""
    checked = check_screens(monkeypatch)
    for name, (_, call, _) in CASES.items():
        call(*_leaves(name))
    x = torch.randn(4, 6, 10)
    ops.softmax(x, 1)
    ops.log_softmax(x.transpose(0, 2), 0)
    ops.sum(x, (1, 2))
    ops.sum(x, None)
    ops.mean(x, 0, keepdim=True)
    ops.max(x, 1)
    ops.layer_norm(x, (6, 10))
    ops.rms_norm(x, 10, torch.randn(10))
    ops.gelu(x)
    ops.bias_act(x, None, "relu")
    ops.linear(x, torch.randn(7, 10))
    ops.matmul(torch.randn(5, 10), torch.randn(10, 3).t().contiguous().t())
    ops.swiglu(x, torch.randn(4, 6, 10))
    q, k = torch.randn(2, 5, 3, 8), torch.randn(2, 5, 1, 8)
    ops.rotary_embedding(q, k, torch.randn(2, 5, 8), torch.randn(2, 5, 8), unsqueeze_dim=2)
    assert set(checked) == {hot.name for hot in hotpath.ops()}


@pytest.mark.parametrize("variable", ["TUNEKIT_UNTUNED=triton", "TUNEKIT_TUNE_ON_MISS=1", "TUNEKIT_STRICT=1"])
def test_policies_that_may_serve_triton_keep_the_dispatch_path(variable: str, monkeypatch: pytest.MonkeyPatch) -> None:
    name, _, value = variable.partition("=")
    monkeypatch.setenv(name, value)
    _on_untuned_gpu(monkeypatch)
    monkeypatch.setattr(dispatch, "resolve", lambda *a: Resolution("torch", TORCH))
    with contextlib.suppress(CacheMissError):  # strict mode refuses the untuned problem: dispatch was consulted
        ops.softmax(torch.randn(4, 40), -1)
    assert _stats(ops.softmax).torch_direct == 0


def test_compiled_calls_trace_torch_where_torch_serves_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torch.compile, an op nothing of tunekit's can serve is traced as torch's own ops (which the compiler
    can fuse), not as tunekit's opaque custom op; once a kernel of it has an entry, the custom op is back where the
    compile policy swaps the op under compile, and only there."""
    _on_untuned_gpu(monkeypatch)
    x, w = torch.randn(4, 40), torch.randn(40)
    targets: list[str] = []

    def backend(gm: torch.fx.GraphModule, _: object) -> Callable[..., object]:
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    ops.rms_norm(x, (40,), w)  # the eager call that decides
    torch._dynamo.reset()
    compiled = torch.compile(lambda t: ops.rms_norm(t, (40,), w, 1e-6), fullgraph=True, backend=backend)
    torch.testing.assert_close(compiled(x), torch.nn.functional.rms_norm(x, (40,), w, 1e-6))
    assert targets and not any("tunekit" in t for t in targets), targets

    entry = make_entry(_UNTUNED_GPU, 1.0)
    with Store() as store:
        store.put(dataclasses.replace(entry, key=dataclasses.replace(entry.key, kernel="rmsnorm")))
    dispatch.reset_all()
    ops.rms_norm(x, (40,), w)
    monkeypatch.setattr(compile_policy, "FORCED", frozenset())  # not forced, nor measured: torch's ops still
    targets.clear()
    torch.testing.assert_close(compiled(x), torch.nn.functional.rms_norm(x, (40,), w, 1e-6))
    assert not any("tunekit" in t for t in targets), targets  # (no recompile: the graph never read the decision)
    monkeypatch.setattr(compile_policy, "FORCED", frozenset({"rms_norm"}))
    torch._dynamo.reset()
    targets.clear()
    torch.testing.assert_close(compiled(x), torch.nn.functional.rms_norm(x, (40,), w, 1e-6))
    assert any("tunekit" in t for t in targets), targets
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------- patched modules


def _patched(family: str = "llama") -> tuple[torch.nn.Module, torch.nn.Module]:
    """(a tiny model, a patched copy) in eval mode. Llama: Linear swapped by class, RMSNorm found by structure;
    GPT-2: LayerNorm by class, Conv1D found by structure (guarded), its GELU fused into the projection before it."""
    pytest.importorskip("transformers")
    import copy

    import transformers
    from helpers import tiny_llama

    from tunekit.integrations.patching import patch

    torch.manual_seed(0)
    if family == "llama":
        own = tiny_llama(1).eval()
    else:
        config = transformers.GPT2Config(n_embd=64, n_layer=1, n_head=4, vocab_size=128)
        own = transformers.GPT2LMHeadModel(config).eval()
    own = own.to(backend.torch_device())  # the kernels' device: where patched modules call their ops
    patched = copy.deepcopy(own)
    assert patch(patched).swapped
    return own, patched


def _decode(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens.to(backend.torch_device()), use_cache=False).logits


@pytest.mark.parametrize(("family", "keyed", "linears"), [("llama", 11, 8), ("gpt2", 8, 1)])
def test_a_patched_modules_repeated_torch_call_skips_its_checks(
    family: str, keyed: int, linears: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module call whose op served torch's own op directly keeps its key; the next call of that key is that torch
    call at once (no runs_here, no screen), counted as torch-direct, with the full path's bits."""
    from tunekit import nn as tk_nn

    _on_untuned_gpu(monkeypatch)
    own, patched = _patched(family)
    tokens = torch.randint(0, 128, (4, 1))
    full = _decode(patched, tokens)  # the full path; keys kept
    torch.testing.assert_close(full, _decode(own, tokens), rtol=1e-3, atol=1e-3)
    assert sum(tk_nn.TORCH_CALL in m.__dict__ for m in patched.modules()) == keyed
    checks: list[int] = []
    monkeypatch.setattr(tk_nn, "runs_here", lambda *a: checks.append(1) or True)
    before = _stats(ops.linear).torch_direct
    torch.testing.assert_close(_decode(patched, tokens), full, rtol=0, atol=0)
    assert not checks and _stats(ops.linear).torch_direct == before + linears
    _decode(patched, torch.randint(0, 128, (2, 1)))  # another batch: another key, the full path
    assert checks


@pytest.mark.parametrize("leaves", ["grad", "recording", "reset", "copy"])
def test_the_torch_shortcut_leaves_calls_that_need_the_full_path(leaves: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls whose gradients flow, a recording's calls (whose problems it records), calls after a reset (entries
    may have landed) and a copy's calls (its keys hold another process's epoch) take the full path."""
    import copy

    from tunekit import nn as tk_nn
    from tunekit.runtime.recorder import record_problems

    _on_untuned_gpu(monkeypatch)
    _, patched = _patched()
    tokens = torch.randint(0, 128, (4, 1))
    _decode(patched, tokens)
    checks: list[int] = []
    monkeypatch.setattr(tk_nn, "runs_here", lambda *a: checks.append(1) or True)
    if leaves == "grad":
        patched(tokens.to(backend.torch_device()), use_cache=False).logits.sum().backward()
    elif leaves == "recording":
        with record_problems() as recording:
            _decode(patched, tokens)
        assert recording.problems
    elif leaves == "reset":
        dispatch.reset_all()
        _decode(patched, tokens)
    else:
        _decode(copy.deepcopy(patched), tokens)
    assert checks


def test_a_swapped_rope_functions_repeated_torch_call_skips_its_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The RoPE function a patched attention calls keeps the key of a call the op served torch's formula: the next
    call of that key is that formula at once (no width check, no guard), with the full path's bits."""
    from tunekit.integrations import patching_rope

    _on_untuned_gpu(monkeypatch)
    _, patched = _patched()
    tokens = torch.randint(0, 128, (4, 1))
    full = _decode(patched, tokens)
    checks: list[int] = []
    monkeypatch.setattr(patching_rope, "_same_width", lambda *a: checks.append(1) or True)
    before = _stats(ops.rotary_embedding).torch_direct
    torch.testing.assert_close(_decode(patched, tokens), full, rtol=0, atol=0)
    assert not checks and _stats(ops.rotary_embedding).torch_direct == before + 1  # one layer, one call
    _decode(patched, torch.randint(0, 128, (2, 1)))
    assert checks


def test_tunekit_nn_modules_take_the_torch_shortcut(monkeypatch: pytest.MonkeyPatch) -> None:
    """tunekit.nn's modules, built by a user, keep the key of a call torch served as patched ones do."""
    from tunekit import nn as tk_nn

    _on_untuned_gpu(monkeypatch)
    device = backend.torch_device()
    modules = [tk_nn.LayerNorm(64), tk_nn.RMSNorm(64), tk_nn.Linear(64, 32, activation="silu")]
    x = torch.randn(4, 64, device=device)
    with torch.no_grad():
        full = [m.to(device)(x) for m in modules]
        checks: list[int] = []
        monkeypatch.setattr(tk_nn, "runs_here", lambda *a: checks.append(1) or True)
        for module, want in zip(modules, full):
            assert tk_nn.TORCH_CALL in module.__dict__
            torch.testing.assert_close(module(x), want, rtol=0, atol=0)
        assert not checks
        modules[2](x, torch.randn(4, 32, device=device))  # a residual: the full path
    assert checks
