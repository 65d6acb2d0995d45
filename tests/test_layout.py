"""The package layout: imports point down the layers, no module imports itself back, sizes stay small.

Every import counts: module level, inside functions and under TYPE_CHECKING, read with `ast` (nothing imported).
Layers, bottom to top (tunekit/README.md, "Package layout"), each where its imports put it:

    core <- kernels <- launch <- store <- tuning <- runtime <- ops <- integrations <- user_kernels <- fleet
         <- evaluation <- cli

A module may import its own layer and the layers below it. `kernels` is the kernel side (tunekit.kernels,
tunekit.search_spaces, installed from kernels/ and search_spaces/): declarations on core, imported by nothing in
core (the registry names them by string). `launch` watches and replays a call's launches (the hot path's plans, the
tuner's timing). `runtime` is serving (dispatch, hot path, recorder, policies); `ops` the public ops on it;
`integrations` what puts them into other people's models (tunekit.nn, tunekit.integrations: patching). Serving,
the ops and the integrations reach the tuning layer only through RUNTIME_TO_TUNING. The top-level package
`tunekit` is the public facade: its own imports are TYPE_CHECKING-only (the names load lazily, by string), and
what modules import from it is its constants (__version__, DISTRIBUTION), so it is no node of the graph.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = (
    "core", "kernels", "launch", "store", "tuning", "runtime", "ops", "integrations", "user_kernels", "fleet",
    "evaluation", "cli",
)  # fmt: skip
SERVING = ("runtime", "ops", "integrations")
SOURCES = {
    "tunekit": ROOT / "tunekit",
    "tunekit.kernels": ROOT / "kernels",
    "tunekit.search_spaces": ROOT / "search_spaces",
}
# Serving's (and the ops' and integrations') ways into the tuning layer: tuning on a miss, the untuned pick (the
# performance model, without Optuna), and one stored config measured here (an entry from another Triton).
RUNTIME_TO_TUNING = {"tunekit.tuning.orchestrate", "tunekit.tuning.untuned", "tunekit.tuning.spot_check"}
# Triton's public API: what any module may use. Everything else of Triton (triton.runtime, triton.compiler,
# triton.knobs, triton.backends, the driver, ...) is read only in TRITON_ADAPTER. Checked on every import and on every
# attribute chain from a name bound to the `triton` package (`import triton`, `import triton.x`, `import triton as t`).
TRITON_ADAPTER = "tunekit.core.triton_adapter"
TRITON_PUBLIC_MODULES = frozenset({"triton", "triton.language", "triton.testing", "triton.tools.tensor_descriptor"})
TRITON_PUBLIC_NAMES = frozenset(
    {"jit", "autotune", "heuristics", "Config", "cdiv", "next_power_of_2", "language", "testing", "__version__"}
)
# Attributes of Triton's JIT functions, compiled kernels and launchers that only the adapter reads (whatever the
# object is called where it is read).
TRITON_INTERNAL_ATTRIBUTES = frozenset(
    {
        "device_caches", "packed_metadata", "launch_metadata", "launch_cooperative_grid", "launch_pdl",
        "global_scratch_size", "profile_scratch_size", "launch_enter_hook", "launch_exit_hook", "knobs",
    }
)  # fmt: skip


def module_files() -> dict[str, Path]:
    """Every module under tunekit/ (and the kernel side's) by dotted name; a package by its own name."""
    found: dict[str, Path] = {}
    for package, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            if package == "tunekit" and path.relative_to(folder).parts[0] in ("kernels", "search_spaces", "shipped"):
                continue  # a checkout with links in place: read from kernels/ and search_spaces/ instead
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def layer(module: str) -> int:
    parts = module.split(".")
    if parts[0] != "tunekit" or len(parts) == 1:
        raise ValueError(f"not a tunekit module: {module}")
    head = parts[1]
    if head in ("kernels", "search_spaces", "shipped"):
        return LAYERS.index("kernels")
    if head == "nn":
        return LAYERS.index("integrations")
    if head == "__main__":
        return LAYERS.index("cli")
    if head not in LAYERS:
        raise AssertionError(f"{module}: not in a layer; put it in a subpackage (or add its layer here)")
    return LAYERS.index(head)


def imports_of(module: str, tree: ast.Module, known: Iterable[str]) -> set[str]:
    """The tunekit modules `module` imports anywhere in its source (`from a import b` names a.b if it is a module)."""
    known = set(known)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "tunekit"}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{module}: relative import (tunekit spells imports absolutely)"
            source = node.module or ""
            if source.split(".")[0] != "tunekit":
                continue
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in known else source)
    found.discard(module)
    return found


def graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the tunekit modules it imports; the top-level package is left out (see the docstring)."""
    trees = {name: ast.parse(text) for name, text in sources.items()}
    return {
        name: {m for m in imports_of(name, tree, sources) if m != "tunekit"}
        for name, tree in trees.items()
        if name != "tunekit"
    }


def upward(edges: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, targets in sorted(edges.items()):
        for target in sorted(targets):
            if layer(target) > layer(module):
                wrong.append(f"{module} -> {target} ({LAYERS[layer(module)]} imports {LAYERS[layer(target)]})")
            elif (
                LAYERS[layer(module)] in SERVING
                and layer(target) == LAYERS.index("tuning")
                and target not in RUNTIME_TO_TUNING
            ):
                wrong.append(f"{module} -> {target} (serving reaches tuning through {sorted(RUNTIME_TO_TUNING)})")
    return wrong


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return {name: path.read_text() for name, path in module_files().items()}


def test_every_module_has_a_layer(sources):
    for name in sources:
        if name != "tunekit":
            layer(name)
    assert {"tunekit.core.spec", "tunekit.runtime.dispatch", "tunekit.tuning.orchestrate", "tunekit.cli"} <= set(
        sources
    )


def test_imports_point_down_the_layers(sources):
    assert upward(graph(sources)) == []


def test_no_import_cycles(sources):
    assert cycles(graph(sources)) == []


def test_the_top_level_package_imports_only_for_type_checking(sources):
    tree = ast.parse(sources["tunekit"])
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tunekit"):
            pytest.fail(f"tunekit/__init__.py imports {node.module} at import time: load it lazily (_LAZY)")


def test_the_checks_can_fail():
    """A synthetic upward import, a runtime import past the orchestration, and a cycle are all caught."""
    fake = {
        "tunekit.core.fake": "from tunekit.runtime.dispatch import resolve\n",
        "tunekit.runtime.dispatch": "def f():\n    from tunekit.tuning.tuner import tune\n",
        "tunekit.store.a": "if TYPE_CHECKING:\n    from tunekit.store import b\n",
        "tunekit.store.b": "from tunekit.store.a import x\n",
        "tunekit.tuning.tuner": "",
        "tunekit.kernels.k": "from tunekit.tuning import perf_model\n",
        "tunekit.tuning.perf_model": "",
        "tunekit.core.registry": "from tunekit.kernels import layernorm\n",
        "tunekit.kernels.layernorm": "",
        "tunekit.ops.fake": "from tunekit.tuning.tuner import tune\n",
        "tunekit.integrations.fake": "from tunekit.tuning import orchestrate\n",
        "tunekit.tuning.orchestrate": "",
    }
    edges = graph(fake)
    wrong = upward(edges)
    assert any(w.startswith("tunekit.core.fake -> tunekit.runtime.dispatch") for w in wrong)
    assert any(w.startswith("tunekit.runtime.dispatch -> tunekit.tuning.tuner") for w in wrong)
    assert any(w.startswith("tunekit.kernels.k -> tunekit.tuning.perf_model") for w in wrong)
    assert any(w.startswith("tunekit.core.registry -> tunekit.kernels.layernorm") for w in wrong)
    assert any(w.startswith("tunekit.ops.fake -> tunekit.tuning.tuner") for w in wrong)
    assert not any(w.startswith("tunekit.integrations.fake") for w in wrong)
    assert cycles(edges) == [["tunekit.store.a", "tunekit.store.b"]]
    with pytest.raises(AssertionError, match="not in a layer"):
        layer("tunekit.somewhere")


def _triton_aliases(tree: ast.Module) -> set[str]:
    """The names a module binds to the `triton` package itself."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "triton":
                    if alias.asname is None:
                        names.add("triton")
                    elif alias.name == "triton":
                        names.add(alias.asname)
    return names


def triton_internals(module: str, tree: ast.Module) -> list[str]:
    """What `module` reads of Triton beyond its public API (TRITON_PUBLIC_*), one line each."""
    found = []
    aliases = _triton_aliases(tree)
    for node in ast.walk(tree):
        where = f"{module}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{where} import {a.name}" for a in node.names if _private_triton_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "triton":
            source = node.module or ""
            if _private_triton_module(source):
                found.append(f"{where} from {source} import ...")
            elif source == "triton":
                private = [a.name for a in node.names if a.name not in TRITON_PUBLIC_NAMES]
                found += [f"{where} from triton import {name}" for name in private]
        elif isinstance(node, ast.Attribute):
            if node.attr in TRITON_INTERNAL_ATTRIBUTES:
                found.append(f"{where} .{node.attr}")
            elif isinstance(node.value, ast.Name) and node.value.id in aliases and node.attr not in TRITON_PUBLIC_NAMES:
                found.append(f"{where} triton.{node.attr}")
    return found


def _private_triton_module(name: str) -> bool:
    if name.split(".")[0] != "triton":
        return False
    return name not in TRITON_PUBLIC_MODULES and not name.startswith("triton.language.")


def test_only_the_adapter_reads_triton_internals(sources):
    found = [
        line
        for name, text in sorted(sources.items())
        if name != TRITON_ADAPTER
        for line in triton_internals(name, ast.parse(text))
    ]
    assert found == [], f"read Triton's internals through {TRITON_ADAPTER}"


def test_the_triton_check_can_fail():
    cases = {
        "from triton.runtime.jit import KernelInterface\n": "from triton.runtime.jit import ...",
        "import triton.compiler.compiler\n": "import triton.compiler.compiler",
        "from triton import knobs\n": "from triton import knobs",
        "import triton\nx = triton.runtime.driver.active\n": "triton.runtime",
        "import triton as t\nx = t.knobs\n": ".knobs",
        "def f(k):\n    return k.device_caches[0]\n": ".device_caches",
        "def f(c):\n    return c.packed_metadata\n": ".packed_metadata",
    }
    for text, expected in cases.items():
        found = triton_internals("tunekit.core.fake", ast.parse(text))
        assert any(expected in line for line in found), (text, found)
    public = (
        "import triton\nimport triton.language as tl\nfrom triton import Config, cdiv\n"
        "from triton.testing import do_bench\nfrom triton.tools.tensor_descriptor import TensorDescriptor\n"
        "v = triton.__version__\nf = triton.jit\nt = triton.testing.do_bench\n"
    )
    assert triton_internals("tunekit.core.fake", ast.parse(public)) == []
