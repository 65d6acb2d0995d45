# Adapted from Triton's autotuner tests:
#   https://github.com/triton-lang/triton/blob/009401737888df54cfa5427fab82b0f12d47a35b/python/test/unit/runtime/test_autotuner.py
#   (repository triton-lang/triton, commit 009401737888df54cfa5427fab82b0f12d47a35b; see the docstring for the version)
#
# Copyright 2018-2020 Philippe Tillet
# Copyright 2020-2022 OpenAI
#
# Permission is hereby granted, free of charge, to any person obtaining
# a copy of this software and associated documentation files
# (the "Software"), to deal in the Software without restriction,
# including without limitation the rights to use, copy, modify, merge,
# publish, distribute, sublicense, and/or sell copies of the Software,
# and to permit persons to whom the Software is furnished to do so,
# subject to the following conditions:
#
# The above copyright notice and this permission notice shall be
# included in all copies or substantial portions of the Software.
#
# THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND,
# EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF
# MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT.
# IN NO EVENT SHALL THE AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY
# CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT,
# TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE
# SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
"""Triton's own autotuner tests, run with `triton.autotune` replaced by `tunekit.autotune`.

Source: python/test/unit/runtime/test_autotuner.py of triton-lang/triton at commit 0094017 (the newest version the
reference index holds; the v3.6.0 tag's copy could not be fetched here). It is a superset of what Triton 3.6.0
(constraints.txt) tests: it also tests None tensors in reset_to_zero/restore_value, a fractional top_k of the configs
early pruning left (at least one), and no benchmark when pruning leaves one config. tunekit follows those too.

Adapted, and nothing else changed: kernels run in Triton's interpreter on CPU tensors (the `device` fixture), so
`do_bench` times one wall-clock run where there is no GPU; `is_cuda()` is "not interpreted"; an error is tunekit's
one-line TunekitError where Triton raises its AutotunerError (same rule, test_prune_all_configs). The kernels several
tests define alike (`_copy`, `_copy_rows`, `_store_ones`) are defined once; each test wraps them in its own autotuner.

Not taken, and why:
- test_kwargs[use_cuda_graph=True]: needs CUDA graphs; xfails without CUDA, as in Triton.
- test_prune_configs_fractional_top_k_after_early_prune builds Triton's private `triton.runtime.Autotuner` around a
  fake kernel object; its contract (top_k a fraction of the configs early pruning left, estimated and benchmarked in
  order) is tested here through `tunekit.autotune` on a real kernel instead.
- test_pruned_single_config_skips_benchmark: its `fresh_knobs` part (Triton's knobs.autotuning.print and listener,
  private state of Triton's conftest) does not apply; the rest (no benchmark, the one config launched) is here.
- test_config_ir_override_changes_disk_cache_key: tests `triton.Config.__str__` (Triton's on-disk result cache key),
  not the autotuner; tunekit keys configs as data and `ir_override` is a stored string field.
- test_override_ttir, test_override_ttgir, test_override_ptx: replace the compiled IR on an sm90 GPU; the interpreter
  compiles nothing.
- test_exceed_tmem (Blackwell tensor memory) and test_exceed_threads (num_warps=128 out of resources): GPU resource
  limits the interpreter does not have.
"""

from __future__ import annotations

import time

import pytest
import torch
import triton
import triton.language as tl

import tunekit
from tunekit.core import backend
from tunekit.core.errors import TunekitError


@pytest.fixture
def device() -> str:
    return backend.torch_device().type


def is_cuda() -> bool:
    return not backend.INTERPRETED


def do_bench(kernel_call, quantiles, use_cuda_graph=False):
    if use_cuda_graph:
        return triton.testing.do_bench_cudagraph(kernel_call, quantiles=quantiles)
    if is_cuda():
        return triton.testing.do_bench(kernel_call, quantiles=quantiles, warmup=1, rep=1)
    start = time.perf_counter()  # the interpreter has no GPU timer: one run, wall clock
    kernel_call()
    ms = (time.perf_counter() - start) * 1e3
    return [ms, ms, ms]


def _two_configs(block: str) -> list[triton.Config]:
    """The two configs most of Triton's tests tune over: `block` 32 and 128."""
    return [triton.Config(kwargs={block: 32}), triton.Config(kwargs={block: 128})]


def _grid_over(n: int, block: str):
    """The 1-D grid Triton's tests launch: cdiv(n, the config's `block`)."""
    return lambda META: (triton.cdiv(n, META[block]),)


