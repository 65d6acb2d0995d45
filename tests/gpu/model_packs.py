"""Build the model packs (tunekit.evaluation.model_packs) on this GPU, and measure what they give.

Stages (comma-separated, in this order; each picks up where the work directory left off, so a stage cut by its
time cap continues in the next call on the same machine):

    record    each pack model at its release's widths (1 decoder layer, bf16, random weights), patched, run for the
              pack's steps under tunekit.record_problems: plans/<pack>.jsonl, and their union plans/union.jsonl
    tune      `tunekit tune --plan union.jsonl --trials T --early-stop 0.03` (--early-stop off: none) in a
              subprocess, one process, or with --workers N (one per GPU); wall time and the tuner's output under $OUT
    verify    per pack: the model's steps timed before and after its tuned entries (tunekit.tune_model, with the
              union's entries as its tuning), what slows a step demoted; the plan's entries -> $OUT/packs/<pack>.json
    compare   the winners of this work directory's union against --against (another run's cache): same config, or
              the other run's winner within how much of this one's, as this run measured it
    merge     (no GPU) each pack file of --from (a verify stage's $OUT/packs, another GPU's) into cache/packs/: its
              devices' entries replace those devices' entries there, every other device's stay
    reverify  per pack (no tuning): its model at 2 decoder layers, the pack's entries for this GPU given to
              tune_model as its tuning with the installed packs taken out (so "before" is no pack): each problem is
              decided inside the steps (tunekit.evaluation.in_step), what slows a step is served as before; the pack
              with what the steps kept -> $OUT/packs/<pack>.json; with vs without the pack in alternation, train
              peak memory and prefill logits vs eager (relative error, argmax agreement) both ways
    transfer  per --models: 2 decoder layers, in alternation: eager, tunekit out of the box (served by the packs),
              tunekit after the user's own tune_model (trials --trials, a fresh cache), torch.compile, Liger-Kernel

    python tests/gpu/model_packs.py --stages record,tune --cap 520
    python tests/gpu/model_packs.py --stages tune,verify
    python tests/gpu/model_packs.py --stages transfer --models llama-3-8b
    python tests/gpu/model_packs.py --stages compiled [--compiled-steps decode,prefill]

--shrink K divides every width by K (a CPU dry run in Triton's interpreter: TRITON_INTERPRET=1). Prints a table
per stage last; JSON under $OUT.
"""

from __future__ import annotations

import argparse
import copy
import importlib.resources
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from tunekit.core.device import fingerprint
from tunekit.core.problems import check_problem
from tunekit.core.registry import get_spec
from tunekit.evaluation import model_packs
from tunekit.evaluation.model_packs import PACK_MODELS, PACK_STEPS, build_pack_model, record_pack_plan
from tunekit.fleet.plans import read_plan
from tunekit.runtime.recorder import plan_line
from tunekit.store.database import read_document, write_document
from tunekit.store.key import CacheKey
from tunekit.store.store import Store
from tunekit.tuning.phases import PhaseTimes

