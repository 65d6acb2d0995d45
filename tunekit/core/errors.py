"""One error hierarchy: every failure a user can cause or meet is a TunekitError with a one-line message."""

from __future__ import annotations


class TunekitError(Exception):
    """Base class. The message names the rule, the bad value and the valid options."""


class UnknownKernelError(TunekitError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class InvalidInputError(TunekitError, ValueError):
    """Bad tensor arguments: dtype, device, shape or strides."""


class InvalidShapeError(TunekitError, ValueError):
    """A malformed problem shape (e.g. from the command line)."""


class InvalidConfigError(TunekitError, ValueError):
    """A config outside its kernel's search space."""


class CacheError(TunekitError):
    """The cache store cannot be opened, read or written."""


class DatabaseError(TunekitError):
    """A tuning database file is malformed, of the wrong schema or unreadable."""


class CacheMissError(TunekitError, LookupError):
    """Strict mode: no tuned config exists for this problem on this device."""


class AutogradUnsupportedError(InvalidInputError):
    """An op without a backward formula got an input that requires grad while grad mode is on: refused rather than
    returning a result silently detached from the graph."""
