"""What test files share: the tests' own paths, the CLI runner, the store entries they plant and small models.
Imported by name (`from helpers import cli`): pytest puts tests/ on sys.path when it loads tests/conftest.py.

The terminal-width fixtures (`wide_terminal`, `narrow_terminal`) are in conftest.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from typer.testing import CliRunner, Result

from tunekit.core.device import DeviceFingerprint
from tunekit.store.entry import Entry, TrialRecord
from tunekit.store.key import CacheKey

TESTS = Path(__file__).resolve().parent  # tests/: the helper modules (toy_kernel, crafting, ...) and golden/
ROOT = TESTS.parent  # the repository

runner = CliRunner()


def cli(*args: str, **kwargs: Any) -> Result:
    """`tunekit ARGS...` in this process (typer's runner); keyword arguments go to CliRunner.invoke (env=...)."""
    from tunekit.cli import app

    return runner.invoke(app, list(args), **kwargs)


# ------------------------------------------------------------------------------------------ store entries

PROBLEM = {"rows": 8, "cols": 32, "dtype": "float32"}


def make_entry(device: DeviceFingerprint, time_ms: float, block: int = 16, problem=PROBLEM) -> Entry:
    """An entry of a kernel named "toy" with a made-up source hash (stored and listed, never served)."""
    config = {"BLOCK": block, "variant": "a", "num_warps": 4}
    return Entry(
        key=CacheKey.make("toy", "srchash", device.key, problem),
        config=config,
        time_ms=time_ms,
        device=device.to_json(),
        provenance={"strategy": "tpe"},
        trials=(TrialRecord(config, "ok", time_ms), TrialRecord({**config, "variant": "wrong"}, "wrong", error="x")),
    )


def toy_entry(toy, device, time_ms, block=16, rows=8, timer="fake", cols=32, variant="a"):
    """An entry of the registered toy kernel (the `toy` fixture's spec): one dispatch can serve."""
    e = make_entry(device, time_ms, block, {"rows": rows, "cols": cols, "dtype": "float32"})
    key = CacheKey.make("toy", toy.source_hash, device.key, dict(e.key.problem))
    config = {**e.config, "variant": variant}
    trials = (TrialRecord(config, "ok", time_ms), *e.trials[1:])
    return Entry(key, config, e.time_ms, e.device, {**e.provenance, "timer": timer}, trials)


# ------------------------------------------------------------------------------------------ compiled graphs


def keep_targets(targets: list[str]) -> Any:
    """An AOT-autograd graph compiler that appends each graph's call targets to `targets` and runs it as is."""

    def keep(gm: Any, _: object) -> Any:
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    return keep


def compiled_targets(fn: Any, *args: Any, **compile_kwargs: Any) -> tuple[list[str], Any]:
    """The call targets of the forward graph torch.compile(fullgraph=True) builds for fn (after AOT autograd
    decomposes it), and fn's compiled output, without grad."""
    import torch
    from torch._dynamo.backends.common import aot_autograd

    targets: list[str] = []
    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=keep_targets(targets))
    with torch.no_grad():
        out = torch.compile(fn, fullgraph=True, backend=backend, **compile_kwargs)(*args)
    torch._dynamo.reset()
    return targets, out


def mlp_parameters(d: int, hidden: int) -> tuple[Any, Any, Any, Any]:
    """(generator, w1 [hidden, d], b1 [hidden], w2 [d, hidden]): a d -> hidden -> d MLP's parameters drawn from a
    generator seeded 0, which is returned for the rest of a model's parameters to be drawn from after them."""
    import torch

    g = torch.Generator().manual_seed(0)
    w1 = torch.nn.Parameter(torch.randn(hidden, d, generator=g) / d**0.5)
    b1 = torch.nn.Parameter(torch.randn(hidden, generator=g) * 0.1)
    w2 = torch.nn.Parameter(torch.randn(d, hidden, generator=g) / hidden**0.5)
    return g, w1, b1, w2


# ------------------------------------------------------------------------------------------ patched models


def tiny_llama(layers: int, vocab: int = 128) -> Any:
    """transformers' Llama for causal LM with random weights: 64 wide, 4 heads (2 of keys and values), an MLP of
    96, `layers` layers (callers skip without transformers: pytest.importorskip)."""
    import transformers

    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=vocab,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def count_calls(monkeypatch: Any, owner: object, name: str) -> list[int]:
    """Replace `owner.<name>` for the test (monkeypatch) by a wrapper that calls it and appends 1 to the list
    returned, once per call."""
    calls: list[int] = []
    real = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls


def check_screens(monkeypatch: Any) -> list[str]:
    """From now on, every full-path call of a public op checks its hot-path screen against dispatch: where the
    screen gives the call a value (and the call needs no autograd), each problem the op's forward kernel resolved
    inside the call has that value (the screen is a necessary condition for a kernel to serve). Returns the list
    of op names whose calls were checked, one per check."""
    from tunekit.runtime import dispatch, hotpath

    checked: list[str] = []
    stack: list[list[tuple[str, Any]]] = []
    config = dispatch.Dispatcher.config

    def spied_config(self: Any, key: Any) -> Any:
        if stack:
            stack[-1].append((self.kernel, key))
        return config(self, key)

    def spy(hot: Any, op: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            stack.append([])
            try:
                return op(*args, **kwargs)
            finally:
                resolved = stack.pop()
                _check_screen(hot, args, kwargs, resolved, checked)

        return call

    monkeypatch.setattr(dispatch.Dispatcher, "config", spied_config)
    for hot in hotpath.ops():
        monkeypatch.setattr(hot, "op", spy(hot, hot.op))
    return checked


def _check_screen(hot: Any, args: Any, kwargs: Any, resolved: Any, checked: list[str]) -> None:
    import torch

    from tunekit.core.registry import get_spec
    from tunekit.runtime.hotpath import _any_requires_grad

    screen = hot.screen
    if screen is None or (torch.is_grad_enabled() and _any_requires_grad(args, kwargs)):
        return
    try:
        value = screen.of_call(*args, **kwargs)
    except Exception:
        return
    spec = get_spec(screen.kernel)
    for kernel, key in resolved:
        if kernel != screen.kernel or value is None:
            continue
        problem = spec.problem_dict(key)
        assert screen.of_problem(problem) == value, (hot.name, value, problem)
        checked.append(hot.name)
