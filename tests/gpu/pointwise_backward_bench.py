"""The pointwise backward kernel on a GPU: correct against float64, and its time against torch's own backward.

    python tests/gpu/pointwise_backward_bench.py

Per problem (bf16; with and without bias): the heuristic config's outputs against the spec's float64 reference
(max error over max |reference|), then the backward alone, timed with triton.testing.do_bench (L2 flushed,
median): the kernel (its partial-sum launch included) against torch autograd's backward of the same op chain (the
spec's torch baseline: the forward graph built once, backward timed), and the kernel's bandwidth over a clone
moving as many bytes. Prints a table.
"""

from __future__ import annotations

import torch
from triton.testing import do_bench

from tunekit.core.device import fingerprint
from tunekit.kernels.pointwise import pointwise_backward as pwb

PROBLEMS = [
    (8192, 4096, "gelu_tanh", True),
    (8192, 4096, "gelu", False),
    (4096, 11008, "silu", False),
    (16384, 3072, "relu", True),
    (4096, 5121, "gelu", True),
]


def main() -> None:
    device, fp = torch.device("cuda"), fingerprint()
    head = f"{'shape':11} {'act':9} {'bias':4} {'max err':>8} {'kernel us':>9} {'torch us':>8} {'x torch':>7}"
    head += f" {'of copy':>7}"
    lines = [head, "-" * len(head)]
    for rows, cols, act, bias in PROBLEMS:
        problem = pwb.pointwise_backward_problem(rows, cols, "bfloat16", act, bias)
        # exact sizes, not the buckets, for the tensors timed (without a bias the kernel sees one flat row)
        problem = {**problem, "rows": rows} if bias else {**problem, "cols": rows * cols}
        inputs = pwb.make_inputs(problem, device, seed=0)
        config = pwb.heuristic(problem, fp)
        outputs = pwb.alloc_outputs(inputs)
        pwb.launch(config, inputs, outputs)
        want = pwb.reference(inputs)
        err = max(float((o.double() - w.double()).abs().max() / w.double().abs().max()) for o, w in zip(outputs, want))
        ours = do_bench(lambda: pwb.launch(config, inputs, outputs), return_mode="median")  # noqa: B023
        theirs = do_bench(lambda: pwb.torch_baseline(inputs), return_mode="median")  # noqa: B023
        nbytes = pwb.bytes_moved(problem)
        src = torch.empty(nbytes // 4, dtype=torch.bfloat16, device=device).normal_()  # nbytes/2 read, /2 written
        copy = do_bench(lambda: src.clone(), return_mode="median")  # noqa: B023
        lines.append(
            f"{rows}x{cols:<6} {act:9} {'yes' if bias else 'no':4} {err:8.1e} {ours * 1e3:9.1f} {theirs * 1e3:8.1f} "
            f"{theirs / ours:7.2f} {copy / ours:7.2f}"
        )
    print(f"{torch.cuda.get_device_name()}, config: the heuristic's")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
