"""What Dynamo's guards cost per call of a compiled model, patched by tunekit and not (default-mode decode
with a patched model ran 3-4% behind compile alone with the same output code and GPU time, so the difference is on
the host). Compiles a 2-layer Llama (transformers, random weights) with backend "eager" (the guards do not depend
on the backend), then times the guard check of the cached frame alone, in alternation, and counts its guards.
Runs anywhere; in Triton's interpreter on a CPU:

    TRITON_INTERPRET=1 python tests/gpu/compile_guards_probe.py [--hidden 64] [--layers 2] [--rounds 5] [--full-call]

--full-call also times whole calls of the two compiled models (backend "eager", so Dynamo's frame, its guards and
the graph's ops run eagerly), interleaved: all host cost of the compiled call, not only the guards.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from transformers import LlamaConfig, LlamaForCausalLM

import tunekit


def guard_of(model: torch.nn.Module, ids: torch.Tensor):
    """The guard manager of `model`'s compiled forward frame and the frame's locals it checks."""
    compiled = torch.compile(model, backend="eager")
    with torch.no_grad():
        for _ in range(3):
            compiled(ids, use_cache=False)
    forward = model.forward.__func__
    frame = {"self": model, "args": (ids,), "kwargs": {"use_cache": False}, "func": forward.__wrapped__}
    # transformers' decorator frame, (*args, **kwargs): one cache entry per model compiled, the one passing is ours
    torch.set_grad_enabled(False)
    try:
        entries = [e for e in _debug_get_cache_entry_list(forward.__code__) if e.guard_manager.check(frame)]
    finally:
        torch.set_grad_enabled(True)
    assert len(entries) == 1, len(entries)
    return entries[0].guard_manager, frame


def check_us(guard, frame, calls: int = 2000) -> float:
    torch.set_grad_enabled(False)  # the calls ran under no_grad: a guard of the global state
    try:
        assert guard.check(frame), guard.check_verbose(frame).verbose_code_parts[:3]
        start = time.perf_counter()
        for _ in range(calls):
            guard.check(frame)
        return (time.perf_counter() - start) / calls * 1e6
    finally:
        torch.set_grad_enabled(True)


def call_us(compiled, ids: torch.Tensor, calls: int = 200) -> float:
    with torch.no_grad():
        start = time.perf_counter()
        for _ in range(calls):
            compiled(ids, use_cache=False)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--full-call", action="store_true")
    parser.add_argument("--layers", type=int, default=2)  # guards grow with the modules: a deployed depth
    opts = parser.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=opts.hidden, intermediate_size=opts.hidden * 3 // 2, num_hidden_layers=opts.layers,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
    )  # fmt: skip
    base = LlamaForCausalLM(config).eval()
    patched = copy.deepcopy(base)
    tunekit.patch(patched)
    ids = torch.randint(0, 128, (2, 1))
    torch._dynamo.reset()  # once: a reset renames the globals an earlier frame's guards read
    guards = {name: guard_of(model, ids) for name, model in (("compile alone", base), ("tunekit.patch", patched))}
    times: dict[str, list[float]] = {name: [] for name in guards}
    for _ in range(opts.rounds):  # interleaved
        for name, (guard, frame) in guards.items():
            times[name].append(check_us(guard, frame))
    if opts.full_call:  # compiled again: the cached frames above are reused, nothing recompiles
        compiled = {
            "compile alone": torch.compile(base, backend="eager"),
            "tunekit.patch": torch.compile(patched, backend="eager"),
        }
        calls: dict[str, list[float]] = {name: [] for name in compiled}
        for _ in range(opts.rounds):
            for name, model in compiled.items():
                calls[name].append(call_us(model, ids))
        for name in compiled:
            print(f"{name:14} whole compiled call {statistics.median(calls[name]):8.1f} us")
    for name, (guard, _) in guards.items():
        text = str(guard).splitlines()
        managers = sum("GuardManager:" in line for line in text)
        print(f"{name:14} guard check {statistics.median(times[name]):7.2f} us per call, {len(text)} guard lines, "
              f"{managers} guard managers")  # fmt: skip


if __name__ == "__main__":
    main()
