"""Text from stored data, made safe to print. The one place the CLI escapes what it did not write itself.

A cache entry, an imported database or a fleet storage can hold any string: device names, provenance, problem
fields, job errors, worker names. Printed raw, `[/nope]` breaks rich's markup parser (a MarkupError on every
`show`), and an ANSI escape reaches the terminal (moving the cursor, rewriting what was printed, setting the
window title). So:
- `plain(value)`: every character of Unicode categories Cc, Cf, Co, Cs, Zl and Zp (controls, ESC among them; the
  invisible format characters that reorder or hide text: bidi marks and overrides, zero-width spaces, the BOM, tag
  characters; private use; lone surrogates; line and paragraph separators) is shown as a `\\xNN` / `\\uNNNN` /
  `\\UNNNNNNNN` escape; for output printed without markup (`print`, `Console.print(markup=False)`, errors).
- `markup(value)`: `plain`, then rich's markup escape; for everything rich parses (table cells, console.print).
- `brief(value)`: a bad value quoted in a one-line error message: its repr (which escapes control characters), cut
  short (a hostile file may hold megabytes in one field).
"""

from __future__ import annotations

import re
import unicodedata

from rich.markup import escape as _escape_markup

__all__ = ["all_text", "brief", "markup", "plain"]

_UNSAFE_ASCII = re.compile("[\x00-\x1f\x7f]")
# Controls (C0, DEL, C1 with ESC among them), format characters (bidi marks and overrides, zero-width spaces, the
# BOM, tag characters), private use, lone surrogates (which no terminal can encode), line and paragraph separators.
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs", "Zl", "Zp"})


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def plain(value: object) -> str:
    """`value` as text with every control, format, private-use, surrogate and line/paragraph separator character
    (Unicode categories Cc, Cf, Co, Cs, Zl, Zp) written as an escape: it prints as itself and encodes as UTF-8."""
    text = value if isinstance(value, str) else str(value)
    if text.isascii():
        return _UNSAFE_ASCII.sub(lambda match: _escape(match.group()), text)
    category = unicodedata.category
    return "".join(_escape(c) if category(c) in _UNSAFE_CATEGORIES else c for c in text)


def all_text(value: object) -> bool:
    """Whether every string in `value` (a JSON value: nested lists and dicts, keys included) is valid Unicode
    text: no lone surrogate, which JSON's `\\ud800` escapes can carry and UTF-8 cannot encode."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def markup(value: object) -> str:
    """`plain(value)`, also escaped for rich's markup: it prints as itself wherever rich parses markup."""
    return _escape_markup(plain(value))


def brief(value: object, limit: int = 80) -> str:
    """repr(value) on one line, at most `limit` characters."""
    text = repr(value).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def byte_size(size: float) -> str:
    """A byte count for a message: whole units bare ("64 MiB"), others to one decimal ("1.5 GiB")."""
    units = ("bytes", "KiB", "MiB", "GiB", "TiB")
    power = 0
    while size >= 1024 and power < len(units) - 1:
        size /= 1024
        power += 1
    return f"{size:.0f} {units[power]}" if size == int(size) else f"{size:.1f} {units[power]}"
