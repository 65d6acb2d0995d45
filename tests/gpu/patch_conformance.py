"""tunekit.patch's conformance sweep on the GPU, in bf16 and fp16, and OLMo-2 at 7B widths.

1. Every causal-LM family the installed transformers ships, tiny (tunekit/evaluation/patch_conformance.py: the
   CPU test's sweep, here in each --dtypes on --device): logits, a training step and greedy generate with the KV
   cache against the unpatched model in the same dtype (tolerances per dtype: patch_conformance.TOLERANCES).
2. OLMo-2 at 4096 hidden, 11008 MLP, 32 heads, a 100352-token vocabulary, 2 layers, bf16: patch, then prefill,
   greedy decode with the KV cache and a training step against the unpatched model (logits' relative error and
   argmax agreement, the loss, every gradient).

Prints a table per dtype and the OLMo-2 lines; --out writes the details as JSON. Families still waiting when
--budget-s is spent are listed as not run. `--device cpu --families llama,olmo2` runs the same code on the CPU
(the interpreter), `--olmo2-width 64` shrinks OLMo-2 for that.

    python tests/gpu/patch_conformance.py --out $OUT/patch_conformance.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="bf16,fp16", help="comma-separated, of " + ", ".join(DTYPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--families", default="", help="comma-separated model types (default: all)")
    parser.add_argument("--budget-s", type=float, default=400.0, help="no family starts after this many seconds")
    parser.add_argument("--olmo2-width", type=int, default=4096, help="OLMo-2's hidden size (0: skip OLMo-2)")
    parser.add_argument("--out", type=Path, default=None, help="JSON details written here")
    args = parser.parse_args(argv)
    unknown = [d for d in args.dtypes.split(",") if d not in DTYPES]
    if unknown:
        parser.error(f"--dtypes must be among {sorted(DTYPES)}, but got {unknown}")
    return args


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6))


def olmo2_check(width: int, device: str, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """OLMo-2 with 2 layers at `width` (4096: 7B's, with its 11008 MLP, 32 heads and 100352 vocabulary; smaller
    widths scale the MLP and heads): patched against unpatched for prefill, decode and a training step."""
    import transformers

    from tunekit.evaluation.patch_conformance import TOLERANCES
    from tunekit.integrations.patching import patch

    heads = max(2, width // 128)
    config = transformers.Olmo2Config(
        hidden_size=width, intermediate_size=width * 11008 // 4096, num_hidden_layers=2, num_attention_heads=heads,
        num_key_value_heads=heads, vocab_size=100352 if width == 4096 else 512, max_position_embeddings=4096,
        pad_token_id=1, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    reference = transformers.Olmo2ForCausalLM(config).to(device=device, dtype=dtype).eval()
    model = copy.deepcopy(reference)
    report = patch(model)
    print(report, flush=True)
    tolerance = TOLERANCES[dtype]
    ids = torch.randint(2, config.vocab_size, (2, 64), generator=torch.Generator().manual_seed(1)).to(device)
    out: dict[str, Any] = {"width": width, "report": str(report)}
    with torch.no_grad():
        want, got = reference(ids).logits, model(ids).logits
    out["prefill_logits_error"] = _relative(got, want)
    out["prefill_argmax_agreement"] = float((got.argmax(-1) == want.argmax(-1)).float().mean())
    generated = {}
    for name, m in (("reference", reference), ("patched", model)):
        with torch.no_grad():
            run = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8,
                             do_sample=False, return_dict_in_generate=True, output_logits=True)  # fmt: skip
        generated[name] = run
    # Decode with the KV cache: each step's logits, up to the first step the two greedy sequences part at (its
    # logits still came from equal prefixes; a near tie may part them).
    new = generated["reference"].sequences[:, ids.shape[1] :] != generated["patched"].sequences[:, ids.shape[1] :]
    parted = [step for step in range(new.shape[1]) if new[:, step].any()]
    last = parted[0] if parted else new.shape[1] - 1
    pairs = list(zip(generated["patched"].logits, generated["reference"].logits))[: last + 1]
    out["decode_steps_compared"] = len(pairs)
    out["decode_logits_error"] = max(_relative(a, b) for a, b in pairs)
    out["decode_argmax_agreement"] = float(
        sum(float((a.argmax(-1) == b.argmax(-1)).float().mean()) for a, b in pairs) / len(pairs)
    )
    out["decode_tokens_equal"] = not parted
    losses, grads = [], []
    for m in (reference, model):
        m.train()
        m.zero_grad(set_to_none=True)
        loss = m(ids, labels=ids).loss
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad for n, p in m.named_parameters()})
        m.eval()
    out["loss_error"] = _relative(losses[1], losses[0])
    out["grads_error"] = max(_relative(grads[1][n], g) for n, g in grads[0].items() if g is not None)
    out["matched"] = bool(
        out["prefill_logits_error"] <= tolerance.logits
        and out["decode_logits_error"] <= tolerance.logits
        and out["prefill_argmax_agreement"] >= 0.95
        and out["loss_error"] <= tolerance.loss
        and out["grads_error"] <= tolerance.grads
    )
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from tunekit.evaluation import patch_conformance

    start = time.perf_counter()
    families = patch_conformance.causal_lm_families()
    if args.families:
        wanted = set(args.families.split(","))
        families = [f for f in families if f[0] in wanted]
    details: dict[str, Any] = {"device": args.device, "torch": torch.__version__, "sweeps": {}}
    if args.device == "cuda":
        details["gpu"] = torch.cuda.get_device_name()
    tables = []
    for name in args.dtypes.split(","):
        results, waiting = [], []
        for model_type, class_name in families:
            if time.perf_counter() - start > args.budget_s:
                waiting.append(model_type)
                continue
            result = patch_conformance.check_family(model_type, class_name, DTYPES[name], args.device)
            print(f"{name} {model_type:<28} {result.status:<13} {result.seconds:5.1f} s  {result.reason}", flush=True)
            results.append(result)
        table = patch_conformance.table(results)
        if waiting:
            table += f"\nnot run (--budget-s spent): {', '.join(waiting)}"
        tables.append(f"== {name} on {args.device}\n{table}")
        details["sweeps"][name] = {"results": [asdict(r) for r in results], "not_run": waiting}
    failed = sum(r["status"] == "failed" for s in details["sweeps"].values() for r in s["results"])
    if args.olmo2_width:
        try:
            details["olmo2"] = olmo2_check(args.olmo2_width, args.device)
        except Exception as failure:  # reported as a failure, after the sweep's tables
            details["olmo2"] = {"matched": False, "error": f"{type(failure).__name__}: {failure}"}
        failed += not details["olmo2"]["matched"]
    details["seconds"] = time.perf_counter() - start
    print("\n\n".join(tables))
    if "olmo2" in details:
        print(f"== OLMo-2 at {args.olmo2_width} wide, bf16: " + json.dumps(details["olmo2"], default=str))
    print(f"total {details['seconds']:.0f} s, {failed} failed")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(details, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
