"""Why a GEMM whose K is no multiple of 8 (bf16 2053^3) runs at a twentieth of the tensor-core rate: an experiment.

Rows of 2053 bf16 values start anywhere inside a 16-byte vector and every K and N mask is ragged, so A's and B's
loads go element by element and TMA (16-byte aligned strides) is not allowed. Staging: copy A, B and the bias into
zero-padded buffers (K and N rounded up to 2056), run tunekit.ops.matmul on those aligned operands and drop the
extra columns; the copies are timed as part of it. Prints one table: TFLOP/s of tunekit as dispatched, tunekit on
staged operands (copies included), torch eager and cuBLASLt's fused epilogue, each checked against fp32 first.
"""

from __future__ import annotations

import torch
import triton
import triton.testing

import tunekit.ops as ops


def staged(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor, multiple: int = 8) -> torch.Tensor:
    """The same GEMM on zero-padded copies (K and N rounded up to a multiple of 8): every stride and size aligned.

    The padding adds zeros to the K sum and extra output columns that are dropped; the copies are part of the cost.
    """
    (m, k), n = a.shape, b.shape[1]
    kp, np_ = -(-k // multiple) * multiple, -(-n // multiple) * multiple
    a2 = torch.zeros(m, kp, dtype=a.dtype, device=a.device)
    a2[:, :k] = a
    b2 = torch.zeros(kp, np_, dtype=b.dtype, device=b.device)
    b2[:k, :n] = b
    bias2 = torch.zeros(np_, dtype=bias.dtype, device=bias.device)
    bias2[:n] = bias
    return ops.matmul(a2, b2, bias=bias2, activation="gelu_tanh")[:, :n]


def measure(size: int, flush: torch.Tensor) -> None:
    m = n = k = size
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16) / k**0.5
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    want = torch.nn.functional.gelu(a.float() @ b.float() + bias.float(), approximate="tanh")
    runs = {
        "tunekit": lambda: ops.matmul(a, b, bias=bias, activation="gelu_tanh"),
        "tunekit staged": lambda: staged(a, b, bias),
        "torch eager": lambda: torch.nn.functional.gelu(a @ b + bias, approximate="tanh"),
        "cuBLASLt": lambda: torch._addmm_activation(bias, a, b, use_gelu=True),
    }
    for name, run in runs.items():
        err = (run().float() - want).abs().max().item()
        ok = err < 0.05
        ms = None
        if ok:

            def timed(run=run):
                flush.zero_()
                return run()

            ms = triton.testing.do_bench(timed, warmup=25, rep=100, return_mode="median")
            ms -= triton.testing.do_bench(flush.zero_, warmup=25, rep=100, return_mode="median")
        rate = f"{2 * m * n * k / ms / 1e9:.0f}" if ms else "-"
        print(f"| {size}^3 bias+gelu | {name} | {'ok' if ok else f'WRONG {err:.3g}'} | {rate} |", flush=True)


def main() -> None:
    torch.manual_seed(0)
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    for size in (2053, 2056):
        measure(size, flush)


if __name__ == "__main__":
    print("| problem | implementation | check | TFLOP/s |")
    print("| --- | --- | --- | --- |")
    main()
