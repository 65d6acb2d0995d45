"""One isolation worker process as the parent sees it: started (its stderr kept in a temporary file), spoken to in JSON
lines with a deadline, and once it is gone, why (its exit status and the end of its stderr). What a hang or a death
means for the candidate is the bench's (tunekit.tuning.isolation); the worker's side is tunekit.tuning.isolation_worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import IO, Any

from tunekit.core import backend

EXIT_GRACE_S = 10.0
_STDERR_TAIL = 400


class WorkerTimeout(Exception):
    """No reply came within the deadline (the worker may be hung)."""


class WorkerDied(Exception):
    """The worker is gone; the message says how (exit status, end of its stderr)."""


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


def current_cuda_device() -> int:
    import torch

    return int(torch.cuda.current_device())


@dataclass
class WorkerProcess:
    """A worker process and its stderr; `IsolatedBench(spawned=...)` adopts one started before it had a target."""

    proc: subprocess.Popen[bytes]
    stderr: IO[bytes]
    _buffer: bytes = field(default=b"", repr=False)  # what was read past the last complete line

    def running(self) -> bool:
        return self.proc.poll() is None

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerDied(self.death()) from None

    def receive(self, timeout_s: float) -> dict[str, Any]:
        """The next reply line; WorkerTimeout when none comes within `timeout_s`, WorkerDied when the worker ends."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WorkerTimeout
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise WorkerDied(self.death())
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def death(self) -> str:
        """Why the worker is gone: its exit status and the end of its stderr. Reaps it and closes its pipes."""
        try:
            self.proc.wait(timeout=EXIT_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        why = describe_exit(self.proc.returncode)
        tail = self.stderr_tail()
        self.close()
        return f"{why}: {tail}" if tail else why

    def stderr_tail(self) -> str:
        try:
            self.stderr.seek(0, os.SEEK_END)
            size = self.stderr.tell()
            self.stderr.seek(max(0, size - _STDERR_TAIL))
            text = self.stderr.read().decode(errors="replace")
        except (OSError, ValueError):
            return ""
        return " | ".join(line.strip() for line in text.strip().splitlines()[-4:])

    def close(self) -> None:
        """Stop the worker (killed if it still runs), reap it and close its pipes; closing again does nothing."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout, self.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def spawn_worker() -> WorkerProcess:
    stderr = tempfile.TemporaryFile()  # noqa: SIM115  lives as long as the worker; closed with it
    proc = subprocess.Popen(
        # The bench's module name on the command line (what finds workers looks for it); its __main__ runs the worker.
        [sys.executable, "-m", "tunekit.tuning.isolation", str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        start_new_session=True,  # a Ctrl-C reaches the parent, which then closes the worker
    )
    return WorkerProcess(proc, stderr)


def prespawn() -> WorkerProcess:
    """Start a worker now, before its first target is known, and have it warm up.

    Its interpreter, imports and CUDA context (seconds) then overlap whatever the caller does before the first
    target (a fleet worker: opening the queue and the cache, claiming a job). The warm-up has no reply; the
    first init's reply comes once the warm-up and the init are both done.
    """
    spawned = spawn_worker()
    warm = {"op": "warm", "device_index": None if backend.INTERPRETED else current_cuda_device()}
    assert spawned.proc.stdin is not None
    with contextlib.suppress(BrokenPipeError, OSError):  # a worker that died at once is reported by the init
        spawned.proc.stdin.write((json.dumps(warm) + "\n").encode())
        spawned.proc.stdin.flush()
    return spawned
