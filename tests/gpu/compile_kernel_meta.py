"""What Inductor compiles a tuned tunekit kernel with: the user kernel's triton_meta (signature, divisibility
hints, constants) and launch config in the output code, for one GEMM problem (TUNEKIT_CACHE_DIR with its entry).

    python tests/gpu/compile_kernel_meta.py
"""

from __future__ import annotations

import re

import torch
from torch._inductor.utils import run_and_get_code

import tunekit.ops as tk
from tunekit.runtime import compile_policy


def main() -> None:
    compile_policy.FORCED = frozenset({compile_policy.ALL})
    x = torch.randn(4096, 3584, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(18944, 3584, device="cuda", dtype=torch.bfloat16) / 60
    with torch.no_grad():
        _, code = run_and_get_code(torch.compile(lambda x: tk.linear(x, w, activation="silu")), x)
    text = "\n".join(code)
    for pattern in (
        r"triton_meta=\{.*?\}\s*,\s*\n",
        r"@triton_heuristics\.\w+\(.*?\n",
        r"triton\.Config\(.*?\)",
        r"def _gemm\w*\(.*?\):",
    ):
        for found in re.findall(pattern, text, re.S)[:3]:
            print(found[:1500])
            print("---")


if __name__ == "__main__":
    main()
