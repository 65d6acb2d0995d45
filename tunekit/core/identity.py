"""A kernel's identity: what decides the compiled kernel and its launch, and nothing else.

Three parts, joined as `"{version}.{code}.{space}"` (the value of a cache key's `source_hash`):
- code: a digest of the @triton.jit functions the kernel launches, the jit functions they call and the constexpr
  and dtype globals they read, each normalized to its syntax tree (no comments, docstrings, blank lines, line numbers,
  parentheses or trailing commas; not the module it lives in). A reformat or a moved helper keeps it.
- space: a digest of the search space's data (parameter names and values). Rules stay out: they are checked
  again whenever an entry is served.
- version: the kernel declaration's integer, bumped by hand when host-side launch meaning changes (grid,
  staging, variant mapping, what the problem key means). tests/core/test_identity.py keeps a golden digest of each
  kernel's host launch path and fails when that digest moves while the version does not.

Host code is walked (from the launch and the problem parser) only to find the jit functions and for the golden
launch-path digest; it never enters the identity.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import textwrap
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from triton.language import constexpr, dtype

from tunekit.core.triton_adapter import jit_function

SourceOf = Callable[[Callable[..., Any]], str]


def function_source(fn: Callable[..., Any]) -> str:
    return inspect.getsource(fn)


def _digest(data: Any, length: int) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:length]


def _strip_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return body[1:]
    return body


def _canonical(node: Any) -> Any:
    """A syntax tree as plain data. Empty and None fields are dropped, so fields that newer Pythons add with
    empty defaults (type_params, ...) leave the result unchanged across versions."""
    if isinstance(node, ast.AST):
        fields: list[Any] = []
        for name in node._fields:
            value = getattr(node, name, None)
            if name == "body" and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                value = _strip_docstring(node.body)
            if value is None or value == [] or name == "type_comment":
                continue
            fields.append([name, _canonical(value)])
        return [type(node).__name__, fields]
    if isinstance(node, list):
        return [_canonical(item) for item in node]
    return repr(node)


def _function_tree(fn: Callable[..., Any], source_of: SourceOf) -> ast.FunctionDef:
    tree = ast.parse(textwrap.dedent(source_of(fn)))
    node = tree.body[0]
    if not isinstance(node, ast.FunctionDef):
        raise TypeError(f"{fn!r} is not a plain function definition")
    return node


def _plain_function(obj: Any) -> Callable[..., Any] | None:
    """The Python function behind a jit function (GPU or interpreter), else None. Triton's own library
    functions (tl.sum, tl.cdiv, ...) are left out: the Triton version in the device key covers them."""
    fn = jit_function(obj)
    if not isinstance(fn, types.FunctionType) or fn.__module__.startswith("triton."):
        return None
    return fn


def _globals_read(tree: ast.FunctionDef, namespace: dict[str, Any]) -> Iterable[tuple[str, Any]]:
    """(dotted name, value) for every global name or module attribute chain the tree reads."""
    local = {a.arg for a in ast.walk(tree.args) if isinstance(a, ast.arg)}
    local |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    for node in ast.walk(tree):
        chain: list[str] = []
        cursor: ast.expr = node  # type: ignore[assignment]
        if not isinstance(node, (ast.Name, ast.Attribute)):
            continue
        while isinstance(cursor, ast.Attribute):
            chain.append(cursor.attr)
            cursor = cursor.value
        if not isinstance(cursor, ast.Name) or cursor.id in local or cursor.id not in namespace:
            continue
        value = namespace[cursor.id]
        name = cursor.id
        for attr in reversed(chain):
            if not isinstance(value, types.ModuleType) or not hasattr(value, attr):
                break
            value, name = getattr(value, attr), f"{name}.{attr}"
        yield name, value


def _constant(value: Any, name: str, namespace: dict[str, Any]) -> Any:
    """A global's value as data when a jit function may read it as a compile-time constant, else None. A dtype
    counts where the kernel's own code names it (`DT = tl.float16`, bare or as tl.constexpr); Triton's own names
    (`tl.float16` itself) are covered by the Triton version in the device key."""
    if isinstance(value, constexpr):
        value = value.value
    if isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, dtype) and not _from_triton(name, namespace):
        return f"dtype:{value}"
    return None


def _from_triton(name: str, namespace: dict[str, Any]) -> bool:
    """Whether a dotted global name is read through a Triton module (`tl.float16`)."""
    root = namespace.get(name.split(".")[0])
    return isinstance(root, types.ModuleType) and root.__name__.split(".")[0] == "triton"


@dataclass(frozen=True)
class JitWalk:
    """The jit functions reachable from a set of roots, and the constexpr globals they read."""

    functions: dict[str, Any]  # name@tree-digest -> canonical tree
    constants: dict[str, Any]  # function name:global name -> value
    objects: tuple[Any, ...]  # the jit functions themselves

    def digest(self) -> str:
        return _digest({"functions": sorted(self.functions), "constants": self.constants}, 16)


def walk_jit(roots: Iterable[Any], source_of: SourceOf = function_source) -> JitWalk:
    functions: dict[str, Any] = {}
    constants: dict[str, Any] = {}
    seen: dict[int, Any] = {}
    pending = list(roots)
    while pending:
        obj = pending.pop()
        fn = _plain_function(obj)
        if fn is None or id(fn) in seen:
            continue
        seen[id(fn)] = obj
        tree = _function_tree(fn, source_of)
        canonical = _canonical(tree)
        functions[f"{fn.__name__}@{_digest(canonical, 16)}"] = canonical
        for name, value in _globals_read(tree, fn.__globals__):
            if _plain_function(value) is not None:
                pending.append(value)
            elif (constant := _constant(value, name, fn.__globals__)) is not None:
                constants[f"{fn.__name__}:{name}"] = constant
    return JitWalk(functions, constants, tuple(seen.values()))


def _is_host_code(value: Any, packages: tuple[str, ...]) -> bool:
    module = getattr(value, "__module__", None) or ""
    return isinstance(value, types.FunctionType) and module.startswith(packages)


@dataclass(frozen=True)
class HostWalk:
    """The host functions reachable from the launch path, the jit functions they launch, the data they read."""

    functions: dict[str, Any]  # name -> canonical tree
    data: dict[str, Any]  # function name:global name -> repr of a plain-data global
    jit_roots: tuple[Any, ...]

    def digest(self) -> str:
        return _digest({"functions": self.functions, "data": self.data}, 16)


def _plain_data(value: Any) -> str | None:
    if isinstance(value, (bool, int, float, str, tuple, frozenset, dict)) and len(repr(value)) < 4096:
        return repr(value)
    return None


def walk_host(
    roots: Iterable[Callable[..., Any]], packages: tuple[str, ...], source_of: SourceOf = function_source
) -> HostWalk:
    """Walk host code from `roots` through the functions of `packages` (module name prefixes) it calls."""
    functions: dict[str, Any] = {}
    data: dict[str, Any] = {}
    jit_roots: list[Any] = []
    seen: set[int] = set()
    pending: list[Any] = list(roots)
    while pending:
        fn = pending.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        tree = _function_tree(fn, source_of)
        functions[fn.__name__] = _canonical(tree)
        for name, value in _globals_read(tree, fn.__globals__):
            if _plain_function(value) is not None:
                jit_roots.append(value)
            elif _is_host_code(value, packages):
                pending.append(value)
            elif (text := _plain_data(value)) is not None:
                data[f"{fn.__name__}:{name}"] = text
    return HostWalk(functions, data, tuple(jit_roots))


def space_digest(params: Iterable[Any]) -> str:
    """Parameter names and their values; the order of either does not matter."""
    return _digest(sorted([p.name, sorted(map(repr, p.values))] for p in params), 8)


def make_identity(version: int, code: str, space: str) -> str:
    return f"{version}.{code}.{space}"


def explain_change(stored: str, current: str) -> str:
    """Why an entry of identity `stored` is not served under `current`: one short phrase."""
    old, new = stored.split("."), current.split(".")
    if len(old) != 3:
        return "tuned before kernel identities (a whole-source hash)"
    reasons = []
    if old[0] != new[0]:
        reasons.append(f"launch version {old[0]} -> {new[0]}")
    if old[1] != new[1]:
        reasons.append("kernel code changed")
    if old[2] != new[2]:
        reasons.append("search space changed")
    return ", ".join(reasons) or "current"
