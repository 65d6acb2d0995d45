"""Host cost of eager training through the norm ops: time per forward+backward step as a user runs it.

    python tests/gpu/train_host_probe.py [--rows 8192] [--cols 4096] [--linear 1000x3000x2000] [--steps 100]
        [--profile OP]

For LayerNorm and RMSNorm (bf16, weight and bias requiring grad) and a linear layer with bias and GELU (input
M x K, weight N x K), after 10 warm-up steps: the host time of `steps`
steps of `y = op(x, w, b); torch.autograd.grad(y, leaves, dy)` and the wall time once the GPU has caught up, for
torch.nn.functional's op and tunekit.ops' (served as dispatch serves it: set TUNEKIT_UNTUNED=triton to run the
kernels on untuned problems). Host time near wall time means the GPU waits for the host. --profile OP prints a
cProfile (tottime) of 50 steps of that row's tunekit op last (layer_norm, rms_norm or linear).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import tunekit.ops as ops

Step = Callable[[], None]


def _step(fn: Callable[..., torch.Tensor], leaves: list[torch.Tensor], dy: torch.Tensor) -> Step:
    def step() -> None:
        torch.autograd.grad(fn(*leaves), leaves, dy)

    return step


def _time(name: str, step: Step, steps: int) -> None:
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    host = (time.perf_counter() - start) / steps
    torch.cuda.synchronize()
    wall = (time.perf_counter() - start) / steps
    print(f"{name:34s} host {host * 1e6:7.1f} us   wall {wall * 1e6:7.1f} us", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--linear", default="1000x3000x2000", help="MxNxK of the linear layer")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--profile", default="", help="layer_norm, rms_norm or linear")
    args = parser.parse_args()
    m, n = args.rows, args.cols
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, n, device="cuda", generator=gen).bfloat16().requires_grad_()
    w = torch.randn(n, device="cuda", generator=gen).bfloat16().requires_grad_()
    b = torch.randn(n, device="cuda", generator=gen).bfloat16().requires_grad_()
    dy = torch.randn(m, n, device="cuda", generator=gen).bfloat16()
    lm, ln, lk = (int(v) for v in args.linear.split("x"))
    xl = torch.randn(lm, lk, device="cuda", generator=gen).bfloat16().requires_grad_()
    wl = (torch.randn(ln, lk, device="cuda", generator=gen) / lk**0.5).bfloat16().requires_grad_()
    bl = torch.randn(ln, device="cuda", generator=gen).bfloat16().requires_grad_()
    dyl = torch.randn(lm, ln, device="cuda", generator=gen).bfloat16()
    served = os.environ.get("TUNEKIT_UNTUNED", "default")
    steps = {
        "F.layer_norm": _step(lambda x, w, b: F.layer_norm(x, (n,), w, b), [x, w, b], dy),
        f"ops.layer_norm ({served})": _step(lambda x, w, b: ops.layer_norm(x, (n,), w, b), [x, w, b], dy),
        "F.rms_norm": _step(lambda x, w: F.rms_norm(x, (n,), w), [x, w], dy),
        f"ops.rms_norm ({served})": _step(lambda x, w: ops.rms_norm(x, (n,), w), [x, w], dy),
        "F.gelu(F.linear)": _step(lambda x, w, b: F.gelu(F.linear(x, w, b)), [xl, wl, bl], dyl),
        f"ops.linear gelu ({served})": _step(lambda x, w, b: ops.linear(x, w, b, "gelu"), [xl, wl, bl], dyl),
    }
    print(f"norms {m}x{n}, linear {args.linear} (MxNxK), bf16, {args.steps} steps of forward + backward")
    for name, step in steps.items():
        _time(name, step, args.steps)
    if args.profile:
        (name,) = [key for key in steps if key.startswith(f"ops.{args.profile} ")]
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(50):
            steps[name]()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        print(text.getvalue())


if __name__ == "__main__":
    main()
