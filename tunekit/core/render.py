"""Text from stored data, made safe to print. The one place the CLI escapes what it did not write itself.

A cache entry, an imported database or a fleet storage can hold any string: device names, provenance, problem
fields, job errors, worker names. Printed raw, `[/nope]` breaks rich's markup parser (a MarkupError on every
`show`), and an ANSI escape reaches the terminal (moving the cursor, rewriting what was printed, setting the
window title). So:
- `plain(value)`: control characters (C0, DEL, C1 with ESC among them) and the invisible format characters that
  reorder or hide text (bidi overrides, zero-width spaces, the BOM) are shown as `\\xNN` / `\\uNNNN` escapes;
  for output printed without markup (`print`, `Console.print(markup=False)`, one-line errors).
- `markup(value)`: `plain`, then rich's markup escape; for everything rich parses (table cells, console.print).
- `brief(value)`: a bad value quoted in a one-line error message: its repr (which escapes control characters), cut
  short (a hostile file may hold megabytes in one field).
"""

from __future__ import annotations

import re

from rich.markup import escape as _escape_markup

__all__ = ["brief", "markup", "plain"]

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def plain(value: object) -> str:
    """`value` as text with every control and invisible format character written as an escape."""
    text = value if isinstance(value, str) else str(value)
    return _UNSAFE.sub(_visible, text)


def markup(value: object) -> str:
    """`plain(value)`, also escaped for rich's markup: it prints as itself wherever rich parses markup."""
    return _escape_markup(plain(value))


def brief(value: object, limit: int = 80) -> str:
    """repr(value) on one line, at most `limit` characters."""
    text = repr(value).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
