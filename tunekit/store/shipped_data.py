"""Where the data shipped inside the package lives, and where `tunekit record` writes by default.

The repository's `cache/` directory installs as the package `tunekit.shipped` (pyproject.toml's package-dir
mapping): tuning databases (`*.json`, read by store.database) and timing tables (`timings/<device>/<kernel>.json.gz`,
read by the efficiency benchmark and `tunekit explain --table`). Everything here finds them through
importlib.resources, so a wheel install, an editable install and a checkout all resolve to the same files; nothing
assumes a checkout's layout. Shipped data is read-only at run time: what a user records goes to the cache directory.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from tunekit.core import settings
from tunekit.core.errors import TunekitError

PACKAGE = "tunekit.shipped"
TABLE_SUFFIX = ".json.gz"

__all__ = [
    "PACKAGE",
    "default_table_files",
    "recorded_table_path",
    "recorded_timings_dir",
    "resolve_table",
    "shipped_dir",
    "shipped_table_files",
    "table_name",
]


def shipped_dir() -> Path:
    """The installed `tunekit.shipped` package directory (the repository's `cache/`)."""
    root = importlib.resources.files(PACKAGE)
    if not isinstance(root, Path):  # a zipped install: pip never makes one, but say so instead of failing later
        raise TunekitError(f"tunekit's shipped data must be installed as files, but {PACKAGE} is inside {root}")
    return root


def shipped_timings_dir() -> Path:
    return shipped_dir() / "timings"


def shipped_table_files() -> list[Path]:
    """Every shipped timing-table file, `timings/<device>/<kernel>.json.gz`, sorted."""
    return sorted(shipped_timings_dir().glob(f"*/*{TABLE_SUFFIX}"))


def recorded_timings_dir() -> Path:
    """Where `tunekit record` writes by default: the user's cache directory, never the installed package."""
    return settings.cache_dir() / "timings"


def recorded_table_path(device_label: str, kernel: str) -> Path:
    return recorded_timings_dir() / device_label / f"{kernel}{TABLE_SUFFIX}"


def default_table_files() -> list[Path]:
    """The tables the efficiency benchmark reads by default: the shipped ones, then those recorded here."""
    return shipped_table_files() + sorted(recorded_timings_dir().glob(f"*/*{TABLE_SUFFIX}"))


def table_name(path: Path) -> str:
    """A shipped table's short name, `<device>/<kernel>` (e.g. h200-sm90-132sm/gemm)."""
    return f"{path.parent.name}/{path.name.removesuffix(TABLE_SUFFIX)}"


def resolve_table(text: str) -> Path:
    """A timing-table argument: an existing file, else the name of a shipped table (`<device>/<kernel>`)."""
    path = Path(text).expanduser()
    if path.is_file():
        return path
    shipped = {table_name(p): p for p in shipped_table_files()}
    found = shipped.get(text.removesuffix(TABLE_SUFFIX))
    if found is not None:
        return found
    raise TunekitError(
        f"--table must be a timing-table file or a shipped table's name, but {text!r} is neither. "
        f"Shipped: {sorted(shipped)}"
    )
