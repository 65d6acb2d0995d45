"""`tunekit model-bench`: a Llama- and a GPT-2-style model (transformers configs, random weights) timed eager,
tunekit-patched, compiled and against Liger-Kernel, optionally with the record -> tune -> rerun workflow."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tunekit.cli.app import say
from tunekit.core.errors import TunekitError
from tunekit.evaluation.model_results import ALL_VARIANTS, MODELS, VARIANTS, Workload, rerun_variants

DEFAULT = Workload("llama")  # the defaults of every size option
PREFILL, DECODE, TRAIN = (f"{b}x{t}" for b, t in (DEFAULT.prefill, DEFAULT.decode, DEFAULT.train))


def parse_size(flag: str, text: str) -> tuple[int, int]:
    """`4x1024` -> (4, 1024): a run's batch and tokens."""
    parts = text.lower().replace("*", "x").split("x")
    try:
        batch, tokens = (int(p) for p in parts)
    except ValueError:
        batch = tokens = 0
    if batch < 1 or tokens < 1:
        raise TunekitError(f"{flag} must be batch x tokens, two positive integers (e.g. 4x1024), but got {text!r}")
    return batch, tokens


def parse_models(text: str) -> tuple[str, ...]:
    if text == "all":
        return MODELS
    if text not in MODELS:
        raise TunekitError(f"--model must be one of {', '.join(MODELS)} or all, but got {text!r}")
    return (text,)


def parse_variants(text: str) -> tuple[str, ...]:
    """Comma-separated variant names, in the benchmark's order, each once."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_VARIANTS]
    if unknown or not names:
        raise TunekitError(f"--variants takes a comma list of {', '.join(ALL_VARIANTS)}, but got {text!r}")
    return tuple(v for v in ALL_VARIANTS if v in names)


def require_gpu() -> None:
    """The benchmark times CUDA GPUs: anywhere else it stops before building anything."""
    from tunekit.core import backend

    if backend.INTERPRETED:
        raise TunekitError(
            "the model benchmark times CUDA GPUs, and kernels run in Triton's interpreter here (no CUDA GPU, or "
            "TRITON_INTERPRET=1): run it on a GPU machine"
        )


def workloads(
    models: tuple[str, ...], layers: int, hidden: int, vocab: int, sizes: dict[str, tuple[int, int]]
) -> list[Workload]:
    if "gpt2" in models and hidden % 64:
        raise TunekitError(f"--hidden must be a multiple of 64 for gpt2 (its heads are 64 wide), but got {hidden}")
    return [Workload(m, layers=layers, hidden=hidden, vocab=vocab, **sizes) for m in models]


def model_bench(
    model: Annotated[str, typer.Option("--model", help="llama, gpt2, mistral, qwen2, gemma or all.")] = "all",
    layers: Annotated[int, typer.Option(min=1, help="Decoder layers.")] = DEFAULT.layers,
    hidden: Annotated[
        int, typer.Option(min=1, help="Hidden size (Llama: heads of 128, an MLP 2.6875x as wide; GPT-2: heads of 64).")
    ] = DEFAULT.hidden,
    vocab: Annotated[int, typer.Option(min=1, help="Vocabulary size.")] = DEFAULT.vocab,
    prefill: Annotated[str, typer.Option(help="Prefill: batch x tokens, no grad.")] = PREFILL,
    decode: Annotated[str, typer.Option(help="Decode: batch x tokens, no grad, no KV cache.")] = DECODE,
    train: Annotated[str, typer.Option(help="Training step (forward, backward, SGD): batch x tokens.")] = TRAIN,
    variants: Annotated[
        str,
        typer.Option(
            help="Comma-separated; eager always runs (every ratio and error is against it). Also: tiles+compile and "
            "tiles+compile-ro, the unpatched model compiled with tunekit's tuned GEMM tiles as Inductor's choices."
        ),
    ] = ",".join(VARIANTS),
    reps: Annotated[int, typer.Option(min=1, help="Timed runs a turn in each alternation round.")] = 10,
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Directory for model_bench.json, model_bench.txt, model_bench.png and the plans."),
    ] = None,
    workflow: Annotated[
        bool,
        typer.Option(
            "--workflow/--no-workflow",
            help="Also per model: record the patched model's problems, tune that plan, rerun the tunekit variants "
            "served by it, and time each step.",
        ),
    ] = False,
    trials: Annotated[int, typer.Option(min=1, help="With --workflow: trials per recorded problem.")] = 20,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            "--cache-dir",
            help="With --workflow: the cache to tune into and rerun from (default: a fresh temporary one per model, "
            "deleted afterwards).",
        ),
    ] = None,
) -> None:
    """Time a Llama- and a GPT-2-style model (random weights, nothing downloaded) for prefill, decode and training:
    eager, tunekit-patched, torch.compile (default and reduce-overhead), both, Liger-Kernel. Reports ms, speed vs
    eager, tokens/s, peak memory, agreement with eager and each variant's first-call (compile) seconds. Needs a
    CUDA GPU and transformers (the `models` extra)."""
    names = parse_variants(variants)
    sizes = {"prefill": parse_size("--prefill", prefill), "decode": parse_size("--decode", decode)}
    sizes["train"] = parse_size("--train", train)
    loads = workloads(parse_models(model), layers, hidden, vocab, sizes)
    if workflow:
        rerun_variants(names)  # fails now, not after the first measurement
    elif cache_dir is not None:
        raise TunekitError("--cache-dir is the workflow's cache: it goes with --workflow")
    _run(loads, names, reps, out, trials if workflow else None, cache_dir)


def _run(
    loads: list[Workload], names: tuple[str, ...], reps: int, out: Path | None, trials: int | None, cache: Path | None
) -> None:
    """Check the machine, measure, print the table, write the files."""
    require_gpu()
    from tunekit.evaluation.model_bench import device_name, measure, require_transformers
    from tunekit.evaluation.model_run import ModelBenchRun, WorkflowOptions, run_bench, write_outputs
    from tunekit.evaluation.model_workflow import gpu_workflow

    require_transformers()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)  # now, not after the measurements: the plans are written there
    options = WorkflowOptions(trials, cache) if trials is not None else None
    run = ModelBenchRun(loads, names, reps, device_name())
    try:
        run_bench(run, options, out, measure, gpu_workflow, say=say)
    except BaseException:
        if out is not None and run.results:  # minutes of GPU time: what was measured is kept, then the error
            write_outputs(run, out)
        raise
    print(run.text())
    for line in write_outputs(run, out) if out is not None else []:
        say(line)
