"""Issue 44's file and plan attacks (items 2-4), each run in its own process under a timeout and a 8 GiB address-space
cap (a script, not a test: about two minutes on 2 cores).

    .venv/bin/python tests/adversarial/issue44_files.py

Files that block or grow: a FIFO, a symlink to /dev/zero or /dev/null, a directory, a socket, a sparse 70 MiB file,
text that is not UTF-8, and `[` x 100000, given as a plan, to `tunekit import`, as a pack, as other_triton.json and
as a timing table. Plans: problems too large for this machine (`tunekit plan`, `tune --plan`, `tune --shape`), each
beside a good line that must still be tuned; user-kernel plan lines (a misspelt argument, `n: true`,
`"dtype.x_ptr": "__class__"`, `n` of 2^40, a missing key, a dtype that is a number) beside a good one.

Each attack is refused (one `error:` line, or one warning, naming the file and the plan line; no traceback, no hang)
or served correctly (what it must still do: the op's result torch-equal, the plan's good line tuned); anything else
is a failure, printed. The last line: `tried N / refused R / served correctly S / failures F`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 120
CAP = "import resource; resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))\n"


@dataclass
class Run:
    rc: int | None  # None: killed at the timeout
    out: str
    err: str

    @property
    def clean(self) -> bool:
        return self.rc is not None and "Traceback" not in self.out + self.err

    def error_lines(self) -> list[str]:
        return [line for line in (self.out + self.err).splitlines() if line.startswith("error:")]


def run(code: str, cache: Path, *args: str) -> Run:
    env = {**os.environ, "TUNEKIT_CACHE_DIR": str(cache), "PYTHONPATH": f"{ROOT / 'tests'}:{ROOT}"}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", CAP + code, *args],
            capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT, env=env,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        return Run(None, str(exc.stdout or ""), str(exc.stderr or ""))
    return Run(proc.returncode, proc.stdout, proc.stderr)


def cli(cache: Path, *args: str) -> Run:
    return run("import sys; from tunekit.cli import main; sys.argv = ['tunekit', *sys.argv[1:]]; main()", cache, *args)


# ------------------------------------------------------------------------------------------ the hostile files


def fifo(path: Path) -> None:
    os.mkfifo(path)


def dev_zero(path: Path) -> None:
    path.symlink_to("/dev/zero")


def dev_null(path: Path) -> None:
    path.symlink_to("/dev/null")


def directory(path: Path) -> None:
    path.mkdir()


def sparse(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(70 << 20)


def not_utf8(path: Path) -> None:
    path.write_bytes(b'{"kernel": "\xff\xfe"}\n')


def deep(path: Path) -> None:
    path.write_text("[" * 100_000)


def _gzip_in_place(path: Path) -> None:
    """A timing table is gzip: a small regular file's text is compressed, so the attack reaches the JSON."""
    import gzip

    if not path.is_symlink() and path.is_file() and path.stat().st_size < 1 << 20:
        path.write_bytes(gzip.compress(path.read_bytes()))


FILES: dict[str, Callable[[Path], None]] = {
    "FIFO": fifo, "link to /dev/zero": dev_zero, "link to /dev/null": dev_null, "directory": directory,
    "sparse 70 MiB": sparse, "not UTF-8": not_utf8, "[ x 100000": deep,
}  # fmt: skip


@dataclass
class Tally:
    tried: int = 0
    refused: int = 0
    served: int = 0
    failures: int = 0

    def judge(self, name: str, outcome: str, why: str = "") -> None:
        self.tried += 1
        if outcome == "refused":
            self.refused += 1
        elif outcome == "served":
            self.served += 1
        else:
            self.failures += 1
            print(f"FAILURE {name}: {why}")
            return
        print(f"ok      {name}: {outcome}")


def refused_naming(result: Run, *names: str) -> tuple[str, str]:
    """('refused', '') when the run ended with exit 1 and error lines naming each of `names`; else a failure."""
    if result.rc is None:
        return "failure", "still running at the timeout (a hang)"
    lines = result.error_lines()
    if not result.clean or result.rc != 1 or not lines or not all(any(n in x for x in lines) for n in names):
        return "failure", f"rc {result.rc}: {(result.out + result.err)[-600:]}"
    return "refused", ""


SOFTMAX_CALL = """
import torch, tunekit.ops as ops
from tunekit.runtime.version_policy import _read_verdicts
assert _read_verdicts() == {}  # the verdicts' reader itself (an op reads it only for another Triton's entries)
x = torch.randn(4, 40)
assert torch.allclose(ops.softmax(x, -1), torch.softmax(x, -1), atol=1e-6), "wrong softmax"
print("correct")
"""
READ_PACK = """
import sys, logging
from pathlib import Path
from tunekit.store.database import read_shipped
logging.basicConfig(level=logging.WARNING)
assert read_shipped(Path(sys.argv[1])) == {}
print("skipped")
"""
READ_TABLE = """
import sys
from pathlib import Path
from tunekit.core.errors import TunekitError
from tunekit.evaluation.timing_table import load_tables
try:
    load_tables(Path(sys.argv[1]))
except TunekitError as exc:
    print("error:", exc)
    sys.exit(1)
"""


