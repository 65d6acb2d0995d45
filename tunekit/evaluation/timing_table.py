"""Recorded timing tables: every config of a kernel's space measured on one device for one problem.

A table is the ground truth the simulated device (tunekit.evaluation.simulate) answers from, so search strategies can be
compared on a CPU machine, deterministically. Stored compactly as one gzipped JSON file per kernel and device holding
its tables, each with its rows as columns (parameter values, status, time, compile time and the compiled kernel's
resources). The repository's are in `cache/timings/<device>/` and install with the package (tunekit.store.shipped_data).
"""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tunekit.core.device import DeviceFingerprint
from tunekit.core.device_limits import DeviceLimits
from tunekit.core.errors import TunekitError
from tunekit.core.space import Value, config_id
from tunekit.store.bounded_file import UnreadableFileError, nesting_error, open_regular, read_capped
from tunekit.store.entry import TrialRecord, TrialStatus

FORMAT = "tunekit-timing-tables"
FORMAT_VERSION = 1
_COLUMNS = ("status", "time_ms", "compile_s", "n_regs", "n_spills", "shared_bytes", "error")


@dataclass(frozen=True)
class TimingRow:
    config: dict[str, Value]
    status: TrialStatus
    time_ms: float | None = None  # median kernel time; None unless ok
    compile_s: float | None = None  # cold compile (and first launch) of the config's kernels
    n_regs: int | None = None  # of the config's main kernel, as compiled
    n_spills: int | None = None
    shared_bytes: int | None = None
    error: str | None = None

    def record(self) -> TrialRecord:
        return TrialRecord(dict(self.config), self.status, self.time_ms, self.error)


@dataclass(frozen=True)
class TimingTable:
    kernel: str
    source_hash: str
    problem: dict[str, Value]
    device: dict[str, Any]  # DeviceFingerprint.to_json() of the device measured
    limits: dict[str, Any]  # DeviceLimits.to_json() of that device
    timer: str
    recorded: str  # ISO date
    rows: tuple[TimingRow, ...]
    _index: dict[Any, TimingRow] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._index.update({config_id(r.config): r for r in self.rows})

    @property
    def fingerprint(self) -> DeviceFingerprint:
        return DeviceFingerprint.from_json(self.device)

    @property
    def device_limits(self) -> DeviceLimits:
        return DeviceLimits.from_json(self.limits)

    def row(self, config: Any) -> TimingRow | None:
        return self._index.get(config_id(config))

    def ok_rows(self) -> list[TimingRow]:
        rows = [r for r in self.rows if r.status == "ok" and r.time_ms is not None and math.isfinite(r.time_ms)]
        return sorted(rows, key=lambda r: float(r.time_ms or 0.0))

    def best(self) -> TimingRow:
        ok = self.ok_rows()
        if not ok:
            raise TunekitError(f"timing table for {self.kernel} {self.problem} has no correct config")
        return ok[0]

    def to_json(self) -> dict[str, Any]:
        params = sorted({name for r in self.rows for name in r.config})
        return {
            "kernel": self.kernel,
            "source_hash": self.source_hash,
            "problem": dict(self.problem),
            "device": self.device,
            "limits": self.limits,
            "timer": self.timer,
            "recorded": self.recorded,
            "params": params,
            "columns": list(_COLUMNS),
            "rows": [[r.config[p] for p in params] + [getattr(r, c) for c in _COLUMNS] for r in self.rows],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TimingTable:
        params: list[str] = list(data["params"])
        columns: list[str] = list(data["columns"])
        rows = []
        for raw in data["rows"]:
            config = dict(zip(params, raw[: len(params)]))
            extra = dict(zip(columns, raw[len(params) :]))
            rows.append(TimingRow(config=config, **{c: extra.get(c) for c in _COLUMNS}))  # type: ignore[arg-type]
        return cls(
            kernel=str(data["kernel"]),
            source_hash=str(data["source_hash"]),
            problem=dict(data["problem"]),
            device=dict(data["device"]),
            limits=dict(data["limits"]),
            timer=str(data["timer"]),
            recorded=str(data["recorded"]),
            rows=tuple(rows),
        )


def save_tables(path: Path, tables: Sequence[TimingTable]) -> None:
    document = {"format": FORMAT, "version": FORMAT_VERSION, "tables": [t.to_json() for t in tables]}
    path.parent.mkdir(parents=True, exist_ok=True)
    # mtime=0: the same tables always give the same bytes (clean diffs).
    with gzip.GzipFile(path, "wb", mtime=0) as f:
        f.write(json.dumps(document, separators=(",", ":"), allow_nan=False).encode())


# The largest shipped table decompresses to 0.5 MB: 64 MiB is room for a hundred times that, and far from memory.
MAX_DECOMPRESSED_BYTES = 64 << 20


def _read_gzip(path: Path) -> bytes:
    """The decompressed bytes of a regular file (through tunekit.store.bounded_file: never a FIFO, device or
    directory), refused past MAX_DECOMPRESSED_BYTES without decompressing more than that."""
    try:
        with open_regular(path, "timing tables from") as (raw, _), gzip.GzipFile(fileobj=raw, mode="rb") as f:
            data = read_capped(f, MAX_DECOMPRESSED_BYTES)
    except UnreadableFileError as exc:
        raise TunekitError(str(exc)) from None
    if data is None:
        raise TunekitError(
            f"cannot read timing tables from {path}: it decompresses to larger than "
            f"{MAX_DECOMPRESSED_BYTES >> 20} MiB, the most a timing-table file may hold"
        )
    return data


def load_tables(path: Path) -> list[TimingTable]:
    try:
        text = _read_gzip(path).decode("utf-8")
        why = nesting_error(text)
        if why is not None:
            raise TunekitError(f"cannot read timing tables from {path}: {why}")
        document = json.loads(text)
    except (OSError, EOFError, ValueError) as exc:
        raise TunekitError(f"cannot read timing tables from {path}: {exc}") from exc
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise TunekitError(f"{path} is not a tunekit timing-table file")
    if document.get("version") != FORMAT_VERSION:
        raise TunekitError(f"{path} has timing-table version {document.get('version')}, expected {FORMAT_VERSION}")
    return [TimingTable.from_json(t) for t in document["tables"]]


def load_all(paths: Iterable[Path] | None = None) -> list[TimingTable]:
    """The tables of `paths`; by default every shipped table (found through the installed package)."""
    from tunekit.store.shipped_data import shipped_table_files

    return [t for p in (shipped_table_files() if paths is None else paths) for t in load_tables(p)]
