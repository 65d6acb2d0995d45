"""Kernel identity (tunekit/core/identity.py): what retires tuned entries, and what must not.

- A golden file holds each kernel's version and host launch-path digest: a launch-path change with no version
  bump fails here. Re-record (when the change keeps the launch meaning) with
  `PYTHONPATH=tests python tests/core/test_identity.py --record`; otherwise bump the kernel's `version`, then re-record.
- Reformatting, reordering imports and moving functions between modules leave every shipped entry servable.
- Editing one jit body changes exactly the identities of the kernels that launch it.
- A rule that forbids a stored config stops it being served, without a new identity.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import ROOT, TESTS, cli

from tunekit.core.device import DeviceFingerprint
from tunekit.core.identity import explain_change, function_source, walk_jit
from tunekit.core.registry import get_spec, kernel_names
from tunekit.core.space import Rule, SearchSpace
from tunekit.runtime.dispatch import resolve
from tunekit.store.database import read_document
from tunekit.store.entry import LAUNCH_BOUND_MS, Entry
from tunekit.store.key import CacheKey

GOLDEN = TESTS / "golden" / "launch_paths.json"
SHIPPED = sorted((ROOT / "cache").glob("*.json"))


def _launch_paths() -> dict[str, dict[str, object]]:
    return {
        name: {"version": get_spec(name).version, "launch_path": get_spec(name).launch_path().digest()}
        for name in kernel_names()
    }


def test_launch_paths_match_the_golden_file():
    golden = json.loads(GOLDEN.read_text())
    now = _launch_paths()
    assert sorted(golden) == sorted(now), "kernels added or removed: re-record tests/golden/launch_paths.json"
    moved = [k for k in now if now[k]["launch_path"] != golden[k]["launch_path"]]
    unbumped = [k for k in moved if now[k]["version"] == golden[k]["version"]]
    assert not unbumped, (
        f"the host launch path of {unbumped} changed with the same version. If what is launched (grid, staging, "
        "variant mapping, problem key meaning) changed, bump the kernel's `version`; either way, re-record with "
        "`PYTHONPATH=tests python tests/core/test_identity.py --record` in the same commit"
    )
    assert now == golden, (
        "versions bumped: re-record with `PYTHONPATH=tests python tests/core/test_identity.py --record`"
    )


def _shipped_entries():
    return [e for path in SHIPPED for e in read_document(path)]


def _served_from_shipped(entries) -> list[bool]:
    """Each entry resolves as itself: its config served, or torch's op in its place where dispatch's rules say
    torch wins there (an entry under LAUNCH_BOUND_MS with no torch time). A stale identity resolves to no entry."""
    resolved = [
        resolve(get_spec(e.key.kernel), dict(e.key.problem), DeviceFingerprint.from_json(e.device), None)
        for e in entries
    ]
    return [
        r.entry is not None and r.entry.key == e.key and r.layer in ("shipped", "torch-launch-bound", "torch-measured")
        for r, e in zip(resolved, entries)
    ]


def test_every_shipped_entry_is_served_under_todays_identity():
    entries = _shipped_entries()
    assert entries and all(_served_from_shipped(entries))


@functools.cache
def _source(fn):
    """function_source, read once per function (the edit test asks for every function's source ~250 times)."""
    return function_source(fn)


def _edited(target):
    """A source_of that adds one statement to `target`'s body."""

    def source_of(fn):
        source = _source(fn)
        if fn is not target:
            return source
        tree = ast.parse(textwrap.dedent(source))
        tree.body[0].body.append(ast.parse("_edited = 1").body[0])
        return ast.unparse(tree)

    return source_of


def _jit_objects(name):
    return walk_jit(get_spec(name).launch_path().jit_roots).objects


def test_editing_one_jit_body_retires_exactly_the_kernels_that_launch_it():
    names = kernel_names()
    before = {k: get_spec(k).source_hash for k in names}
    users: dict[int, tuple[object, set[str]]] = {}
    for k in names:
        for obj in _jit_objects(k):
            users.setdefault(id(obj.fn), (obj, set()))[1].add(k)
    assert len(users) >= 20  # the walk found the library's jit functions, not just the roots
    for obj, kernels in users.values():
        after = {k: get_spec(k).identity(_edited(obj.fn)) for k in names}
        changed = {k for k in names if after[k] != before[k]}
        assert changed == kernels, f"editing {obj.fn.__name__} changed {sorted(changed)}, launched by {kernels}"
        assert all(explain_change(before[k], after[k]) == "kernel code changed" for k in changed)


def test_a_rule_forbidding_a_stored_config_stops_it_being_served():
    # an entry its own config serves (past LAUNCH_BOUND_MS: no torch time is needed for it)
    entry = next(e for e in _shipped_entries() if e.key.kernel == "layernorm" and e.time_ms >= LAUNCH_BOUND_MS)
    spec = get_spec("layernorm")
    stored = dict(entry.config)
    forbid = Rule("not_the_stored_one", lambda config, problem, device: dict(config) != stored)
    edited = dataclasses.replace(spec, space=SearchSpace(spec.space.params, (*spec.space.rules, forbid)))
    assert edited.source_hash == spec.source_hash  # rules are not part of the identity...
    device = DeviceFingerprint.from_json(entry.device)
    resolution = resolve(edited, dict(entry.key.problem), device, None)
    assert resolution.layer != "shipped" and dict(resolution.config) != stored  # ...they are checked when served
    assert resolve(spec, dict(entry.key.problem), device, None).layer == "shipped"


_GLOBAL_READER = """
import triton
import triton.language as tl

DT = {value}


@triton.jit
def cast_kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs).to(DT))
"""


def _code_digest(tmp_path, module: str, value: str) -> str:
    import importlib

    (tmp_path / f"{module}.py").write_text(_GLOBAL_READER.format(value=value))
    return walk_jit([importlib.import_module(module).cast_kernel]).digest()


def test_a_module_global_dtype_the_kernel_reads_is_part_of_its_identity(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    digests = {
        value: _code_digest(tmp_path, f"global_reader_{i}", value)
        for i, value in enumerate(("tl.float16", "tl.float32", "tl.constexpr(tl.float16)", "tl.constexpr(tl.float32)"))
    }
    assert digests["tl.float16"] != digests["tl.float32"]
    assert digests["tl.constexpr(tl.float16)"] != digests["tl.constexpr(tl.float32)"]
    assert _code_digest(tmp_path, "global_reader_again", "tl.float16") == digests["tl.float16"]  # the same code


def test_explain_change_names_each_part():
    assert explain_change("1.aaaa.bbbb", "2.aaaa.bbbb") == "launch version 1 -> 2"
    assert explain_change("1.aaaa.bbbb", "1.aaaa.cccc") == "search space changed"
    assert explain_change("81a4762261b2abf7", "1.aaaa.bbbb").startswith("tuned before kernel identities")


def test_show_lists_a_stale_entry_and_says_why(tmp_path, monkeypatch):

    from tunekit.core.device import fingerprint
    from tunekit.runtime.dispatch import why_not_served
    from tunekit.store.store import Store

    monkeypatch.setenv("TUNEKIT_CACHE_DIR", str(tmp_path))
    spec = get_spec("layernorm")
    device = fingerprint()
    problem = spec.problem_from_shape((4, 64), "float32")
    current = Entry(
        CacheKey.make(spec.name, spec.source_hash, device.key, problem),
        spec.heuristic(problem, device),
        1.0,
        device.to_json(),
        {"origin": "test"},
    )
    old = dataclasses.replace(current, key=dataclasses.replace(current.key, source_hash="0." + spec.source_hash[2:]))
    with Store() as store:
        store.put(current)
        store.put(old)
    assert why_not_served(current, device) == ""
    assert why_not_served(old, device) == "stale: launch version 0 -> 1"
    result = cli("show", "--kernel", "layernorm", env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "stale: launch version 0 -> 1" in result.output and "2 entries" in result.output


# ---- refactoring keeps identities: the kernel and space modules rewritten, then imported in a fresh process ----

_CONSTANT = re.compile(r"^_?[A-Z][A-Z0-9_]*$")


def _is_jit(node: ast.stmt) -> bool:
    return isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list)


def _move_jit_functions(path: Path, package: str) -> None:
    """Move a module's jit functions (with copies of its imports and constants) into a new sibling module."""
    tree = ast.parse(path.read_text())
    body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    jit = [n for n in body if _is_jit(n)]
    if not jit:
        return
    functions = {n.name for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}  # constants using them stay
    imports = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
    constants = [
        n
        for n in body
        if isinstance(n, ast.Assign)
        and len(n.targets) == 1
        and isinstance(n.targets[0], ast.Name)
        and _CONSTANT.match(n.targets[0].id)
        and n.targets[0].id != "SPEC"
        and not {x.id for x in ast.walk(n.value) if isinstance(x, ast.Name)} & functions
    ]
    moved = f"{path.stem}_jit"
    (path.parent / f"{moved}.py").write_text(ast.unparse(ast.Module([*imports, *constants, *jit], [])))
    names = [ast.alias(n.name) for n in jit]
    rest = [n for n in body if n not in imports and n not in jit]
    back = ast.ImportFrom(f"{package}.{moved}", names, 0)
    path.write_text(ast.unparse(ast.Module([*imports, back, *rest], [])))


_PROBE = """
import json, sys
import tunekit.kernels, tunekit.search_spaces
tunekit.kernels.__path__[:] = [sys.argv[1] + "/kernels"]
tunekit.search_spaces.__path__[:] = [sys.argv[1] + "/search_spaces"]
from tunekit.core.registry import get_spec, kernel_names
from tunekit.store.key import CacheKey
from tunekit.store.database import read_document
from tunekit.core.device import DeviceFingerprint
from tunekit.runtime.dispatch import resolve
from tunekit.store.entry import Entry
from pathlib import Path
served = [
    resolve(get_spec(e.key.kernel), dict(e.key.problem), DeviceFingerprint.from_json(e.device), None).layer
    for path in sys.argv[2:] for e in read_document(Path(path))
]
where = {k: get_spec(k).launch.__code__.co_filename for k in kernel_names()}
print(json.dumps({"identity": {k: get_spec(k).source_hash for k in kernel_names()}, "served": served, "where": where}))
"""


def test_reformatting_and_moving_code_keeps_every_shipped_entry_servable(tmp_path):
    for name in ("kernels", "search_spaces"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    for path in sorted((tmp_path / "kernels").rglob("*.py")):  # kernel modules and packages (kernels/gemm/)
        _move_jit_functions(path, ".".join(("tunekit", *path.parent.relative_to(tmp_path).parts)))
    ruff = [sys.executable, "-m", "ruff"]
    isolated = ["--isolated", "--line-length", "72"]
    subprocess.run([*ruff, "format", *isolated, str(tmp_path)], check=True, capture_output=True)
    reorder = ["--select", "I", "--fix", "--config", "lint.isort.force-single-line = true"]
    subprocess.run([*ruff, "check", *isolated, *reorder, str(tmp_path)], check=True, capture_output=True)
    moved = (tmp_path / "kernels" / "norms" / "layernorm_jit.py").read_text()
    assert "def _layernorm_fwd_single" in moved and "#" not in moved  # the rewrite really happened
    assert "def _gemm_grouped_kernel" in (tmp_path / "kernels" / "gemm" / "grouped_jit.py").read_text()

    env = {**os.environ, "TUNEKIT_CACHE_DIR": str(tmp_path / "store")}
    run = subprocess.run(
        [sys.executable, "-c", _PROBE, str(tmp_path), *map(str, SHIPPED)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert all(str(tmp_path) in where for where in result["where"].values())  # the rewritten modules ran
    assert result["identity"] == {k: get_spec(k).source_hash for k in kernel_names()}
    # Every shipped entry is found (not stale): served itself, or torch in its place where the entry says torch
    # was measured faster or the problem is launch-bound (the kernels' declared torch fallback).
    tuned_layers = {"shipped", "torch-measured", "torch-launch-bound"}
    assert len(result["served"]) == len(_shipped_entries()) and set(result["served"]) <= tuned_layers
    assert result["served"].count("shipped") > len(result["served"]) // 2


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(_launch_paths(), indent=2, sort_keys=True) + "\n")
    print(f"recorded {GOLDEN}")