OUT = Path(os.environ.get("OUT", "/tmp/out"))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def shrink_widths(k: int) -> None:
    """Every pack model's widths divided by `k` (heads too, keeping whole key/value groups): a dry run's models."""
    for name, spec in list(PACK_MODELS.items()):
        w = dict(spec.widths)
        heads = max(1, w["num_attention_heads"] // k)
        kv = max(1, min(heads, w["num_key_value_heads"] // k))
        while heads % kv:
            kv -= 1
        w.update(
            hidden_size=w["hidden_size"] // k, intermediate_size=w["intermediate_size"] // k,
            vocab_size=w["vocab_size"] // k, num_attention_heads=heads, num_key_value_heads=kv,
        )  # fmt: skip
        w["pad_token_id"] = 0  # (Phi-3's is 32000, past a shrunk vocabulary)
        if "head_dim" in w:
            w["head_dim"] = max(8, w["head_dim"] // k)
        PACK_MODELS[name] = model_packs.PackModel(spec.name, spec.source, spec.config, spec.model, w, spec.family)


def steps_for(vocab: int, sizes: dict[str, tuple[int, int]] = PACK_STEPS) -> dict[str, Any]:
    """Each step as a function of the model (model_transfer.py's), on random token ids of the pack's sizes."""
    from model_transfer import steps  # (this directory: the scripts run as `python tests/gpu/<script>.py`)

    gen = torch.Generator(device="cpu").manual_seed(1)
    return steps({k: torch.randint(0, vocab, v, generator=gen).to(DEVICE) for k, v in sizes.items()})


def keys_of(plan: Path) -> list[CacheKey]:
    device = fingerprint()
    keys = []
    for kernel, problem in read_plan(plan):
        spec = get_spec(kernel)
        keys.append(CacheKey.make(spec.name, spec.source_hash, device.key, check_problem(spec, problem)))
    return keys


def record(work: Path, models: list[str]) -> dict[str, Any]:
    plans = work / "plans"
    plans.mkdir(parents=True, exist_ok=True)
    rows, union = {}, {}
    for name in models:
        t0 = time.perf_counter()
        try:
            base = build_pack_model(name, DEVICE, layers=1)
            n = record_pack_plan(base, PACK_MODELS[name].widths["vocab_size"], plans / f"{name}.jsonl")
        except Exception as exc:  # one model's failure leaves the others' packs
            rows[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            print(f"record {name}: {rows[name]['error']}", flush=True)
            continue
        finally:
            base = None
            torch.cuda.empty_cache() if DEVICE == "cuda" else None
        kernels: dict[str, int] = {}
        for kernel, problem in read_plan(plans / f"{name}.jsonl"):
            kernels[kernel] = kernels.get(kernel, 0) + 1
            union.setdefault(plan_line(kernel, problem), None)
        rows[name] = {"problems": n, "kernels": kernels, "record_s": round(time.perf_counter() - t0, 1)}
        print(f"record {name}: {n} problems {kernels} in {rows[name]['record_s']} s", flush=True)
    (plans / "union.jsonl").write_text("".join(line + "\n" for line in union))
    print(f"union: {len(union)} problems", flush=True)
    return {"models": rows, "union": len(union)}


DONE_LINE = re.compile(r"done in ([\d.]+) s.*?; (startup .*) s\)")


def phases_of(text: str) -> dict[str, Any]:
    """Seconds per job by phase, from the tuner's "done in" lines (one per problem, workers or one process; their
    phases as PhaseTimes.describe writes them)."""
    matches = list(DONE_LINE.finditer(text))
    total = PhaseTimes.summed(
        {phase: float(seconds) for phase, seconds in (part.rsplit(" ", 1) for part in m.group(2).split(", "))}
        for m in matches
    )
    jobs, wall = len(matches), sum(float(m.group(1)) for m in matches)
    per_job = {k: round(v / jobs, 2) for k, v in total.seconds.items()} if jobs else {}
    return {"jobs": jobs, "job_s_sum": round(wall, 1), "per_job_s": round(wall / jobs, 2) if jobs else None} | per_job


def tune(work: Path, trials: int, workers: int | None, cap: float, tag: str, early_stop: str) -> dict[str, Any]:
    env = dict(os.environ, TUNEKIT_CACHE_DIR=str(work / "cache"), TRITON_CACHE_DIR=str(work / "triton"))
    env["COLUMNS"] = "200"
    cmd = [sys.executable, "-m", "tunekit.cli", "tune", "--plan", str(work / "plans" / "union.jsonl")]
    cmd += ["--trials", str(trials)] + ([] if early_stop == "off" else ["--early-stop", early_stop])
    cmd += ["--workers", str(workers)] if workers else []
    before = sum(1 for _ in Store(work / "cache").entries()) if (work / "cache").exists() else 0
    t0 = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=cap)
        rc, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        # (always bytes when captured, whatever `text` says)
        rc, text = "cap", b"".join(o for o in (exc.stdout, exc.stderr) if isinstance(o, bytes)).decode(errors="replace")
    wall = time.perf_counter() - t0
    (OUT / f"tune_{tag}.txt").write_text(text)
    after = sum(1 for _ in Store(work / "cache").entries())
    row = {"cmd": " ".join(cmd[1:]), "rc": rc, "wall_s": round(wall, 1), "entries_before": before, "entries": after}
    row["phases"] = phases_of(text)
    print(f"tune {tag}: rc={rc} wall {wall:.1f} s, entries {before} -> {after}; {row['phases']}", flush=True)
    print("\n".join(text.splitlines()[-6:]), flush=True)
    return row


def verify(work: Path, models: list[str], trials: int) -> dict[str, Any]:
    from tunekit.evaluation.model_workflow import serving_from
    from tunekit.evaluation.tune_model import tune_model

    packs = OUT / "packs"
    packs.mkdir(parents=True, exist_ok=True)
    rows = {}
    for name in models:
        plan = work / "plans" / f"{name}.jsonl"
        if not plan.exists():
            continue
        keys = keys_of(plan)

        def load(plan_path: Path, trials: int, report: Any, budget_s: float | None = None, keys=keys) -> None:
            """tune_model's tuning: the union run's entries of this plan, into the working cache."""
            with Store(work / "cache") as src, Store() as dst:
                found = [e for e in (src.get(k) for k in keys) if e is not None]
                for e in found:
                    dst.put(e)
            report.tuned = len(found)

        with tempfile.TemporaryDirectory() as tmp, serving_from(Path(tmp)):
            base = build_pack_model(name, DEVICE, layers=1)
            eager = copy.deepcopy(base)
            report = tune_model(base, steps_for(PACK_MODELS[name].widths["vocab_size"]), trials=trials, eager=eager,
                                tune=load, rounds=5)  # fmt: skip
            with Store() as store:
                entries = [e for e in (store.get(k) for k in keys) if e is not None]
            n = write_document(packs / f"{name}.json", entries)
            base = eager = None
        torch.cuda.empty_cache() if DEVICE == "cuda" else None
        served = sum("torch_ms" in e.provenance and e.provenance["torch_ms"] > e.time_ms for e in entries)
        rows[name] = {
            "problems": len(keys),
            "entries": n,
            "kernel_beats_torch": served,
            "demoted": [f"{d.kernel} {d.problem} ({d.step} {d.gain:.1%})" for d in report.demoted],
            "steps": {s.step: {"vs_eager": s.vs_eager, "vs_before": s.vs_before} for s in report.steps},
        }
        print(report.table(), flush=True)
        print(f"pack {name}: {n} entries of {len(keys)} problems, {len(report.demoted)} demoted", flush=True)
    return rows


def compare(work: Path, against: Path) -> dict[str, Any]:
    mine = {e.key: e for e in Store(work / "cache").entries()}
    theirs = {e.key: e for e in Store(against).entries()}
    both = [k for k in mine if k in theirs]
    same, ratios, apart = 0, [], []
    for k in both:
        a, b = mine[k], theirs[k]
        if dict(a.config) == dict(b.config):
            same += 1
            continue
        measured = {json.dumps(dict(t.config), sort_keys=True): t.time_ms for t in a.trials if t.status == "ok"}
        t = measured.get(json.dumps(dict(b.config), sort_keys=True))
        ratios.append(t / a.time_ms if t else float("nan"))
        if t and t / a.time_ms > 1.05 and a.time_ms >= 0.05:  # past the noise of one timing at that size
            apart.append(f"{a.key.kernel} {a.time_ms:.3f} ms: {t / a.time_ms:.3f}x")
    known = sorted(r for r in ratios if r == r)
    row = {
        "common": len(both),
        "same_config": same,
        "differ": len(ratios),
        "differ_unmeasured_here": len(ratios) - len(known),
    }
    if known:
        row |= {"their_winner_here_median": statistics.median(known), "their_winner_here_max": known[-1]}
        row |= {"within_3pct": sum(r <= 1.03 for r in known), "within_5pct": sum(r <= 1.05 for r in known)}
        row["over_5pct_at_0.05ms_or_more"] = apart
    print(f"compare: {row}", flush=True)
    return row


def merge(source: Path, packs: Path = Path("cache/packs")) -> dict[str, Any]:
    """Each pack of `source` into `packs`: the devices `source` holds replaced, the others' entries kept."""
    rows = {}
    for path in sorted(source.glob("*.json")):
        new = read_document(path)
        devices = {e.key.device_key for e in new}
        target = packs / path.name
        kept = [e for e in read_document(target) if e.key.device_key not in devices] if target.exists() else []
        rows[path.stem] = {"kept": len(kept), "added": write_document(target, [*kept, *new]) - len(kept)}
    print(f"merge: {rows}", flush=True)
    return rows


class Swapped:
    """A global patch (Liger-Kernel's) in place only while its own calls run."""

    def __init__(self, inside: list, outside: list) -> None:
        self.inside, self.outside = inside, outside

    def __enter__(self) -> None:
        from tunekit.evaluation.model_bench import _restore

        _restore(self.inside)

    def __exit__(self, *exc: object) -> None:
        from tunekit.evaluation.model_bench import _restore

        _restore(self.outside)


def _logits_vs_eager(
    model: torch.nn.Module, eager: torch.nn.Module, ids: torch.Tensor, exact: torch.Tensor
) -> dict[str, float]:
    """Prefill logits against eager's (relative error, argmax agreement), and against `exact` (the same weights run
    in float32): how far each is from the float32 answer says which is the more accurate."""
    with torch.no_grad():
        got = model(ids, use_cache=False).logits.float()
        want = eager(ids, use_cache=False).logits.float()
    return {
        "rel_err": float((got - want).norm() / want.norm()),
        "argmax_agree": float((got.argmax(-1) == want.argmax(-1)).float().mean()),
        "fp32_err": float((got - exact).norm() / exact.norm()),
        "eager_fp32_err": float((want - exact).norm() / exact.norm()),
    }


def _float32_logits(eager: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    exact = copy.deepcopy(eager).float()
    with torch.no_grad():
        logits = exact(ids, use_cache=False).logits.float()
    del exact
    return logits


def _train_peak_gib(model: torch.nn.Module, train: Any) -> float:
    if DEVICE != "cuda":
        return 0.0
    model.train()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    train(model)
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**30


def reverify(models: list[str], rounds: int, step_names: list[str] | None = None) -> dict[str, Any]:
    import importlib.resources

    from tunekit.evaluation.model_workflow import serving_from
    from tunekit.evaluation.tune_model import tune_model
    from tunekit.runtime.dispatch import reset_all
    from tunekit.store import database

    device = fingerprint()
    installed = Path(str(importlib.resources.files("tunekit.shipped"))) / "packs"
    held = Path(tempfile.mkdtemp(prefix="packs-held-"))
    for path in installed.glob("*.json"):  # out of the package while this runs: "before" serves no pack
        path.rename(held / path.name)
    database.shipped_entries.cache_clear()
    database._shipped_by_scope.cache_clear()
    reset_all()
    (OUT / "packs").mkdir(parents=True, exist_ok=True)
    rows = {}
    try:
        for name in models:
            entries = read_document(held / f"{name}.json")
            mine = [e for e in entries if e.key.device_key == device.key]
            vocab = PACK_MODELS[name].widths["vocab_size"]
            step_fns = {s: fn for s, fn in steps_for(vocab).items() if step_names is None or s in step_names}
            gen = torch.Generator(device="cpu").manual_seed(2)
            ids = torch.randint(0, vocab, PACK_STEPS["prefill"], generator=gen).to(DEVICE)

            def load(plan_path: Path, trials: int, report: Any, budget_s: float | None = None, mine=mine) -> None:
                """tune_model's tuning: the pack's own entries for this GPU, into the working cache."""
                with Store() as store:
                    for e in mine:
                        store.put(e)
                report.tuned = len(mine)

            t0 = time.perf_counter()
            with tempfile.TemporaryDirectory() as tmp, serving_from(Path(tmp)):
                base = build_pack_model(name, DEVICE, layers=2)
                eager = copy.deepcopy(base)
                report = tune_model(base, step_fns, eager=eager, tune=load, rounds=rounds)
                exact = _float32_logits(eager, ids)
                with Store() as store:
                    kept = {e.key: e for e in store.entries()}
                rebuilt = [kept.get(e.key, e) if e.key.device_key == device.key else e for e in entries]
                write_document(OUT / "packs" / f"{name}.json", rebuilt)
                with_pack = _logits_vs_eager(base, eager, ids, exact)
                if "train" in step_fns:
                    with_pack["peak_gib"] = _train_peak_gib(base, step_fns["train"])
            with tempfile.TemporaryDirectory() as tmp, serving_from(Path(tmp)):
                without = _logits_vs_eager(base, eager, ids, exact)
                if "train" in step_fns:
                    without["peak_gib"] = _train_peak_gib(base, step_fns["train"])
            chosen = [d.verdict.chosen for d in report.in_step]
            rows[name] = {
                "entries": len(mine),
                "problems": report.problems,
                "in_step_kept": {c: chosen.count(c) for c in sorted(set(chosen))},
                "demoted": len(report.demoted),
                "undone": [u.step for u in report.undone],
                "steps": {s.step: {"with_vs_without": s.vs_before, "vs_eager": s.vs_eager} for s in report.steps},
                "with_pack": with_pack,
                "without_pack": without,
                "eager_peak_gib": _train_peak_gib(eager, step_fns["train"]) if "train" in step_fns else None,
                "seconds": round(time.perf_counter() - t0, 1),
            }
            print(report.table(), flush=True)
            print(f"reverify {name}: {json.dumps(rows[name], default=str)}", flush=True)
            base = eager = None
            torch.cuda.empty_cache() if DEVICE == "cuda" else None
    finally:
        for path in held.glob("*.json"):
            path.rename(installed / path.name)
        database.shipped_entries.cache_clear()
        database._shipped_by_scope.cache_clear()
    print(
        f"{'pack':<14} {'prefill':>8} {'decode':>8} {'train':>8}  (with pack / without, tune_model's alternation)"
        f"  peak GiB with/without/eager   rel err with/without   argmax with/without"
    )
    for name, row in rows.items():
        steps = row["steps"]
        w, wo = row["with_pack"], row["without_pack"]
        ratios = (f"{steps[s]['with_vs_without']:7.3f}x" if s in steps else f"{'-':>8s}" for s in PACK_STEPS)
        peaks = (w.get("peak_gib"), wo.get("peak_gib"), row["eager_peak_gib"])
        print(
            f"{name:<14} "
            + " ".join(ratios)
            + "  "
            + "/".join("-" if p is None else f"{p:.2f}" for p in peaks)
            + f"   {w['rel_err']:.4f}/{wo['rel_err']:.4f}   {w['argmax_agree']:.3f}/{wo['argmax_agree']:.3f}"
            + f"   {w['fp32_err']:.4f}/{wo['fp32_err']:.4f}/{w['eager_fp32_err']:.4f}"
        )
    return rows


def compiled(models: list[str], step_names: list[str]) -> dict[str, Any]:
    """Each pack's GEMM choices under torch.compile, decided in its compiled steps (tunekit.evaluation.
    compiled_step) with the pack serving: the pack's entries of the decided problems get the verdicts, and each
    pack is written whole to $OUT/packs/ (merge it with `--stages merge --from`)."""
    from tunekit.evaluation.compiled_step import decide_compiled
    from tunekit.evaluation.model_workflow import serving_from
    from tunekit.integrations.patching import patch
    from tunekit.store.entry import COMPILED

    (OUT / "packs").mkdir(parents=True, exist_ok=True)
    installed = Path(str(importlib.resources.files("tunekit.shipped"))) / "packs"
    rows = {}
    for name in models:
        t0 = time.perf_counter()
        vocab = PACK_MODELS[name].widths["vocab_size"]
        step_fns = steps_for(vocab)
        with tempfile.TemporaryDirectory() as tmp, serving_from(Path(tmp)):
            model = build_pack_model(name, DEVICE, layers=2)
            patch(model)
            model.train(False)
            report = decide_compiled(model, {s: step_fns[s] for s in step_names})
            with Store() as store:
                decided = {e.key: e for e in store.entries() if any(k.startswith(COMPILED) for k in e.provenance)}
        entries = read_document(installed / f"{name}.json")
        write_document(OUT / "packs" / f"{name}.json", [decided.get(e.key, e) for e in entries])
        rows[name] = {"searched": len(report.searched), "kept": len(report.kept), "stored": len(decided),
                      "steps": report.steps, "seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip
        print(report.table(), flush=True)
        print(f"compiled {name}: {json.dumps(rows[name])}", flush=True)
        model = None
        torch.cuda.empty_cache() if DEVICE == "cuda" else None
    return rows


def transfer(models: list[str], trials: int, rounds: int) -> dict[str, Any]:
    from tunekit.evaluation.model_bench import _modeling_state, _restore, _variant
    from tunekit.evaluation.model_workflow import serving_from
    from tunekit.evaluation.step_timing import Alternation, default_timer
    from tunekit.evaluation.tune_model import tune_model
    from tunekit.integrations import inductor_outer_products
    from tunekit.integrations.patching import patch

    rows = {}
    for name in models:
        spec = PACK_MODELS[name]
        base = build_pack_model(name, DEVICE, layers=2)
        step_fns = steps_for(spec.widths["vocab_size"])
        box_dir, tuned_dir = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
        tk = copy.deepcopy(base)
        patch(tk)
        t0 = time.perf_counter()
        with serving_from(tuned_dir):
            report = tune_model(copy.deepcopy(tk), step_fns, trials=trials, eager=base, rounds=5)
        tune_s = time.perf_counter() - t0
        print(report.table(), flush=True)
        variants: dict[str, Any] = {
            "eager": (base, base, nullcontext),
            "tunekit box": (tk, tk, lambda d=box_dir: serving_from(d)),
            "tunekit tuned": (tk, tk, lambda d=tuned_dir: serving_from(d)),
        }
        if DEVICE == "cuda":
            compiled = copy.deepcopy(base)
            # compile alone compiles its own graph (not with the outer-product pass tunekit.patch installed)
            variants["compile"] = (compiled, torch.compile(compiled), inductor_outer_products.disabled)
        row: dict[str, Any] = {
            "tune_model_s": round(tune_s, 1),
            "demoted": len(report.demoted),
            "problems": report.problems,
        }
        if spec.family is not None:
            try:
                clean = _modeling_state(spec.family)
                liger_model, _ = _variant(base, "liger", spec.family)
                liger_state = _modeling_state(spec.family)
                _restore(clean)
                variants["liger"] = (liger_model, liger_model, lambda s=liger_state, c=clean: Swapped(s, c))
            except Exception as exc:
                row["liger"] = str(exc)[:200]
        timer = default_timer(base)
        for step_name, step in step_fns.items():
            calls = {}
            for variant, (model, run, context) in variants.items():

                def call(model=model, run=run, step=step, train=step_name == "train") -> None:
                    model.train(train)
                    step(run)
                    model.zero_grad(set_to_none=True)

                calls[variant] = (call, context)
            times = Alternation(timer, rounds, reps=5, warmup=3).run(calls)
            speeds = {v: statistics.median(e / t for e, t in zip(times["eager"], times[v])) for v in variants}
            box_vs_tuned = statistics.median(t / b for t, b in zip(times["tunekit tuned"], times["tunekit box"]))
            row[step_name] = {**speeds, "box_vs_tuned": box_vs_tuned, "eager_ms": statistics.median(times["eager"])}
            print(f"{name} {step_name}: " + ", ".join(f"{k} {v:.3f}" for k, v in row[step_name].items()), flush=True)
        rows[name] = row
        (OUT / f"transfer_{name}.json").write_text(json.dumps(row, indent=1, default=str))
        base = tk = None
        torch.cuda.empty_cache() if DEVICE == "cuda" else None
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--stages", default="record,tune,verify")
    parser.add_argument("--models", default=",".join(PACK_MODELS))
    parser.add_argument("--work", type=Path, default=None, help="default: .gpu_cache/packs/<device label>")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--workers", type=int, default=None)
    # 0.03 built the first packs; their decode GEMMs then lost to a full 8-trial tune (RESULTS.md, 2026-11-27)
    parser.add_argument("--early-stop", default="0.03", help="the tune stage's --early-stop, or off")
    parser.add_argument("--cap", type=float, default=520.0, help="seconds allowed to the tune stage")
    parser.add_argument("--against", type=Path, default=None)
    parser.add_argument("--from", dest="source", type=Path, default=None, help="the merge stage's pack files")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tag", default="one")
    parser.add_argument("--compiled-steps", default="decode", help="the compiled stage's steps")
    parser.add_argument("--reverify-steps", default=None, help="the reverify stage's steps (default: every step)")
    parser.add_argument("--shrink", type=int, default=1)
    parser.add_argument("--phases-of", type=Path, default=None, help="only print a tune log's seconds per phase")
    opts = parser.parse_args()
    if opts.phases_of:
        print(json.dumps(phases_of(opts.phases_of.read_text())))
        return
    if opts.stages == "merge":
        merge(opts.source)
        return
    if opts.shrink > 1:
        shrink_widths(opts.shrink)
    OUT.mkdir(parents=True, exist_ok=True)
    work = opts.work or Path(".gpu_cache/packs") / fingerprint().label.replace(" ", "_")
    work.mkdir(parents=True, exist_ok=True)
    models = opts.models.split(",")
    result: dict[str, Any] = {"device": fingerprint().label}
    for stage in opts.stages.split(","):
        t0 = time.perf_counter()
        if stage == "record":
            result[stage] = record(work, models)
        elif stage == "tune":
            result[stage] = tune(work, opts.trials, opts.workers, opts.cap, opts.tag, opts.early_stop)
        elif stage == "verify":
            result[stage] = verify(work, models, opts.trials)
        elif stage == "compare":
            result[stage] = compare(work, opts.against)
        elif stage == "reverify":
            steps = opts.reverify_steps.split(",") if opts.reverify_steps else None
            result[stage] = reverify(models, opts.rounds, steps)
        elif stage == "compiled":
            result[stage] = compiled(models, opts.compiled_steps.split(","))
        elif stage == "transfer":
            result[stage] = transfer(models, opts.trials, opts.rounds)
        else:
            raise SystemExit(f"unknown stage {stage}")
        result[stage + "_s"] = round(time.perf_counter() - t0, 1)
        (OUT / f"model_packs_{opts.tag}.json").write_text(json.dumps(result, indent=1, default=str))
    # The plans and the union's store come back too: a later call on a fresh machine carries them in as --work.
    import tarfile

    with tarfile.open(OUT / f"work_{opts.tag}.tar.gz", "w:gz") as tar:  # one file: the device returns few
        for part in ("plans", "cache/store.sqlite3"):
            if (work / part).exists():
                tar.add(work / part, arcname=part)
    print(json.dumps({k: v for k, v in result.items() if k.endswith("_s") or k == "device"}))


if __name__ == "__main__":
    main()