def file_attacks(tally: Tally, work: Path) -> None:
    for kind, make in FILES.items():
        for surface in ("plan", "import", "pack", "other_triton.json", "timing table"):
            case = work / f"{surface}-{kind}".replace(" ", "_").replace("/", "_")
            case.mkdir()
            cache = case / "cache"
            cache.mkdir()
            name = f"{kind} as {surface}"
            if surface == "plan":
                make(case / "plan.jsonl")
                tally.judge(name, *refused_naming(cli(cache, "plan", str(case / "plan.jsonl")), "plan.jsonl"))
            elif surface == "import":
                make(case / "db.json")
                tally.judge(name, *refused_naming(cli(cache, "import", str(case / "db.json")), "db.json"))
            elif surface == "pack":
                (case / "packs").mkdir()
                make(case / "packs" / "model.json")
                result = run(READ_PACK, cache, str(case))
                ok = result.clean and result.rc == 0 and "skipping shipped database model.json" in result.err
                tally.judge(name, "refused" if ok else "failure", f"rc {result.rc}: {(result.out + result.err)[-600:]}")
            elif surface == "other_triton.json":
                make(cache / "other_triton.json")
                result = run(SOFTMAX_CALL, cache)
                ok = result.clean and result.rc == 0 and "correct" in result.out
                tally.judge(name, "served" if ok else "failure", f"rc {result.rc}: {(result.out + result.err)[-600:]}")
            else:
                make(case / "t.json.gz")
                _gzip_in_place(case / "t.json.gz")
                tally.judge(name, *refused_naming(run(READ_TABLE, cache, str(case / "t.json.gz")), "t.json.gz"))
    case = work / "socket"
    case.mkdir()
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(case / "plan.jsonl"))
        tally.judge("socket as plan", *refused_naming(cli(case / "cache", "plan", str(case / "plan.jsonl")), "socket"))


# ------------------------------------------------------------------------------------------ plans

GOOD = {"kernel": "softmax", "shape": "4x16", "dtype": "float32"}
TOO_LARGE = [
    {"kernel": "softmax", "shape": "1048576x1048576", "dtype": "float32"},
    {"kernel": "gemm", "shape": [1 << 20, 1 << 20, 1 << 20], "dtype": "float16"},
    {"kernel": "layernorm", "shape": [1 << 24, 1 << 16], "dtype": "float32"},
]
USER = "user_kernel_example:tunekit_add"
USER_GOOD = {"n": 48, "dtype.x_ptr": "float32", "dtype.y_ptr": "float32", "dtype.out_ptr": "float32"}
USER_BAD = {
    "misspelt argument": {**{k: v for k, v in USER_GOOD.items() if k != "n"}, "nn": 48},
    "n: true": {**USER_GOOD, "n": True},
    "dtype.x_ptr: __class__": {**USER_GOOD, "dtype.x_ptr": "__class__"},
    "n of 2^40": {**USER_GOOD, "n": 1 << 40},
    "missing key": {k: v for k, v in USER_GOOD.items() if k != "n"},
    "dtype a number": {**USER_GOOD, "dtype.y_ptr": 5},
}


def _plan(path: Path, *items: dict) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def plan_attacks(tally: Tally, work: Path) -> None:
    for i, item in enumerate(TOO_LARGE):
        case = work / f"large-{i}"
        case.mkdir()
        plan = _plan(case / "plan.jsonl", item, GOOD)
        what = f"{item['kernel']} {item['shape']}"
        tally.judge(f"{what}: tunekit plan", *refused_naming(cli(case / "cache", "plan", str(plan)), "line 1", "fit"))
        tuned = cli(case / "cache", "tune", "--plan", str(plan), "--trials", "1", "--sampler", "random")
        outcome, why = refused_naming(tuned, "line 1", "fit")
        if outcome == "refused" and "1 tuned" not in tuned.out:
            outcome, why = "failure", f"the good line was not tuned: {tuned.out[-400:]}"
        tally.judge(f"{what}: tune --plan (the good line tuned)", outcome, why)
        shape = "x".join(map(str, item["shape"])) if isinstance(item["shape"], list) else item["shape"]
        alone = cli(case / "cache", "tune", "-k", item["kernel"], "--shape", shape, "--dtype", item["dtype"])
        tally.judge(f"{what}: tune --shape", *refused_naming(alone, "fit"))
    for name, problem in USER_BAD.items():
        case = work / f"user-{name}".replace(" ", "_").replace(":", "").replace("^", "")
        case.mkdir()
        plan = _plan(case / "plan.jsonl", {"kernel": USER, "problem": problem}, {"kernel": USER, "problem": USER_GOOD})
        tuned = cli(case / "cache", "tune", "--plan", str(plan))
        outcome, why = refused_naming(tuned, "plan.jsonl line 1", USER)
        if outcome == "refused" and "measured 3 configs" not in tuned.out:
            outcome, why = "failure", f"the good line was not tuned: {tuned.out[-400:]}"
        tally.judge(f"user kernel, {name}: tune --plan (the good line tuned)", outcome, why)


def main() -> None:
    tally = Tally()
    with tempfile.TemporaryDirectory() as tmp:
        file_attacks(tally, Path(tmp))
        plan_attacks(tally, Path(tmp))
    t = tally
    print(f"tried {t.tried} / refused {t.refused} / served correctly {t.served} / failures {t.failures}")


if __name__ == "__main__":
    main()
