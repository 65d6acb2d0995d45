"""The cache key: schema version, kernel, kernel source hash, device fingerprint, problem. Canonical JSON, hashed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tunekit.core.canonical import digest
from tunekit.core.space import Problem

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class CacheKey:
    kernel: str
    source_hash: str
    device_key: str
    problem: tuple[tuple[str, Any], ...]
    schema: int = SCHEMA_VERSION

    @classmethod
    def make(cls, kernel: str, source_hash: str, device_key: str, problem: Problem) -> CacheKey:
        return cls(kernel, source_hash, device_key, tuple(sorted(problem.items())))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": self.schema,
            "kernel": self.kernel,
            "source_hash": self.source_hash,
            "device_key": self.device_key,
            "problem": dict(self.problem),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CacheKey:
        return cls(
            kernel=data["kernel"],
            source_hash=data["source_hash"],
            device_key=data["device_key"],
            problem=tuple(sorted(data["problem"].items())),
            schema=data["schema"],
        )

    @property
    def digest(self) -> str:
        return digest(self.to_json(), length=32)

    @property
    def scope(self) -> tuple[str, str, str]:
        """Entries sharing a scope can stand in for each other as 'nearest' problems."""
        return (self.kernel, self.source_hash, self.device_key)
