"""The consoles every command prints through: stdout for results, stderr for errors."""

from __future__ import annotations

from rich.console import Console

console = Console()
err_console = Console(stderr=True)