@triton.jit
def _copy_rows(dst, src, stride_m: tl.constexpr, M, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_M: tl.constexpr):
    offsets_m = tl.program_id(0) * stride_m + tl.arange(0, BLOCK_SIZE_M)
    offsets_n = tl.arange(0, BLOCK_SIZE_N)
    x = tl.load(src + offsets_m[:, None] * BLOCK_SIZE_N + offsets_n[None, :])
    tl.store(dst + offsets_m[:, None] * BLOCK_SIZE_N + offsets_n[None, :], x)


@triton.jit
def _copy(dst, src, N, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    x = tl.load(src + offsets, mask=offsets < N)
    tl.store(dst + offsets, x, mask=offsets < N)


@triton.jit
def _store_ones(src, dst, N, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < N
    if src is not None:
        tl.store(src + offsets, tl.full([BLOCK_SIZE], 1, dtype=src.dtype.element_ty), mask=mask)
    else:
        tl.store(dst + offsets, tl.full([BLOCK_SIZE], 1, dtype=dst.dtype.element_ty), mask=mask)


def _store_ones_with_hook(hook: str, src, dst, N: int, pass_kwargs_to_kernel: bool) -> None:
    """Tune `_store_ones` with `src` listed under `hook` (reset_to_zero or restore_value); dst must end all ones."""
    configs = _two_configs("BLOCK_SIZE")
    _kernel = tunekit.autotune(configs=configs, key=["N"], do_bench=do_bench, **{hook: ["src"]})(_store_ones)
    grid = _grid_over(N, "BLOCK_SIZE")
    if pass_kwargs_to_kernel:
        _kernel[grid](src=src, dst=dst, N=N)
    else:
        _kernel[grid](src, dst, N)
    triton.testing.assert_close(dst, torch.ones_like(dst))


@pytest.mark.parametrize("use_cuda_graph", [False, True])
def test_kwargs(use_cuda_graph: bool, device: str):
    if use_cuda_graph and not torch.cuda.is_available():
        pytest.xfail("CUDA is not available")

    M, N = 1024, 16
    src = torch.randn(M * N, device=device)
    dst = torch.empty(M * N, device=device)

    _kernel = tunekit.autotune(
        configs=_two_configs("BLOCK_SIZE_M"),
        key=["M"],
        do_bench=lambda kernel, quantiles: do_bench(kernel, quantiles, use_cuda_graph),
    )(_copy_rows)

    grid = _grid_over(N, "BLOCK_SIZE_M")
    _kernel[grid](dst, src, N, M, N)
    # the key word args could be in arbitrary order.
    _kernel[grid](dst=dst, src=src, M=M // 2, stride_m=N, BLOCK_SIZE_N=N)
    assert len(_kernel.cache) == 2


def test_dtype_cache_results(device: str):
    M, N = 1024, 16
    src = torch.randn(M * N, device=device)
    dst = torch.empty(M * N, device=device)

    @tunekit.autotune(configs=_two_configs("BLOCK_SIZE_M"), key=["DTYPE"], cache_results=True)
    @triton.jit
    def _kernel(
        dst, src, stride_m: tl.constexpr, DTYPE: tl.constexpr, BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_M: tl.constexpr
    ):
        offsets_m = tl.program_id(0) * stride_m + tl.arange(0, BLOCK_SIZE_M)
        offsets_n = tl.arange(0, BLOCK_SIZE_N)
        x = tl.load(src + offsets_m[:, None] * BLOCK_SIZE_N + offsets_n[None, :])
        x = x.to(DTYPE)
        tl.store(dst + offsets_m[:, None] * BLOCK_SIZE_N + offsets_n[None, :], x)

    _kernel[_grid_over(N, "BLOCK_SIZE_M")](dst, src, N, tl.float32, N)
    assert len(_kernel.cache) == 1


def test_no_do_bench(device: str):
    M, N = 1024, 16
    src = torch.randn(M * N, device=device)
    dst = torch.empty(M * N, device=device)

    _kernel = tunekit.autotune(configs=_two_configs("BLOCK_SIZE_M"), key=["M"])(_copy_rows)
    _kernel[_grid_over(N, "BLOCK_SIZE_M")](dst, src, N, M, N)
    assert len(_kernel.cache) == 1


@pytest.mark.parametrize("pass_kwargs_to_kernel", [False, True])
def test_restore(pass_kwargs_to_kernel, device):
    N = 1024
    src = torch.zeros(N, device=device)

    configs = _two_configs("BLOCK_SIZE")

    @tunekit.autotune(configs=configs, key=["N"], restore_value=["src"], do_bench=do_bench)
    @triton.jit
    def _kernel(src, N, BLOCK_SIZE: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
        x = tl.load(src + offsets, mask=offsets < N) + 1
        tl.store(src + offsets, x, mask=offsets < N)

    grid = _grid_over(N, "BLOCK_SIZE")
    if pass_kwargs_to_kernel:
        _kernel[grid](src=src, N=N)
    else:
        _kernel[grid](src, N)
    triton.testing.assert_close(src, torch.ones_like(src))


@pytest.mark.parametrize("src_is_none", [False, True])
@pytest.mark.parametrize("pass_kwargs_to_kernel", [False, True])
def test_reset_to_zero(pass_kwargs_to_kernel, src_is_none, device):
    # Kernels often take optional tensor args (e.g. an extra buffer used only
    # when a constexpr flag is set), and idiomatically pass None when the arg
    # is unused. Such an arg may still be listed for reset_to_zero because some
    # call sites do mutate it. The autotuner's default pre-hook must skip None.
    N = 1024
    dst = torch.full((N,), 2.0, device=device)
    src = None if src_is_none else dst
    _store_ones_with_hook("reset_to_zero", src, dst, N, pass_kwargs_to_kernel)


@pytest.mark.parametrize("pass_kwargs_to_kernel", [False, True])
def test_restore_with_none(pass_kwargs_to_kernel, device):
    # Kernels often take optional tensor args (e.g. an extra buffer used only
    # when a constexpr flag is set), and idiomatically pass None when the arg
    # is unused. Such an arg may still be listed in restore_value because some
    # call sites do mutate it. The autotuner's default pre/post hooks must
    # skip None entries instead of crashing with
    # "AttributeError: 'NoneType' object has no attribute 'clone'".
    N = 1024
    src = None
    dst = torch.full((N,), 2.0, device=device)
    _store_ones_with_hook("restore_value", src, dst, N, pass_kwargs_to_kernel)


def test_hooks(device):
    # Autotuner's pre- and post- hooks should be called the same number of times
    N = 4096
    src = torch.zeros(N, device=device)

    configs = [triton.Config(kwargs={"BLOCK_SIZE": 4096}), triton.Config(kwargs={"BLOCK_SIZE": 32})]

    values = {"counter": 0, "has_exception": False}

    def _pre_hook(*args, **kwargs):
        values["counter"] += 1

    def _post_hook(*args, exception):
        values["counter"] -= 1
        if exception is not None:
            values["has_exception"] = True
        assert values["counter"] == 0

    @tunekit.autotune(configs=configs, key=["N"], do_bench=do_bench, pre_hook=_pre_hook, post_hook=_post_hook)
    @triton.heuristics({"N_STAGES": lambda nargs: 64 if nargs["N"] == 4096 else 4})
    @triton.jit
    def _kernel(src, N, N_STAGES: tl.constexpr, BLOCK_SIZE: tl.constexpr):
        offsets = tl.arange(0, BLOCK_SIZE)
        max_iters = tl.cdiv(N, BLOCK_SIZE)
        for _ in tl.range(max_iters, num_stages=N_STAGES):
            x = tl.load(src + offsets, mask=offsets < N)
            tl.store(src + offsets, x, mask=offsets < N)
            offsets += BLOCK_SIZE

    _kernel[(1,)](src, N)

    # On NVIDIA GPUs:
    # This will cause out of resources when N_STAGES = 64
    # shared memory bytes = N_STAGES * BLOCK_SIZE * sizeof(float)
    # (the interpreter has no shared memory: no config fails there)
    if is_cuda():
        assert values["has_exception"] is True
    else:
        assert values["has_exception"] is False


@pytest.mark.parametrize("with_perf_model", [False, True])
def test_prune_configs(with_perf_model: bool, device: str):
    N = 1024
    src = torch.randn(N, device=device)
    dst = torch.empty(N, device=device)
    records = {}

    def early_config_prune(configs, named_args, **kwargs):
        records["run_early_config_prune"] = True
        if "N" in kwargs and kwargs["N"] == 1024:
            records["capture_kwargs"] = True
        if "dst" in named_args and "src" in named_args and len(named_args) == 2:
            records["capture_named_args"] = True
        return [configs[0]]

    def perf_model(*args, **kwargs):
        records["run_perf_model"] = True
        return kwargs["BLOCK_SIZE"]

    configs = _two_configs("BLOCK_SIZE")

    if with_perf_model:
        prune_configs_by = {"perf_model": perf_model, "top_k": 1}
    else:
        prune_configs_by = {"early_config_prune": early_config_prune}

    _kernel = tunekit.autotune(configs=configs, key=["N"], prune_configs_by=prune_configs_by, do_bench=do_bench)(_copy)

    grid = _grid_over(N, "BLOCK_SIZE")
    _kernel[grid](dst, src, N=N)
    torch.testing.assert_close(src, dst)
    if with_perf_model:
        assert len(records) == 1
        assert records["run_perf_model"]
    else:
        assert len(records) == 3
        assert records["run_early_config_prune"]
        assert records["capture_kwargs"]
        assert records["capture_named_args"]


def test_prune_configs_fractional_top_k_keeps_one(device: str):
    # A fractional top_k that rounds down to zero for a small config set must
    # still keep one config instead of pruning them all and crashing the later
    # min() on an empty set: here int(2 * 0.3) == 0.
    N = 1024
    src = torch.randn(N, device=device)
    dst = torch.empty(N, device=device)

    def perf_model(*args, **kwargs):
        return kwargs["BLOCK_SIZE"]

    configs = _two_configs("BLOCK_SIZE")
    prune_configs_by = {"perf_model": perf_model, "top_k": 0.3}

    _kernel = tunekit.autotune(configs=configs, key=["N"], prune_configs_by=prune_configs_by, do_bench=do_bench)(_copy)

    grid = _grid_over(N, "BLOCK_SIZE")
    _kernel[grid](dst, src, N=N)
    torch.testing.assert_close(src, dst)


def test_prune_configs_fractional_top_k_after_early_prune(device: str):
    # Triton's test drives its private Autotuner class around a fake kernel; the same contract through the decorator,
    # with a kernel that writes the BLOCK_SIZE it was launched with.
    configs = [triton.Config(kwargs={"BLOCK_SIZE": block_size}) for block_size in range(1, 11)]
    estimated = []
    benchmarked = []
    launched = torch.zeros(1, dtype=torch.int32, device=device)

    def do_bench(kernel_call, quantiles):
        kernel_call()
        benchmarked.append(int(launched[0]))
        return [benchmarked[-1]] * 3

    def early_config_prune(configs, named_args, **kwargs):
        return configs[:6]

    def perf_model(*args, **kwargs):
        estimated.append(kwargs["BLOCK_SIZE"])
        return kwargs["BLOCK_SIZE"]

    prune_configs_by = {"early_config_prune": early_config_prune, "perf_model": perf_model, "top_k": 0.5}

    @tunekit.autotune(configs=configs, key=[], do_bench=do_bench, prune_configs_by=prune_configs_by)
    @triton.jit
    def _kernel(out, BLOCK_SIZE: tl.constexpr):
        tl.store(out, BLOCK_SIZE)

    _kernel[(1,)](launched)

    assert estimated == list(range(1, 7))
    assert benchmarked == [1, 2, 3]
    assert _kernel.best_config == configs[0]


@pytest.mark.parametrize("prune_kind", ["early_config_prune", "perf_model"])
def test_pruned_single_config_skips_benchmark(prune_kind: str, device: str):
    N = 1024
    src = torch.randn(N, device=device)
    dst = torch.empty(N, device=device)
    records = {}
    configs = _two_configs("BLOCK_SIZE")

    def do_not_bench(kernel_call, quantiles):
        records["run_do_bench"] = True
        raise AssertionError("autotune benchmark should be skipped for a single pruned config")

    if prune_kind == "early_config_prune":

        def early_config_prune(configs, named_args, **kwargs):
            records["run_early_config_prune"] = True
            return [configs[1]]

        prune_configs_by = {"early_config_prune": early_config_prune}
    else:

        def perf_model(*args, **kwargs):
            records["run_perf_model"] = True
            return 0 if kwargs["BLOCK_SIZE"] == 128 else 1

        prune_configs_by = {"perf_model": perf_model, "top_k": 1}

    _kernel = tunekit.autotune(configs=configs, key=["N"], prune_configs_by=prune_configs_by, do_bench=do_not_bench)(
        _copy
    )

    grid = _grid_over(N, "BLOCK_SIZE")
    _kernel[grid](dst, src, N=N)
    torch.testing.assert_close(src, dst)
    assert _kernel.best_config == configs[1]
    assert "run_do_bench" not in records


def test_prune_all_configs(device):
    N = 1024
    src = torch.randn(N, device=device)
    dst = torch.empty(N, device=device)

    def early_config_prune(configs, named_args, **kwargs):
        return []

    configs = _two_configs("BLOCK_SIZE")

    prune_configs_by = {"early_config_prune": early_config_prune}

    _kernel = tunekit.autotune(configs=configs, key=["N"], prune_configs_by=prune_configs_by)(_copy)

    grid = _grid_over(N, "BLOCK_SIZE")
    try:
        _kernel[grid](dst, src, N=N)
        pytest.fail("Expected exception was not thrown.")
    except TunekitError as e:
        assert "No valid autotuner configs after pruning. `early_config_prune` should return at least one config" in (
            str(e)
        )


def test_every_argument_of_triton_autotune_is_taken_in_its_order():
    import inspect

    ours = list(inspect.signature(tunekit.autotune).parameters)
    theirs = list(inspect.signature(triton.autotune).parameters)
    assert ours[: len(theirs)] == theirs
