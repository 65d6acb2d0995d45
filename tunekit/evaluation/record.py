"""Record a timing table: every valid config of a kernel's space compiled, verified and timed on this GPU.

Compilation is the slow part (0.1-0.4 s a config), so it runs first in a pool of processes sharing Triton's
on-disk cache, each config compiled cold by exactly one process (its compile time is recorded); the timing pass in
this process then finds every kernel compiled. Timing is sequential: one kernel on the GPU at a time.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from typing import Any

import torch

from tunekit.core import backend, registry
from tunekit.core.device import fingerprint
from tunekit.core.device_limits import device_limits
from tunekit.core.errors import TunekitError
from tunekit.core.space import Problem
from tunekit.core.spec import KernelSpec
from tunekit.core.triton_adapter import capture_launched_kernels, compiled_resources, set_cache_dir
from tunekit.evaluation.timing_table import TimingRow, TimingTable
from tunekit.tuning.bench import Timer
from tunekit.tuning.verify import KNOWN_KERNEL_FAILURES, measure

_ERROR_CHARS = 300
_worker_state: dict[str, Any] = {}


def _compile_init(kernel: str, problem: dict[str, Any], seed: int) -> None:
    spec = registry.get_spec(kernel)
    inputs = spec.make_inputs(problem, backend.torch_device(), seed)
    _worker_state.update(spec=spec, inputs=inputs, outputs=spec.alloc_outputs(inputs))


def _compile_one(config: dict[str, Any]) -> tuple[float | None, str | None]:
    """Compile (and launch once) in a pool process: (seconds, None) or (None, the failure)."""
    spec: KernelSpec = _worker_state["spec"]
    start = time.perf_counter()
    try:
        spec.launch(config, _worker_state["inputs"], _worker_state["outputs"])
        torch.cuda.synchronize()
    except KNOWN_KERNEL_FAILURES as exc:
        return None, f"{exc.__class__.__name__}: {str(exc)[:_ERROR_CHARS]}"
    return time.perf_counter() - start, None


def compile_all(
    spec: KernelSpec, problem: Problem, configs: list[dict[str, Any]], workers: int, seed: int
) -> dict[int, tuple[float | None, str | None]]:
    """Compile every config in `workers` processes; index -> (compile seconds, error). Missing: the pool broke."""
    results: dict[int, tuple[float | None, str | None]] = {}
    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    with concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=context, initializer=_compile_init, initargs=(spec.name, dict(problem), seed)
    ) as pool:
        futures = {pool.submit(_compile_one, c): i for i, c in enumerate(configs)}
        for future in concurrent.futures.as_completed(futures):
            with contextlib.suppress(BrokenProcessPool):
                results[futures[future]] = future.result()
    return results


def _main_kernel_resources(kernels: list[Any]) -> dict[str, int | None]:
    """The config's heaviest kernel (most shared memory, then registers): what bounds its occupancy."""
    if not kernels:
        return {"n_regs": None, "n_spills": None, "shared_bytes": None}
    regs, spills, shared = max((compiled_resources(k) for k in kernels), key=lambda r: (r[2], r[0]))
    return {"n_regs": regs, "n_spills": spills, "shared_bytes": shared}


def record_table(
    spec: KernelSpec,
    problem: Problem,
    timer: Timer,
    *,
    workers: int = 8,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> TimingTable:
    if backend.INTERPRETED:
        raise TunekitError("recording a timing table needs a GPU (the interpreter's timings mean nothing)")
    device = fingerprint()
    limits = device_limits()
    assert limits is not None
    configs = spec.space.valid_configs(problem, device)
    compiled = compile_all(spec, problem, configs, workers, seed) if workers > 0 else {}
    torch_device = backend.torch_device()
    inputs = spec.make_inputs(problem, torch_device, seed)
    outputs = spec.alloc_outputs(inputs)
    rows = []
    for i, config in enumerate(configs):
        compile_s, error = compiled.get(i, (None, None))
        if error is not None:
            rows.append(TimingRow(dict(config), "failed", compile_s=None, error=error))
        else:
            with capture_launched_kernels() as launched:
                start = time.perf_counter()
                record = measure(spec, config, problem, torch_device, inputs, outputs, timer, seed + 1 + i)
                if compile_s is None:  # compiled here (the pool broke): first launch, then the timing
                    compile_s = time.perf_counter() - start
            rows.append(
                TimingRow(
                    dict(config),
                    record.status,
                    time_ms=record.time_ms,
                    compile_s=None if compile_s is None else round(compile_s, 4),
                    error=record.error,
                    **_main_kernel_resources(launched),
                )
            )
        if progress is not None:
            progress(i + 1, len(configs))
    return TimingTable(
        kernel=spec.name,
        source_hash=spec.source_hash,
        problem=dict(problem),
        device=device.to_json(),
        limits=limits.to_json(),
        timer=timer.label,
        recorded=datetime.date.today().isoformat(),
        rows=tuple(rows),
    )


def cold_triton_cache(path: str) -> None:
    """Point Triton (and the pool's processes) at an empty cache, so recorded compile times are cold."""
    os.makedirs(path, exist_ok=True)
    set_cache_dir(path)


def merge_tables(old: list[TimingTable], new: list[TimingTable]) -> list[TimingTable]:
    """Newly recorded tables replace old ones for the same kernel, source and problem."""

    def ident(t: TimingTable) -> tuple[Any, ...]:
        return (t.kernel, t.source_hash, tuple(sorted(t.problem.items())), t.device.get("name"))

    fresh = {ident(t) for t in new}
    return [t for t in old if ident(t) not in fresh] + list(new)


__all__ = ["capture_launched_kernels", "cold_triton_cache", "compile_all", "merge_tables", "record_table"]
