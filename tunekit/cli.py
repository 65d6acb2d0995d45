"""The `tunekit` command: thin commands over the library, one error boundary, one line per known error."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from tunekit import settings
from tunekit.errors import InvalidShapeError, TunekitError
from tunekit.space import Config, Problem
from tunekit.spec import KernelSpec

app = typer.Typer(
    name="tunekit",
    help="Autotune Triton kernels per problem shape and GPU; keep the winners in a device-keyed cache.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


def _one_line_errors(fn: Callable[..., None]) -> Callable[..., None]:
    """The error boundary: a known error is one line on stderr and exit code 1 (TUNEKIT_DEBUG=1: traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except TunekitError as exc:
            if settings.debug():
                raise
            err_console.print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper


def command(name: str | None = None) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def register(fn: Callable[..., None]) -> Callable[..., None]:
        return app.command(name)(_one_line_errors(fn))

    return register


KernelOpt = Annotated[str, typer.Option("--kernel", "-k", help="Kernel name (see `tunekit show --kernels`).")]
ShapeOpt = Annotated[
    list[str] | None, typer.Option("--shape", "-s", help="Problem shape, e.g. 4096x1024 (repeatable).")
]
DtypeOpt = Annotated[str | None, typer.Option("--dtype", help="float16, bfloat16 or float32.")]


def parse_shape(text: str) -> tuple[int, ...]:
    parts = text.lower().replace("*", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if not dims or any(d < 1 for d in dims):
        raise InvalidShapeError(f"--shape must be positive integers joined by 'x' (e.g. 4096x1024), but got {text!r}")
    return dims


def _problems(kernel: str, shapes: list[str] | None, dtype: str | None) -> list[Problem]:
    from tunekit.device import fingerprint
    from tunekit.registry import get_spec

    spec = get_spec(kernel)
    if not shapes:
        problems = spec.default_problems(fingerprint())
        return [dict(p, dtype=dtype) if dtype else dict(p) for p in problems]
    default_dtype = dtype or ("float32" if fingerprint().is_interpreter else "float16")
    return [dict(spec.problem_from_shape(parse_shape(s), default_dtype)) for s in shapes]


def _show_config(spec: KernelSpec, config: Config) -> str:
    return " ".join(f"{name}={config[name]}" for name in spec.space.names)


def _advance(progress: Any, task: Any, record: object, done: int) -> None:
    progress.update(task, completed=done)


@command()
def tune(
    kernel: KernelOpt,
    shape: ShapeOpt = None,
    dtype: DtypeOpt = None,
    trials: Annotated[int, typer.Option(help="Configs to benchmark per shape.")] = 30,
    timeout: Annotated[float | None, typer.Option(help="Seconds per shape (a budget, not a kill).")] = None,
    sampler: Annotated[str, typer.Option(help="tpe, random or exhaustive.")] = "tpe",
    storage: Annotated[
        str | None, typer.Option(help="Optuna storage URL (e.g. sqlite:///tune.db); in-memory if unset.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the sampler and of the random inputs.")] = 0,
) -> None:
    """Tune KERNEL for each shape (a default set when none is given) and store the winners."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tunekit.bench import default_timer
    from tunekit.cache_key import CacheKey
    from tunekit.device import fingerprint
    from tunekit.registry import get_spec
    from tunekit.store import Store
    from tunekit.tuner import TuneOptions
    from tunekit.tuner import tune as run_tune

    spec = get_spec(kernel)
    problems = _problems(kernel, shape, dtype)
    options = TuneOptions(trials=trials, timeout_s=timeout, sampler=sampler, storage=storage, seed=seed)
    device = fingerprint()
    timer = default_timer()
    table = Table(title=f"{spec.name} on {device.label} ({timer.label}, ms)")
    for col in ("problem", "heuristic", "tuned", "speedup", "measured", "best config"):
        table.add_column(col)
    with Store() as store:
        for problem in problems:
            previous = store.get(CacheKey.make(spec.name, spec.source_hash, device.key, problem))
            with Progress(
                TextColumn(f"{spec.describe_problem(problem)}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            ) as progress:
                task = progress.add_task("tune", total=trials)
                report = run_tune(
                    spec,
                    problem,
                    device,
                    options,
                    timer=timer,
                    previous=previous,
                    on_trial=functools.partial(_advance, progress, task),
                    checkpoint=store.put,
                )
            stored = store.put(report.entry)
            heuristic = dict(spec.heuristic(problem, device))
            h_ms = next((t.time_ms for t in stored.trials if t.config == heuristic and t.status == "ok"), None)
            table.add_row(
                spec.describe_problem(problem),
                f"{h_ms:.4f}" if h_ms else "-",
                f"{stored.time_ms:.4f}",
                f"{h_ms / stored.time_ms:.2f}x" if h_ms else "-",
                f"{report.benchmarked} new, {report.reused} reused ({report.stop_reason})",
                _show_config(spec, stored.config),
            )
    console.print(table)
    console.print(f"cache: {store.directory}")


@command()
def show(
    kernel: Annotated[str | None, typer.Option("--kernel", "-k", help="Only this kernel.")] = None,
    shape: ShapeOpt = None,
    dtype: DtypeOpt = None,
    kernels: Annotated[bool, typer.Option("--kernels", help="List the kernels and exit.")] = False,
) -> None:
    """What the cache holds; with --kernel and --shape, which dispatch layer serves that problem."""
    from tunekit.device import fingerprint
    from tunekit.dispatch import resolve
    from tunekit.registry import get_spec, kernel_names
    from tunekit.store import Store

    if kernels:
        for name in kernel_names():
            console.print(f"{name}: {get_spec(name).description}")
        return
    device = fingerprint()
    with Store() as store:
        if shape:
            if kernel is None:
                raise TunekitError("--shape needs --kernel")
            spec = get_spec(kernel)
            for problem in _problems(kernel, shape, dtype):
                res = resolve(spec, problem, device, store)
                console.print(f"{spec.describe_problem(problem)}: served by {res.layer}: {dict(res.config)}")
            return
        if kernel is not None:
            get_spec(kernel)
        table = Table(title=f"cache at {store.directory} (this device: {device.label} key {device.key})")
        for col in ("kernel", "device", "problem", "best ms", "config", "trials", "servable here"):
            table.add_column(col)
        count = 0
        for e in sorted(store.entries(), key=lambda e: (e.key.kernel, str(e.key.problem))):
            if kernel is not None and e.key.kernel != kernel:
                continue
            count += 1
            servable = e.key.device_key == device.key and e.key.source_hash == get_spec(e.key.kernel).source_hash
            table.add_row(
                e.key.kernel,
                e.device.get("name", "?") + f" ({e.key.device_key[:8]})",
                ",".join(f"{k}={v}" for k, v in e.key.problem),
                f"{e.time_ms:.4f}",
                _show_config(get_spec(e.key.kernel), e.config),
                str(len(e.trials)),
                "yes" if servable else "no",
            )
        console.print(table)
        console.print(f"{count} entries")


@command("export")
def export_cmd(
    out: Annotated[Path, typer.Option("--out", "-o", help="File to write (JSON).")],
    kernel: Annotated[str | None, typer.Option("--kernel", "-k", help="Only this kernel.")] = None,
    device: Annotated[
        str | None, typer.Option(help="Only this device key, or 'current' for this machine's device.")
    ] = None,
) -> None:
    """Write the cache (filtered by kernel and device) as a tuning database."""
    from tunekit.database import export_entries, write_document
    from tunekit.device import fingerprint
    from tunekit.store import Store

    device_key = fingerprint().key if device == "current" else device
    with Store() as store:
        n = write_document(out, export_entries(store, kernel, device_key))
    console.print(f"exported {n} entries to {out}")


@command("import")
def import_cmd(path: Annotated[Path, typer.Argument(help="A tuning database written by `tunekit export`.")]) -> None:
    """Validate FILE, then merge it into the cache (the faster entry is kept per key)."""
    from tunekit.database import import_document
    from tunekit.store import Store

    with Store() as store:
        read, changed = import_document(store, path)
    console.print(f"imported {path}: {read} entries read, {changed} added or improved")


@command()
def bench(
    kernel: KernelOpt,
    shape: ShapeOpt = None,
    dtype: DtypeOpt = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the rows as JSON.")] = None,
) -> None:
    """Dispatched (tuned) config vs heuristic default vs torch, in GB/s and as a fraction of copy bandwidth."""
    import dataclasses
    import json

    from tunekit.report import run_report

    copy, rows = run_report(kernel, _problems(kernel, shape, dtype))
    table = Table(title=f"{kernel}: GB/s (copy bandwidth measured in this run: {copy:.0f} GB/s)")
    for col in ("problem", "served by", "tuned", "heuristic", "torch", "tuned/copy", "tuned/torch", "correct"):
        table.add_column(col)

    def fmt(x: float | None, spec: str = ".0f") -> str:
        return "-" if x is None else format(x, spec)

    for r in rows:
        tuned, heur, ref = r.gbps(r.tuned_ms), r.gbps(r.heuristic_ms), r.gbps(r.torch_ms)
        table.add_row(
            r.problem,
            r.layer,
            fmt(tuned),
            fmt(heur),
            fmt(ref),
            fmt(tuned / copy if tuned else None, ".2f"),
            fmt(r.torch_ms / r.tuned_ms if r.torch_ms else None, ".2f"),
            "yes" if r.correct else "NO",
        )
    console.print(table)
    if json_out is not None:
        payload = {"kernel": kernel, "copy_gbps": copy, "rows": [dataclasses.asdict(r) for r in rows]}
        json_out.write_text(json.dumps(payload, indent=1))


@command()
def devices() -> None:
    """The devices tunekit sees, with their fingerprints and cache keys."""
    from tunekit.device import all_fingerprints

    for fp in all_fingerprints():
        console.print(f"[bold]{fp.label}[/bold]  key={fp.key}")
        for name, value in fp.to_json().items():
            console.print(f"  {name}: {value}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
