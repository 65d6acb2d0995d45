"""Removing entries from the working cache store: by kernel, device key or cache key (`tunekit forget`).

The way out when an entry must go: one imported from a file that should not have been trusted, one of a device
retired for good, or one the store skips as unreadable (its warning names its digest).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tunekit.core.errors import TunekitError
from tunekit.core.registry import get_spec
from tunekit.store.entry import Entry
from tunekit.store.store import Store
from tunekit.store.user_entries import is_user_kernel

_DIGEST = re.compile(r"[0-9a-f]{32}")
_HEX_PREFIX = re.compile(r"[0-9a-f]{4,64}")


@dataclass(frozen=True)
class Selection:
    """Which entries to remove: every filter given must match (at least one is required)."""

    kernel: str | None = None
    device_key: str | None = None  # a device key or a prefix of one (`tunekit show` prints 8 characters)
    digest: str | None = None  # a cache key's digest or a prefix of one

    def __post_init__(self) -> None:
        if self.kernel is None and self.device_key is None and self.digest is None:
            raise TunekitError("forget needs at least one of --kernel, --device or --key (it never empties the cache)")
        for what, value in (("--device", self.device_key), ("--key", self.digest)):
            if value is not None and not _HEX_PREFIX.fullmatch(value):
                raise TunekitError(
                    f"{what} must be 4 to 64 lowercase hex digits (a key or its prefix), but got {value!r}"
                )
        if self.kernel is not None and not is_user_kernel(self.kernel):
            get_spec(self.kernel)  # an unknown name fails with the list of valid ones

    def matches(self, entry: Entry) -> bool:
        return (
            (self.kernel is None or entry.key.kernel == self.kernel)
            and (self.device_key is None or entry.key.device_key.startswith(self.device_key))
            and (self.digest is None or entry.key.digest.startswith(self.digest))
        )


def select(store: Store, selection: Selection) -> list[Entry]:
    """The readable entries the selection matches. A --device or --key prefix must name one device or one key."""
    found = [e for e in store.entries() if selection.matches(e)]
    for what, value, of in (
        ("--device", selection.device_key, lambda e: e.key.device_key),
        ("--key", selection.digest, lambda e: e.key.digest),
    ):
        names = sorted({of(e) for e in found})
        if value is not None and len(names) > 1 and value not in names:
            raise TunekitError(f"{what} {value} is the prefix of {len(names)} keys: {names[:5]}; give more of it")
    return found


def forget(store: Store, selection: Selection) -> int:
    """Remove the selected entries in one transaction; returns how many were removed.

    A full digest is removed even where the entry is unreadable (the store skips it with a warning that names it).
    """
    with store.transaction():
        digests = {e.key.digest for e in select(store, selection)}
        only_key = selection.kernel is None and selection.device_key is None
        if only_key and selection.digest is not None and _DIGEST.fullmatch(selection.digest):
            digests.add(selection.digest)  # --key alone, in full: removed readable or not
        return sum(store.delete(digest) for digest in sorted(digests))
