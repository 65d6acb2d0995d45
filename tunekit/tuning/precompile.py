"""Compile a problem's first candidates ahead of measuring them, on a pool of threads (TuneOptions.precompile_threads;
0, the default: off).

Triton compiles a config on its first launch; `kernel[grid](..., warmup=True)` compiles without launching. A spec's
launch is the kernel's own host code, so each config is compiled by running that launch on a thread whose launches
are compile-only (`JITFunction.run` sees the thread's flag; installed in a process at its first precompile, so
a process that never precompiles launches as before; a kernel the launch watch wrapped before that launches in full
on the pool, which is slower but as correct). Every compile finishes before anything is measured, so no host work
of the pool overlaps a timing; a config that fails to compile fails again, and is recorded, when it is measured.
The compiled kernels stay in Triton's caches (in memory in the shared isolation worker, on disk across processes),
so a later problem that shares a binary reuses them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tunekit.core import backend
from tunekit.core.space import Config
from tunekit.core.spec import KernelSpec
from tunekit.core.triton_adapter import compile_only_when

_LOCAL = threading.local()
_INSTALLED: list[bool] = []


def compiling() -> bool:
    """This thread's launches compile only."""
    return bool(getattr(_LOCAL, "compile_only", False))


def install() -> None:
    """Have Triton's `JITFunction.run` compile without launching on a compiling thread (once per process)."""
    if _INSTALLED or backend.INTERPRETED:
        return
    compile_only_when(compiling)
    _INSTALLED.append(True)


def _compile_one(spec: KernelSpec, config: Config, inputs: tuple[Any, ...], outputs: tuple[Any, ...]) -> None:
    _LOCAL.compile_only = True
    try:
        spec.launch(config, inputs, outputs)
    except Exception:  # measured later, where its failure is recorded
        pass
    finally:
        _LOCAL.compile_only = False


def compile_all(
    spec: KernelSpec,
    configs: Sequence[Config],
    inputs: tuple[Any, ...],
    outputs: tuple[Any, ...],
    threads: int,
    device_index: int | None = None,
) -> float:
    """Compile `configs` on `threads` threads and wait for all; the seconds it took. Nothing in the interpreter
    (there is nothing to compile: a launch would run the kernel)."""
    if threads <= 0 or not configs or backend.INTERPRETED:
        return 0.0
    install()
    started = time.perf_counter()

    def on_device() -> None:
        if device_index is not None:
            import torch

            torch.cuda.set_device(device_index)  # a thread's current device is its own

    with ThreadPoolExecutor(max_workers=threads, initializer=on_device) as pool:
        list(pool.map(lambda c: _compile_one(spec, c, inputs, outputs), configs))
    if device_index is not None:
        import torch

        torch.cuda.synchronize()  # any host-side torch work of the launches is done before a timing starts
    return time.perf_counter() - started
