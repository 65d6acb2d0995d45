"""The typer app, the consoles, the options several commands share, and the error boundary every command runs in."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.console import Console

from tunekit import DISTRIBUTION
from tunekit.core import settings
from tunekit.core.errors import TunekitError
from tunekit.core.render import plain

app = typer.Typer(
    name="tunekit",
    help="Autotune Triton kernels per problem shape and GPU; keep the winners in a device-keyed cache.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


def _print_version(value: bool) -> None:
    if value:
        from tunekit import __version__

        print(f"tunekit {__version__} (distribution {DISTRIBUTION})")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print tunekit's version and exit."),
    ] = False,
) -> None:
    """Autotune Triton kernels per problem shape and GPU; keep the winners in a device-keyed cache."""


def _one_line_errors(fn: Callable[..., None]) -> Callable[..., None]:
    """The error boundary: a known error is one line on stderr and exit code 1 (TUNEKIT_DEBUG=1: traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except TunekitError as exc:
            if settings.debug():
                raise
            err_console.print(f"error: {plain(exc)}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper


def command(name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register `fn` as the command `name`, inside the error boundary."""

    def register(fn: Callable[..., None]) -> Callable[..., None]:
        return app.command(name)(_one_line_errors(fn))

    return register


def say(text: str) -> None:
    """One line of output, never cut: rich markup off (stored text is printed as it is) and no hard wrapping."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


KernelOpt = Annotated[str, typer.Option("--kernel", "-k", help="Kernel name (see `tunekit show --kernels`).")]
ShapeOpt = Annotated[
    list[str] | None, typer.Option("--shape", "-s", help="Problem shape, e.g. 4096x1024 (repeatable).")
]
DtypeOpt = Annotated[str | None, typer.Option("--dtype", help="float16, bfloat16 or float32.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout instead of text.")]
QueueOpt = Annotated[str, typer.Option("--queue", help="The job queue's name (one storage holds many).")]
FleetStorageOpt = Annotated[
    str,
    typer.Option(
        "--storage",
        help="The shared store: an Optuna RDB URL (postgresql://..., sqlite:///fleet.db) or a journal file path.",
    ),
]
