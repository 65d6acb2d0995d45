"""The store read once, for resolving many problems (`tunekit show`): what dispatch.resolve reads of a Store
(`get`, `entries`, `scope_entries`), from memory, with the entries indexed by key and by (kernel, device)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from tunekit.store.entry import Entry


class Snapshot:
    def __init__(self, entries: Iterable[Entry]) -> None:
        self._entries = list(entries)
        self._by_key = {e.key: e for e in self._entries}
        self._by_scope: dict[tuple[str, str], list[Entry]] = {}
        for e in self._entries:
            self._by_scope.setdefault((e.key.kernel, e.key.device_key), []).append(e)

    def get(self, key: Any) -> Entry | None:
        return self._by_key.get(key)

    def entries(self) -> Iterator[Entry]:
        return iter(self._entries)

    def scope_entries(self, kernel: str, device_key: str) -> list[Entry]:
        return list(self._by_scope.get((kernel, device_key), ()))
