"""The `tunekit` command: every command registered on the typer app, and `main`, the console script."""

from __future__ import annotations

from collections.abc import Callable

from tunekit.cli.app import app, command
from tunekit.cli.cache import export_cmd, forget, import_cmd, show
from tunekit.cli.fleet import plan, requeue, status, worker
from tunekit.cli.measure import bench, bench_host, devices, efficiency, explain, plot, record_cmd
from tunekit.cli.models import model_bench
from tunekit.cli.tune import tune

__all__ = ["app", "main"]

# Registered here, in one list, because its order is the order `tunekit --help` lists the commands in.
COMMANDS: list[tuple[str, Callable[..., None]]] = [
    ("tune", tune),
    ("worker", worker),
    ("status", status),
    ("requeue", requeue),
    ("plan", plan),
    ("show", show),
    ("export", export_cmd),
    ("import", import_cmd),
    ("forget", forget),
    ("bench", bench),
    ("plot", plot),
    ("record", record_cmd),
    ("explain", explain),
    ("efficiency", efficiency),
    ("devices", devices),
    ("bench-host", bench_host),
    ("model-bench", model_bench),
]
for _name, _fn in COMMANDS:
    command(_name)(_fn)


def main() -> None:
    app(prog_name="tunekit")
