"""The one way tunekit reads a file it is given: plans, imported databases, packs, the other-Triton verdicts and
timing tables all come through here.

A path is opened without blocking (O_NONBLOCK: open() of a FIFO with no writer would otherwise wait forever) and
through any symlink, then the descriptor itself is checked (fstat): only a regular file is read, so a FIFO, a device
(/dev/zero behind a link), a socket or a directory is refused before a byte is read, whatever name led to it. The
size is capped before and while the file is read (it may grow as it is read). JSON is checked for nesting before
json parses it (json's parser recurses once per level, and a deep enough document ends in RecursionError). Every
refusal is one UnreadableFileError line naming the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from collections.abc import Iterator
from itertools import accumulate
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from tunekit.core.errors import TunekitError
from tunekit.core.render import byte_size
from tunekit.store.file_safety import file_kind

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_JSON_DEPTH",
    "UnreadableFileError",
    "load_json",
    "nesting_error",
    "open_regular",
    "read_bytes",
    "read_capped",
    "read_text",
]

# The largest file tunekit writes for itself is a device database (0.7 MB shipped for the H200); 64 MiB is room for
# ~100 times that and stays far from memory.
MAX_FILE_BYTES = 64 << 20
# Every document tunekit writes nests at most 7 levels (a database: entries, an entry, its trials, a trial, its
# config); json's recursion limit is ~1000.
MAX_JSON_DEPTH = 32
_READ_CHUNK_BYTES = 1 << 20
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


class UnreadableFileError(TunekitError):
    """A file that is missing, not a regular file, too large, not UTF-8 text, or not the JSON it should be.
    `missing`: the file does not exist (some readers treat that as empty)."""

    def __init__(self, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


def _cannot(path: Path, what: str, why: str, missing: bool = False) -> UnreadableFileError:
    return UnreadableFileError(f"cannot read {what + ' ' if what else ''}{path}: {why}", missing)


@contextlib.contextmanager
def open_regular(path: Path, what: str = "") -> Iterator[tuple[BinaryIO, int]]:
    """The file at `path` (through symlinks) opened for reading, with its size; UnreadableFileError unless it is a
    regular file. `what` names the file's role in the errors ("the plan")."""
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        raise _cannot(path, what, "no such file", missing=True) from None
    except OSError as exc:
        with contextlib.suppress(OSError):  # a socket cannot be opened at all (ENXIO): name what it is
            mode = os.stat(path).st_mode
            if not stat.S_ISREG(mode):
                raise _cannot(path, what, f"it is {file_kind(mode)}, not a regular file") from None
        raise _cannot(path, what, exc.strerror or str(exc)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _cannot(path, what, f"it is {file_kind(info.st_mode)}, not a regular file")
        os.set_blocking(fd, True)
        file = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with file:
        yield file, info.st_size


class Readable(Protocol):
    def read(self, size: int = -1, /) -> bytes: ...


def read_capped(file: Readable, limit: int) -> bytes | None:
    """Up to `limit` bytes of `file`; None when it holds more (never reading more than limit + 1 bytes, and in
    chunks: read(limit) would allocate the whole limit at once)."""
    chunks, size = [], 0
    while size <= limit:
        chunk = file.read(min(_READ_CHUNK_BYTES, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks) if size <= limit else None


def read_bytes(path: Path, what: str = "", max_bytes: int = MAX_FILE_BYTES, too_big: str = "") -> bytes:
    """The bytes of the regular file at `path`, refused past `max_bytes` (`too_big`: what the message adds then)."""
    refusal = f"larger than {byte_size(max_bytes)}, the most tunekit reads from one file"
    refusal += f" ({too_big})" if too_big else ""
    try:
        with open_regular(path, what) as (file, size):
            if size > max_bytes:
                raise _cannot(path, what, refusal)
            raw = read_capped(file, max_bytes)
    except OSError as exc:
        raise _cannot(path, what, exc.strerror or str(exc)) from None
    if raw is None:
        raise _cannot(path, what, refusal)
    return raw


def read_text(path: Path, what: str = "", max_bytes: int = MAX_FILE_BYTES, too_big: str = "") -> str:
    """The UTF-8 text of the regular file at `path` (read_bytes' checks)."""
    raw = read_bytes(path, what, max_bytes, too_big)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _cannot(path, what, f"not UTF-8 text ({exc})") from None


_ONLY_BRACKETS = {c: None for c in range(128) if chr(c) not in "[]{}"}  # str.translate's table: ASCII's fast path
_STRING_OR_BRACKETS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]+')
_DEPTH_STEP = [0] * 256
for _open, _close in ("[]", "{}"):
    _DEPTH_STEP[ord(_open)], _DEPTH_STEP[ord(_close)] = 1, -1


def _deepest(brackets: bytes, depth: int = 0) -> tuple[int, int]:
    """(the deepest level reached, the level at the end) over a run of brackets entered at `depth`."""
    deepest = max(accumulate(map(_DEPTH_STEP.__getitem__, brackets), initial=depth))
    opened = brackets.count(b"[") + brackets.count(b"{")
    return deepest, depth + 2 * opened - len(brackets)


def nesting_error(text: str, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why JSON `text` nests too deeply for json to parse it safely, or None, found before any recursion. First
    every bracket counts (those inside strings too: a bound from above, in one linear pass, ~4 s for 64 MiB of
    brackets); only past the limit are strings skipped, token by token, to count the document's own levels."""
    if _deepest(text.translate(_ONLY_BRACKETS).encode("ascii", "ignore"))[0] <= max_depth:
        return None
    deepest = depth = 0
    for token in _STRING_OR_BRACKETS.finditer(text):
        if token.group()[0] != '"':
            reached, depth = _deepest(token.group().encode("ascii"), depth)
            deepest = max(deepest, reached)
    return f"nested deeper than {max_depth} levels ({deepest})" if deepest > max_depth else None


def load_json(path: Path, what: str = "", max_bytes: int = MAX_FILE_BYTES, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The JSON document in the regular file at `path`: read_text's checks, then nesting, then json."""
    text = read_text(path, what, max_bytes)
    why = nesting_error(text, max_depth)
    if why is not None:
        raise _cannot(path, what, why)
    try:
        return json.loads(text)
    except ValueError as exc:
        raise _cannot(path, what, f"not valid JSON ({exc})") from None
    except RecursionError:  # not reached past the nesting check; kept so no reader can ever raise it
        raise _cannot(path, what, "nested too deeply") from None
