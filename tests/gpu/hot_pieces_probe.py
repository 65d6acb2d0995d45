"""Host cost of the pieces of an eager call that torch serves (tunekit/runtime/hotpath.py), each timed alone with
timeit on the GPU's host: torch's call, tunekit's, the wrapper that call ends in, and each check the hot path
makes before it. Where the hot path's cost over torch's call goes.

    python tests/gpu/hot_pieces_probe.py
"""

from __future__ import annotations

import timeit

import torch
import torch.nn.functional as F

import tunekit.ops as ops
from tunekit.launch import watch
from tunekit.runtime import hotpath, recorder


class _Callable:
    def __call__(self, *args: object, **kwargs: object) -> object:
        return None


def _nothing(*args: object, **kwargs: object) -> object:
    return None


def main() -> None:
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    lw = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    torch.set_grad_enabled(False)
    ops.rms_norm(x, (4096,), w), ops.linear(x, lw), ops.softmax(x, -1)
    hot = {h.name: h for h in hotpath.ops()}
    instance = _Callable()
    names = {
        "F.rms_norm": lambda: F.rms_norm(x, (4096,), w, 1e-6),
        "ops.rms_norm": lambda: ops.rms_norm(x, (4096,), w, 1e-6),
        "rms_norm torch_equivalent": lambda: hot["rms_norm"].torch_equivalent(x, (4096,), w, 1e-6),
        "rms_norm screen.of_call": lambda: hot["rms_norm"].screen.of_call(x, (4096,), w, 1e-6),
        "F.linear": lambda: F.linear(x, lw),
        "ops.linear": lambda: ops.linear(x, lw),
        "linear torch_equivalent": lambda: hot["linear"].torch_equivalent(x, lw),
        "linear screen.of_call": lambda: hot["linear"].screen.of_call(x, lw),
        "torch.softmax": lambda: torch.softmax(x, -1),
        "ops.softmax": lambda: ops.softmax(x, -1),
        "torch.compiler.is_compiling()": torch.compiler.is_compiling,
        "torch.is_grad_enabled()": torch.is_grad_enabled,
        "watch.watching()": watch.watching,
        "recorder.ACTIVE": lambda: recorder.ACTIVE,
        "an empty function(*args)": lambda: _nothing(x, (4096,), w, 1e-6),
        "an empty __call__(*args)": lambda: instance(x, (4096,), w, 1e-6),
        "lambda: None": lambda: None,
    }
    print(
        "served:",
        {
            n: (h.only_torch, None if h.screened is None else len(h.screened))
            for n, h in hot.items()
            if n in ("rms_norm", "linear", "softmax")
        },
    )
    for name, fn in names.items():
        for _ in range(2000):
            fn()
        torch.cuda.synchronize()
        best = min(timeit.repeat(fn, number=20000, repeat=5)) / 20000 * 1e6
        torch.cuda.synchronize()
        print(f"{name:34} {best:7.3f} us")


if __name__ == "__main__":
    main()
