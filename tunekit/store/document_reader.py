"""Reading a tuning database file with bounded memory (tunekit.store.database validates what it reads).

The file is read through tunekit.store.bounded_file (a regular file only, its size capped at MAX_DOCUMENT_BYTES
before and while it is read, its nesting bounded); its text is then walked once as JSON
(a key twice in one object, NaN or Infinity, or text after the document is an error), the header (format, schema)
decoded and each entry's place noted, so entries are decoded one at a time: memory holds the text and one entry, not
the whole tree.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tunekit.core.errors import DatabaseError
from tunekit.core.render import brief
from tunekit.store.bounded_file import UnreadableFileError, nesting_error, read_text
from tunekit.store.key import SCHEMA_VERSION

FORMAT = "tunekit-db"
# The shipped H200 database of 344 entries is 0.8 MB: 64 MiB is room for ~25,000 entries, and parsing it stays
# well under a GiB. A larger file is refused before it is read.
MAX_DOCUMENT_BYTES = 64 << 20


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for name, value in pairs:
        if name in obj:
            raise ValueError(f"duplicate key {brief(name)} in one object")
        obj[name] = value
    return obj


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (times and values must be finite numbers)")


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_keys, parse_constant=_reject_constant)
_WHITESPACE = re.compile(r"[ \t\n\r]*")


def _read_capped(path: Path) -> str:
    """The file's text through the one bounded reader (tunekit.store.bounded_file: a regular file only, never a
    FIFO or a device, refused past MAX_DOCUMENT_BYTES and when nested deeper than MAX_JSON_DEPTH)."""
    try:
        text = read_text(path, "the tuning database", MAX_DOCUMENT_BYTES, "split it by --kernel or --device")
    except UnreadableFileError as exc:
        raise DatabaseError(str(exc)) from None
    why = nesting_error(text)
    if why is not None:
        raise DatabaseError(f"{path} is not a {FORMAT} document: {why}")
    return text


class DocumentText:
    """A parsed document's header (format, schema) and where each entry's text lies: entries are decoded one at a
    time, so memory holds the text and one entry, not the whole tree (a JSON tree is ~9x its text)."""

    def __init__(self, text: str, path: Path) -> None:
        self.text, self.path = text, path
        self.header: dict[str, Any] = {}
        self.spans: list[tuple[int, int]] = []
        try:
            self._walk()
        except ValueError as exc:  # JSONDecodeError, a duplicate key, a constant, an int too long to parse
            raise DatabaseError(f"{path} is not valid JSON: {exc}") from None
        except RecursionError:
            raise DatabaseError(f"{path} is not a {FORMAT} document: nested too deeply") from None
        header = self.header
        if header.get("format") != FORMAT:
            raise DatabaseError(f"{path}: not a {FORMAT} document")
        if not (type(header.get("schema")) is int and header.get("schema") == SCHEMA_VERSION):
            raise DatabaseError(f"{path}: schema must be {SCHEMA_VERSION}, but got {brief(header.get('schema'))}")
        if "entries" not in header:
            raise DatabaseError(f"{path}: 'entries' must be a list")

    def _skip(self, pos: int) -> int:
        match = _WHITESPACE.match(self.text, pos)
        return match.end() if match else pos

    def _expect(self, pos: int, chars: str) -> str:
        found = self.text[pos : pos + 1]
        if not found or found not in chars:
            want = " or ".join(repr(c) for c in chars)
            raise ValueError(f"expecting {want} at char {pos}" + ("" if found else " (the text ends there)"))
        return found

    def _walk(self) -> None:
        text = self.text
        pos = self._skip(0)
        if text[pos : pos + 1] != "{":
            _DECODER.raw_decode(text, pos)  # the decoder's own error for text that is not JSON
            raise DatabaseError(f"{self.path}: not a {FORMAT} document (not a JSON object)")
        pos = self._skip(pos + 1)
        if text[pos : pos + 1] != "}":
            while True:
                self._expect(pos, '"')
                name, pos = _DECODER.raw_decode(text, pos)
                if name in self.header:
                    raise ValueError(f"duplicate key {brief(name)} in one object")
                pos = self._skip(pos)
                self._expect(pos, ":")
                pos = self._skip(pos + 1)
                if name == "entries" and text[pos : pos + 1] == "[":
                    self.header[name] = []  # the entries stay text until iterated
                    pos = self._entries(pos)
                else:
                    self.header[name], pos = _DECODER.raw_decode(text, pos)
                    if name == "entries":
                        raise DatabaseError(f"{self.path}: 'entries' must be a list")
                pos = self._skip(pos)
                if self._expect(pos, ",}") == "}":
                    break
                pos = self._skip(pos + 1)
        pos = self._skip(pos + 1)
        if pos != len(text):
            raise ValueError(f"extra data after the document at char {pos}")

    def _entries(self, pos: int) -> int:
        pos = self._skip(pos + 1)
        if self.text[pos : pos + 1] == "]":
            return pos + 1
        while True:
            _, end = _DECODER.raw_decode(self.text, pos)  # checked now, decoded again when iterated
            self.spans.append((pos, end))
            pos = self._skip(end)
            if self._expect(pos, ",]") == "]":
                return pos + 1
            pos = self._skip(pos + 1)

    def objects(self) -> Iterator[Any]:
        """Each entry's JSON, decoded in turn (checked as JSON when the document was walked)."""
        for start, _end in self.spans:
            yield _DECODER.raw_decode(self.text, start)[0]

    def __len__(self) -> int:
        return len(self.spans)


def open_document(path: Path) -> DocumentText:
    """The file at `path`, read within the cap and walked (DatabaseError when it is too large or not a document)."""
    return DocumentText(_read_capped(path), path)
