"""The typer app, the options several commands share, and the error boundary every command runs in (the consoles
and `say` are tunekit.cli.consoles' and tunekit.cli.width's, imported from here too)."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from tunekit import DISTRIBUTION
from tunekit.cli.consoles import console as console  # the commands' consoles and `say`, imported from here
from tunekit.cli.consoles import err_console
from tunekit.cli.width import say as say
from tunekit.core import settings
from tunekit.core.errors import TunekitError
from tunekit.core.render import plain

# The click that parses the command line: typer's own copy (typer._click) from typer 0.22, click itself before
# (click need not be installed at all). Its usage errors derive from ClickException, as typer.BadParameter does.
_USAGE_ERRORS: tuple[type[Exception], ...] = tuple(
    c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException"
)
_ABORTS: tuple[type[BaseException], ...] = (typer.Abort,)


class _OneLineGroup(TyperGroup):
    """The command group: a usage error (an unknown option, a value of the wrong type) is one line on stderr,
    `error: ... (see `tunekit CMD --help`)`, exit code 2; Ctrl-C anywhere outside a command's own handler: 130."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _USAGE_ERRORS as exc:
            message = exc.format_message()  # type: ignore[attr-defined]
            if type(exc).__name__ == "NoArgsIsHelpError":  # `tunekit` alone: its help, on stdout
                print(message)
                code = 0
            else:
                ctx = getattr(exc, "ctx", None)
                where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
                print(f"error: {plain(message)}{where}", file=sys.stderr)
                code = getattr(exc, "exit_code", 2)
        except _ABORTS:
            print("interrupted", file=sys.stderr)
            code = 130
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """Each command with its whole summary (click cuts one to what fits beside the names, mid-sentence); one
        that does not fit the width wraps between words."""
        rows = [(name, cmd.short_help or "") for name, cmd in self.commands.items() if not cmd.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


app = typer.Typer(
    name="tunekit",
    cls=_OneLineGroup,
    help="Autotune Triton kernels per problem shape and GPU; keep the winners in a device-keyed cache.",
    epilog="\b\nEnvironment variables:\n" + "\n".join("  " + line for line in settings.environment_text(76)) + "\n",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's help: descriptions wrap in a wide column at 80 columns, no panels
)


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
    # Where kernels run is said by the commands where it matters (tune, bench, worker), once: not as a log line on
    # every command that happens to import torch.
    logging.getLogger("tunekit.backend").setLevel(logging.ERROR)


def interpreter_note() -> None:
    """One short line on stderr when kernels run in Triton's interpreter (for the commands that measure)."""
    from tunekit.core import backend

    if backend.INTERPRETED:
        err_console.print(
            "note: no CUDA GPU: kernels run in Triton's interpreter on the CPU (CPU speed, wall-clock timings)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def error_line(message: object) -> None:
    """One `error:` line on stderr: what the boundary prints, and what a command that goes on past one bad item of
    many (a plan's line) prints for each."""
    err_console.print(f"error: {plain(message)}", markup=False, highlight=False, soft_wrap=True)


def _one_line_errors(fn: Callable[..., None]) -> Callable[..., None]:
    """The error boundary: a known error is one line on stderr and exit code 1 (TUNEKIT_DEBUG=1: traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        try:
            settings.check_environment()  # a bad TUNEKIT_* value: refused as Python refuses it, before any work
            fn(*args, **kwargs)
        except TunekitError as exc:
            if settings.debug():
                raise
            error_line(exc)
            raise typer.Exit(1) from None

    return wrapper


def command(name: str, summary: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register `fn` as the command `name`, inside the error boundary; `tunekit --help` lists it with `summary`."""

    def register(fn: Callable[..., None]) -> Callable[..., None]:
        return app.command(name, short_help=summary)(_one_line_errors(fn))

    return register


KernelOpt = Annotated[
    str, typer.Option("--kernel", "-k", metavar="KERNEL", help="Kernel name (see `tunekit show --kernels`).")
]
ShapeOpt = Annotated[
    list[str] | None,
    typer.Option("--shape", "-s", metavar="SHAPE", help="Problem shape, e.g. 4096x1024 (repeatable)."),
]
DtypeOpt = Annotated[str | None, typer.Option("--dtype", metavar="DTYPE", help="float16, bfloat16 or float32.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout instead of text.")]
QueueOpt = Annotated[str, typer.Option("--queue", help="The job queue's name (one storage holds many).")]
FleetStorageOpt = Annotated[
    str,
    typer.Option(
        "--storage",
        help="The shared store: an Optuna RDB URL (postgresql://..., sqlite:///fleet.db) or a journal file path.",
    ),
]
