"""How a user kernel is named: by its import path, `package.module:attribute`. No imports: the store reads this."""

from __future__ import annotations


def is_user_kernel(name: str) -> bool:
    """A user kernel is named by its import path; tunekit's own kernel names hold no colon."""
    return ":" in name
