"""Every environment variable tunekit reads, in one place, validated on read.

ENVIRONMENT lists them (name, meaning, default): `tunekit --help` prints that table, and
tunekit/cli/README.md's "Environment variables" section holds it (tests/cli/test_cli_width.py checks the two agree).
"""

from __future__ import annotations

import os
from pathlib import Path

from tunekit.core.errors import CacheError, TunekitError

# (name, meaning, default): the one table of the variables below.
ENVIRONMENT: tuple[tuple[str, str, str], ...] = (
    ("TUNEKIT_CACHE_DIR", "directory of the working cache store", "$XDG_CACHE_HOME/tunekit"),
    (
        "TUNEKIT_CACHE_MAX_MB",
        "cap on the store's size in MB (10**6 bytes); past it the least recently stored entries are evicted, "
        "with a warning",
        "unset (unbounded)",
    ),
    ("TUNEKIT_STRICT", "1: dispatch raises on a miss instead of using a fallback", "0"),
    ("TUNEKIT_TUNE_ON_MISS", "1: dispatch tunes a problem it has no entry for, then caches it", "0"),
    ("TUNEKIT_TUNE_ON_MISS_TRIALS", "trial budget for tune-on-miss", "20"),
    ("TUNEKIT_UNTUNED", "no entry, on a GPU: torch (its own op) or triton (nearest, heuristic)", "torch"),
    (
        "TUNEKIT_BUCKETS",
        "1: on a GPU, a token count between two tuned bucket edges is served the upper edge's config where both "
        "edges beat torch by 10% (off: measured slower than torch in between, tests/gpu/m_buckets.py)",
        "0",
    ),
    (
        "TUNEKIT_OTHER_TRITON",
        "entries recorded under another Triton version: check (serve each after a one-time check here) or "
        "never (torch serves instead)",
        "check",
    ),
    (
        "TUNEKIT_COMPILE_OPS",
        "forces the ops a torch.compile graph calls as tunekit's, serving what they serve eagerly (a comma list of "
        "op names, all or none); the others run torch's or the model's own code, for Inductor to fuse "
        "(tunekit/runtime/compile_policy.py); any value also turns off the GEMM choices decided in compiled steps "
        "(tunekit/runtime/compiled_gemm.py) and outer products as multiplies (inductor_outer_products.py)",
        "unset: chosen per problem by measurement",
    ),
    ("TUNEKIT_DEBUG", "1: the CLI prints tracebacks", "0"),
    ("TUNEKIT_EXTRA_KERNELS", "more kernels, name=module[,name=module] (each module has a SPEC)", "unset"),
    ("TRITON_INTERPRET", "Triton's own; tunekit sets it to 1 when no CUDA GPU is present", "unset"),
)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _flag(name: str) -> bool:
    given = os.environ.get(name, "")
    raw = given.strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise TunekitError(f"{name} must be 1 or 0 (true/false, yes/no, on/off), but got {given!r}")


def _positive_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise TunekitError(f"{name} must be a positive integer, but got {raw!r}")
    return value


def _choice(name: str, choices: tuple[str, str]) -> str:
    """One of two words (the first when unset or blank), refused in one line otherwise."""
    raw = os.environ.get(name, choices[0]).strip().lower() or choices[0]
    if raw not in choices:
        raise TunekitError(f"{name} must be {choices[0]!r} or {choices[1]!r}, but got {raw!r}")
    return raw


def cache_dir() -> Path:
    """The working cache's directory; refused in one line where a file stands in its way (it could not be made)."""
    explicit = os.environ.get("TUNEKIT_CACHE_DIR")
    if explicit:
        path = Path(explicit).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        path = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "tunekit"
    blocker = next((p for p in (path, *path.parents) if os.path.exists(p)), None)  # (False where unreadable)
    if blocker is not None and not os.path.isdir(blocker):
        if explicit:
            raise CacheError(f"TUNEKIT_CACHE_DIR must name a directory, but {blocker} is a file")
        raise CacheError(f"the cache directory {path} cannot be made: {blocker} is a file; set TUNEKIT_CACHE_DIR")
    return path


def cache_max_bytes() -> int | None:
    """The store's size cap in bytes (TUNEKIT_CACHE_MAX_MB), or None: unbounded, nothing is ever evicted."""
    raw = os.environ.get("TUNEKIT_CACHE_MAX_MB", "").strip()
    return _positive_int("TUNEKIT_CACHE_MAX_MB", 1) * 10**6 if raw else None


def strict() -> bool:
    return _flag("TUNEKIT_STRICT")


def tune_on_miss() -> bool:
    return _flag("TUNEKIT_TUNE_ON_MISS")


def buckets() -> bool:
    return _flag("TUNEKIT_BUCKETS")


def tune_on_miss_trials() -> int:
    return _positive_int("TUNEKIT_TUNE_ON_MISS_TRIALS", 20)


def untuned() -> str:
    return _choice("TUNEKIT_UNTUNED", ("torch", "triton"))


def debug() -> bool:
    try:
        return _flag("TUNEKIT_DEBUG")
    except TunekitError:
        return False


def extra_kernels() -> dict[str, str]:
    """Kernels registered from the environment: `name=module,...` (each module defines SPEC). Read once, at import
    of tunekit.core.registry, so fleet workers and isolated benchmark processes find kernels outside the package."""
    raw = os.environ.get("TUNEKIT_EXTRA_KERNELS", "").strip()
    found: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, sep, module = (s.strip() for s in item.partition("="))
        if not sep or not name or not module:
            raise TunekitError(
                f"TUNEKIT_EXTRA_KERNELS must be name=module pairs joined by ',' (e.g. mykernel=mypkg.mykernel), "
                f"but got {item!r}"
            )
        found[name] = module
    return found


def interpret_requested() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


def compile_ops() -> str | None:
    """TUNEKIT_COMPILE_OPS as given (stripped, lower case), or None when unset."""
    raw = os.environ.get("TUNEKIT_COMPILE_OPS")
    return raw.strip().lower() if raw is not None and raw.strip() else None


def other_triton() -> str:
    """What serves an entry recorded under another Triton version (tunekit/runtime/version_policy.py)."""
    return _choice("TUNEKIT_OTHER_TRITON", ("check", "never"))


def check_environment() -> None:
    """Read every variable above as tunekit reads it, so that a bad value is refused now, with the message Python
    gives where it reads that variable (the CLI calls this before each command)."""
    for read in (cache_dir, cache_max_bytes, strict, tune_on_miss, tune_on_miss_trials, untuned, buckets):
        read()
    other_triton()
    extra_kernels()
    _flag("TUNEKIT_DEBUG")  # debug() itself never raises: the CLI's error boundary reads it to print an error


def environment_text(width: int = 80) -> list[str]:
    """ENVIRONMENT as lines at most `width` wide: each name, then its meaning and default indented, wrapped."""
    import textwrap

    lines: list[str] = []
    for name, meaning, default in ENVIRONMENT:
        lines.append(name)
        text = f"{meaning} (default: {default})"
        lines += textwrap.wrap(text, width, initial_indent="    ", subsequent_indent="    ")
    return lines
