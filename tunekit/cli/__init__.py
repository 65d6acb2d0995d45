"""The `tunekit` command: every command registered on the typer app, and `main`, the console script."""

from __future__ import annotations

from collections.abc import Callable

from tunekit.cli.app import app, command
from tunekit.cli.cache import export_cmd, forget, import_cmd, in_step, show
from tunekit.cli.fleet import plan, requeue, status, worker
from tunekit.cli.measure import bench, bench_host, devices, efficiency, explain, plot, record_cmd
from tunekit.cli.models import model_bench
from tunekit.cli.tune import tune

__all__ = ["app", "main"]

# Registered here, in one list, because its order is the order `tunekit --help` lists the commands in, each with its
# summary: one whole sentence that fits one line of click's help (61 characters; tests/cli/test_cli_help.py).
COMMANDS: list[tuple[str, Callable[..., None], str]] = [
    ("tune", tune, "Tune a kernel's shapes or a plan's problems; store the best."),
    ("worker", worker, "Take jobs from a queue and tune them on this GPU."),
    ("status", status, "Jobs queued, running, done and failed in each queue."),
    ("requeue", requeue, "Queue again the jobs whose worker is gone."),
    ("plan", plan, "Write a plan (kernels x shapes x dtypes), or check one."),
    ("show", show, "What is tuned for this device, and what serves each problem."),
    ("in-step", in_step, "Each problem timed alone and inside a model's step."),
    ("export", export_cmd, "Write the cache (or a fleet's store) as a tuning database."),
    ("import", import_cmd, "Check a tuning database, then merge it into the cache."),
    ("forget", forget, "Remove entries from the cache."),
    ("bench", bench, "Tuned tunekit vs torch, torch.compile and the roofline."),
    ("plot", plot, "Draw a bench run's JSON, one PNG per family."),
    ("record", record_cmd, "Time every valid config on this GPU into a timing table."),
    ("explain", explain, "What the quantization model makes of one problem."),
    ("efficiency", efficiency, "Tuning efficiency on a device simulated from timing tables."),
    ("devices", devices, "The devices seen, with their fingerprints and cache keys."),
    ("bench-host", bench_host, "Host time per eager call of every op, next to torch's."),
    ("model-bench", model_bench, "Time Llama- and GPT-2-style models, eager against tunekit."),
]
for _name, _fn, _summary in COMMANDS:
    command(_name, _summary)(_fn)


def main() -> None:
    app(prog_name="tunekit")
