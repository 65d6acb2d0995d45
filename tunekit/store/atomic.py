"""Writing a file atomically: a temporary file in the destination's directory, then a rename over the destination.

- Readers see the old file or the new one, never a partial one; on any failure (ENOSPC on a full disk, EIO, an
  interrupt) the temporary file is removed and the old file is left as it was.
- A symbolic link at the destination is refused with a one-line error. It is never followed (rename replaces a
  link, never its target, so a link planted after the check is replaced, not followed), and not silently replaced
  either: whoever made the link meant something by it, so the user decides.
- The new file keeps the old file's permission bits, or gets the usual ones (0o666 less the umask).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from tunekit.core.errors import TunekitError

__all__ = ["write_atomically"]

_CHUNK_BYTES = 1 << 20


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written (the one place bytes are written: tests fault it here)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _umask() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def write_atomically(path: Path, chunks: Iterable[str], error: type[TunekitError] = TunekitError) -> None:
    """Write the text `chunks` (UTF-8) to `path` atomically; a failure raises `error` with a one-line message."""
    try:
        old = os.lstat(path)
    except FileNotFoundError:
        old = None
    except OSError as exc:
        raise error(f"cannot write {path}: {exc.strerror or exc}") from None
    if old is not None and stat.S_ISLNK(old.st_mode):
        raise error(
            f"refusing to write {path}: it is a symbolic link (to {os.readlink(path)}), and tunekit never follows "
            "one; remove the link or give the real path"
        )
    if old is not None and not stat.S_ISREG(old.st_mode):
        raise error(f"cannot write {path}: it exists and is not a regular file")
    mode = stat.S_IMODE(old.st_mode) if old is not None else 0o666 & ~_umask()
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise error(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        try:
            pending: list[str] = []
            size = 0
            for chunk in chunks:
                pending.append(chunk)
                size += len(chunk)
                if size >= _CHUNK_BYTES:
                    _write_all(fd, "".join(pending).encode())
                    pending, size = [], 0
            _write_all(fd, "".join(pending).encode())
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            full = " (the disk is full)" if exc.errno == errno.ENOSPC else ""
            raise error(
                f"cannot write {path}: {exc.strerror or exc}{full}; the previous file, if any, is unchanged"
            ) from None
        raise
    with contextlib.suppress(OSError):  # the rename itself survives a crash once its directory is on disk
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
