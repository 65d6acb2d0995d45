"""Where a compiled model step's GPU time goes, compile alone vs tunekit.patch + compile (a policy), by kernel kind
and kernel (tunekit.evaluation.step_profile), and what Inductor's output code holds (clones, copies, tunekit's
kernels). One family at 7B widths, 2 layers, bf16.

    python tests/gpu/compile_profile.py --family qwen2 --step prefill [--policy measured]
"""

from __future__ import annotations

import argparse
import copy

import torch
from compile_transfer import set_policy, step_of  # tests/gpu/, beside this script
from model_transfer import held_out
from torch._inductor.utils import run_and_get_code

from tunekit.evaluation.step_profile import NAMED, kind_table, profile_kinds
from tunekit.integrations.patching import patch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--family", default="qwen2")
    parser.add_argument("--step", default="prefill")
    parser.add_argument("--policy", default="measured")
    parser.add_argument("--mode", default="default")
    opts = parser.parse_args()
    base, ids = held_out(opts.family)
    patched = copy.deepcopy(base)
    patch(patched)
    step = step_of(opts.step, ids)
    mode = None if opts.mode == "default" else opts.mode
    profiles, codes = {}, {}
    for name, model, policy in (("compile", base, "none"), ("tunekit", patched, opts.policy)):
        set_policy(policy)
        run = torch.compile(model, mode=mode)
        _, code = run_and_get_code(lambda run=run: step(run))
        codes[name] = "\n".join(code)
        profiles[name] = profile_kinds(lambda run=run: step(run))
    print(kind_table(profiles, f"{opts.family} {opts.step} ({opts.mode}): GPU ms per step by kind"))
    named = sorted({k for p in profiles.values() for k in p if k.startswith(NAMED)},
                   key=lambda k: -max(p.get(k, 0.0) for p in profiles.values()))  # fmt: skip
    print(f"{'kernel':84} {'compile':>8} {'tunekit':>8}")
    for k in named[:25]:
        print(f"{k[:84]:84} {profiles['compile'].get(k, 0):8.3f} {profiles['tunekit'].get(k, 0):8.3f}")
    for name, code in codes.items():
        counts = {w: code.count(w) for w in ("clone", "copy_", "empty_strided", ".run(", "extern_kernels.mm")}
        print(name, counts)


if __name__ == "__main__":
    main()
