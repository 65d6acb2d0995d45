"""Output that fits the terminal: text wrapped between words (a record's `name=value` pairs are words), and tables
that become one record per row where they would not fit. Never a cell cut short, never a word cut in two.

The width is the console's (the terminal's, or COLUMNS, or 80 when output goes to a file or a pipe).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

from rich.table import Table

from tunekit.cli.consoles import console
from tunekit.core.render import markup

CONTINUATION = "    "  # what a wrapped line's continuation lines are indented by, past the line's own indent


def columns() -> int:
    return max(20, console.width)


def say(text: str) -> None:
    """One line of output, never cut; rich markup off (stored text is printed as it is). On a terminal it wraps
    between words at the terminal's width (a record between its `name=value` pairs); in a log or a pipe it stays one
    line, whole, for grep."""
    for line in wrap(text) if console.is_terminal else [text]:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def wrap(text: str, width: int | None = None) -> list[str]:
    """`text` as lines of at most `width` columns, broken between words (a word longer than the width stays whole);
    continuation lines are indented past the line's own indent."""
    width = columns() if width is None else width
    body = text.lstrip(" ")
    indent = text[: len(text) - len(body)]
    if len(text) <= width or not body:
        return [text]
    lines = textwrap.wrap(
        body,
        width,
        initial_indent=indent,
        subsequent_indent=indent + CONTINUATION,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return lines or [text]


def rows(title: str | None, headers: Sequence[str], cells: Sequence[Sequence[str]]) -> None:
    """A table where it fits the width; otherwise one record per row, `header=value` pairs wrapped between pairs,
    empty cells left out (cells are plain text, escaped here for the table; a cell should hold no space, so that a
    record's pairs stay apart)."""
    widths = [max([len(header), *(len(row[i]) for row in cells)]) for i, header in enumerate(headers)]
    if sum(widths) + 3 * len(widths) + 1 <= columns():  # each cell padded by one space each side, one border each
        table = Table(title=markup(title) if title else None)
        for header in headers:
            table.add_column(header, no_wrap=True)
        for row in cells:
            table.add_row(*(markup(cell) for cell in row))
        console.print(table)
        return
    if title:
        say(f"{title}:")
    for row in cells:
        pairs = (f"{header.replace(' ', '_')}={cell}" for header, cell in zip(headers, row) if cell)
        say("  " + " ".join(pairs))
