"""The documentation's examples, run as a user on a CPU runs them, so that they cannot go stale (the README's
`device="cuda"` examples needed editing on a CPU, and its tunekit.autotune conversion failed there as written).

The documentation is README.md and the guides beside the code it describes (DOCS); every other markdown file with a
```python or ```bash block fails the test until DOCS names it. Every ```python and ```bash block runs, in its file's
order, in a subprocess: one fresh working directory and one fresh cache (TUNEKIT_CACHE_DIR) per `## ` section of a
file, because a section's blocks build on each other (record a plan, check it, export, import). bash blocks run
with `set -e` and the running interpreter's bin directory first on PATH (`tunekit` and `python` are the installed
ones). A block whose info string names a reason in NOT_RUN is not run; any other word there fails the test, so a
typo cannot skip an example.

The tunekit.autotune conversion runs as the guide (tunekit/README.md) tells a user to make it: the Triton "before"
block (a GPU block: triton.autotune benchmarks with CUDA events) with its decorator replaced by the "after" block
and `import tunekit` added after the other imports (the order that once failed).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import ROOT

# README.md first, then the guides beside the code they describe.
DOCS = ("README.md", "tunekit/README.md", "tunekit/cli/README.md", "cache/README.md")
NOT_RUN = {
    "setup": "installs packages or runs the whole test suite",
    "gpu": "needs a CUDA GPU",
    "slow": "minutes in Triton's interpreter (tuning at a GPU's trial budget)",
    "fleet": "needs a database server or the user's storage URL",
    "fragment": "part of the user's own program (their model, kernel or package)",
}
TIMEOUT_S = 300


@dataclass(frozen=True)
class Block:
    doc: str  # the markdown file, relative to the repository root
    section: str  # the `## ` heading it is under
    line: int  # where its fence opens (1-based)
    language: str
    marker: str  # the info string's words after the language, "" when none
    code: str


def blocks() -> list[Block]:
    found: list[Block] = []
    for doc in DOCS:
        found += _blocks_of(doc)
    return found


def _blocks_of(doc: str) -> list[Block]:
    found: list[Block] = []
    section, fence, start, body = "", None, 0, []
    for number, line in enumerate((ROOT / doc).read_text().splitlines(), 1):
        if fence is None and line.startswith("## "):
            section = line[3:].strip()
        elif fence is None and line.startswith("```") and line.strip() != "```":
            fence, start, body = line[3:].strip(), number, []
        elif fence is not None and line.strip() == "```":
            language, _, marker = fence.partition(" ")
            found.append(Block(doc, section, start, language, marker.strip(), "\n".join(body) + "\n"))
            fence = None
        elif fence is not None:
            body.append(line)
    return found


def _sections() -> dict[str, list[Block]]:
    """Runnable blocks by `FILE: SECTION`."""
    by_section: dict[str, list[Block]] = {}
    for block in blocks():
        if block.language in ("python", "bash") and not block.marker:
            by_section.setdefault(f"{block.doc}: {block.section}", []).append(block)
    return by_section


def _run(block: Block, workdir: Path, code: str | None = None) -> None:
    env = dict(os.environ, TUNEKIT_CACHE_DIR=str(workdir / "cache"))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    for name in [n for n in env if n.startswith("TUNEKIT_") and n != "TUNEKIT_CACHE_DIR"]:
        del env[name]  # the documented defaults, not the test run's settings
    source = code if code is not None else block.code
    if block.language == "python":
        script = workdir / f"{block.doc.replace('/', '_').removesuffix('.md')}_line_{block.line}.py"
        script.write_text(source)
        command = [sys.executable, str(script)]
    else:
        command = ["bash", "-e", "-c", source]
    done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, (
        f"{block.doc} line {block.line} ({block.section}) failed with {done.returncode}:\n{source}\n"
        f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    )


def test_every_block_runs_here_or_says_why_not():
    for block in blocks():
        assert block.marker in ("", *NOT_RUN), f"{block.doc} line {block.line}: unknown marker {block.marker!r}"
    runnable = _sections()
    walkthrough = "tunekit/README.md: Walkthrough: tune my model on my GPU"
    assert {"README.md: Examples", walkthrough} <= set(runnable), sorted(runnable)
    assert any(b.language == "bash" for b in runnable[walkthrough])


def test_every_markdown_file_with_examples_is_read():
    """A guide added beside the code has its examples run too: DOCS must name it."""
    fence = re.compile(r"^```(python|bash)\b", re.M)
    found = {
        path.relative_to(ROOT).as_posix()
        for path in ROOT.rglob("*.md")
        if not any(  # hidden folders (.venv, .git, ...), build outputs
            part.startswith(".") or part.endswith(".egg-info") or part in ("build", "node_modules")
            for part in path.relative_to(ROOT).parts
        )
        and fence.search(path.read_text())
    }
    assert found <= set(DOCS), sorted(found - set(DOCS))


@pytest.mark.parametrize("section", sorted(_sections()))
def test_the_examples_of_a_section_run_on_this_cpu(section, tmp_path):
    for block in _sections()[section]:
        _run(block, tmp_path)


def test_the_autotune_conversion_runs_as_the_readme_says(tmp_path):
    (before,) = [b for b in blocks() if "@triton.autotune(" in b.code]
    (after,) = [b for b in blocks() if b.code.startswith("@tunekit.autotune(")]
    decorator = re.search(r"^@triton\.autotune\(\n.*?^\)\n", before.code, re.M | re.S)
    assert decorator is not None and before.marker == "gpu"
    code = before.code.replace(decorator.group(0), after.code)
    imports = re.findall(r"^(?:import|from) .*\n", code, re.M)
    code = code.replace(imports[-1], imports[-1] + "import tunekit\n", 1)  # after torch and triton
    assert code.index("import triton") < code.index("import tunekit") < code.index("@tunekit.autotune(")
    _run(after, tmp_path, code + "assert torch.allclose(y, torch.softmax(x, -1), atol=1e-5)\n")
