"""tunekit.autotune on a small kernel written here (tests/user_kernel_example.py): a one-line conversion from
triton.autotune gives the same results; a second process measures nothing; bad input gives one line."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import triton
import user_kernel_example as ex
from helpers import TESTS

import tunekit
from tunekit.core.errors import InvalidInputError, TunekitError
from tunekit.core.space import Choice, PowerOfTwo, Rule, SearchSpace
from tunekit.store.store import Store

N = 40


def _args(n: int = N) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.randn(n), torch.randn(n), torch.full((n,), float("nan"))


def _kernel(**options):
    options.setdefault("do_bench", ex.FakeBench())
    options.setdefault("key", ["n"])
    return tunekit.autotune(**options)(ex.add_kernel)


def test_one_line_conversion_gives_triton_autotunes_results():
    triton_bench, tunekit_bench = ex.FakeBench(), ex.FakeBench()
    before = triton.autotune(configs=ex.CONFIGS, key=["n"], do_bench=triton_bench)(ex.add_kernel)
    after = tunekit.autotune(configs=ex.CONFIGS, key=["n"], do_bench=tunekit_bench)(ex.add_kernel)
    x, y, out = _args()
    expected = torch.empty_like(out)
    before[ex.grid](x, y, expected, N)
    after[ex.grid](x, y, out, N)
    assert torch.equal(out, expected) and torch.equal(out, x + y)
    assert after.best_config == before.best_config
    assert after.stats.benchmarks == triton_bench.calls == len(ex.CONFIGS)
    after[ex.grid](x, y, out, n=N)  # the same key, passed by name: the memo answers
    assert after.stats.benchmarks == len(ex.CONFIGS) and after.stats.measured == 1
    assert after.name == "user_kernel_example:add_kernel"  # the jit function's import path


_SCRIPT = """
import json, sys
import tunekit, torch
import triton, triton.language as tl
import user_kernel_example as ex

@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask){extra}, mask=mask)

kernel = tunekit.autotune(configs=ex.CONFIGS, key=["n"], do_bench=ex.FakeBench(), name="script:add")(add_kernel)
x, y = torch.randn(40), torch.randn(40)
out = torch.empty(40)
kernel[ex.grid](x, y, out, 40)
assert torch.allclose(out, x + y)
print(json.dumps({{**vars(kernel.stats), "config": kernel.best_config.kwargs}}))
"""


def _process(tmp_path: Path, cache: Path, extra: str = "") -> tuple[dict, str]:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(_SCRIPT.format(extra=extra)))
    tests = str(TESTS)
    env = {**os.environ, "TUNEKIT_CACHE_DIR": str(cache), "PYTHONPATH": tests, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_second_process_serves_the_stored_best_without_benchmarks_and_a_code_change_retunes(tmp_path, isolated_cache):
    first, _ = _process(tmp_path, isolated_cache)
    assert first["benchmarks"] == len(ex.CONFIGS) and first["measured"] == 1
    second, _ = _process(tmp_path, isolated_cache)
    assert second["benchmarks"] == 0 and second["stored"] == 1 and second["config"] == first["config"]
    changed, stderr = _process(tmp_path, isolated_cache, extra=" * 1.0")  # the kernel's code changed
    assert changed["stale"] == 1 and changed["benchmarks"] == len(ex.CONFIGS)
    stale_lines = [line for line in stderr.splitlines() if "stale" in line]
    assert len(stale_lines) == 1 and "kernel code changed" in stale_lines[0], stderr


def test_a_missing_key_argument_is_one_line():
    kernel = _kernel(configs=ex.CONFIGS)
    x, y, out = _args()
    with pytest.raises(InvalidInputError, match=r"key argument 'n' was not passed") as info:
        kernel[ex.grid](x, y, out)
    assert "\n" not in str(info.value)
    with pytest.raises(TunekitError, match=r"key names \['rows'\], which are not arguments"):
        _kernel(configs=ex.CONFIGS, key=["rows"])


def test_a_config_that_fails_to_compile_is_recorded_and_never_served(caplog):
    bad = triton.Config({"BLOCK": 3})  # tl.arange needs a power of two
    kernel = _kernel(configs=[bad, *ex.CONFIGS], name="t:fails")
    x, y, out = _args()
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        kernel[ex.grid](x, y, out, N)
    assert torch.equal(out, x + y) and kernel.best_config.kwargs["BLOCK"] != 3
    lines = [r.getMessage() for r in caplog.records if "fails" in r.getMessage()]
    assert len(lines) == 1 and "'BLOCK': 3" in lines[0] and "never served" in lines[0]
    (entry,) = Store().entries()
    assert [t.status for t in entry.trials if t.config["BLOCK"] == 3] == ["failed"]


def _reference(args: dict) -> dict:
    return {"out_ptr": args["x_ptr"] + args["y_ptr"]}


def _fixed_grid(meta: dict) -> tuple[int]:
    return (triton.cdiv(meta["n"], 32),)  # one program per 32 elements whatever BLOCK is: BLOCK=16 writes half


def test_a_reference_mismatch_rejects_the_config(caplog):
    kernel = _kernel(configs=ex.CONFIGS, reference=_reference, name="t:checked")
    x, y, out = _args()
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        kernel[_fixed_grid](x, y, out, N)
    assert torch.equal(out, x + y)
    assert kernel.best_config.kwargs["BLOCK"] == 64  # BLOCK=16 is wrong (never timed); 32 then 64 timed 3.0, 1.0
    assert kernel.stats.benchmarks == 2
    lines = [r.getMessage() for r in caplog.records if "wrong results" in r.getMessage()]
    assert len(lines) == 1 and "'BLOCK': 16" in lines[0] and "not written" in lines[0]


def test_a_space_with_a_reference_is_searched_by_the_tuner():
    space = SearchSpace(
        (PowerOfTwo("BLOCK", 16, 128), Choice("num_warps", (1, 2))),
        (Rule("block_covers_n", lambda c, p, d: int(c["BLOCK"]) * 4 >= int(p["n"])),),
    )
    kernel = _kernel(space=space, reference=_reference, trials=3, name="t:space")
    x, y, out = _args()
    kernel[ex.grid](x, y, out, N)
    assert torch.equal(out, x + y)
    assert 1 <= kernel.stats.benchmarks <= 3 and kernel.best_config.kwargs["BLOCK"] >= 16
    (entry,) = Store().entries()
    assert entry.provenance["strategy"] == "tpe" and entry.key.kernel == "t:space"


def test_changed_candidates_make_the_stored_entry_stale(caplog):
    kernel = _kernel(configs=ex.CONFIGS, name="t:outside")
    x, y, out = _args()
    kernel[ex.grid](x, y, out, N)
    (entry,) = Store().entries()
    other = _kernel(configs=ex.CONFIGS[:2], name="t:outside")  # fewer candidates: another identity, not served
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        other[ex.grid](x, y, out, N)
    assert other.stats.stale == 1 and other.stats.benchmarks == 2
    assert any("search space changed" in r.getMessage() for r in caplog.records)
    assert entry.config["BLOCK"] in (16, 32, 64)


def test_prune_configs_by_and_restore_value_follow_triton():
    seen: list[int] = []

    def early(configs, named, **kwargs):
        seen.append(named["n"])
        return [c for c in configs if c.kwargs["BLOCK"] >= 32]

    kernel = _kernel(configs=ex.CONFIGS, prune_configs_by={"early_config_prune": early}, restore_value=["out_ptr"])
    x, y, out = _args()
    before = out.clone()
    kernel.searcher.measure(kernel.stored, _call(kernel, x, y, out), kernel.problem_of(x, y, out, N))
    assert seen == [N] and kernel.stats.benchmarks == 2
    assert torch.equal(out.isnan(), before.isnan())  # restored after every benchmark


def _call(kernel, *args):
    from tunekit.user_kernels.launch import Call

    return Call.bind(kernel.name, kernel.arg_names, ex.grid, (*args, N), {})


def test_a_stored_config_outside_the_candidates_is_never_served(caplog):
    from dataclasses import replace

    kernel = _kernel(configs=ex.CONFIGS, name="t:crafted")
    x, y, out = _args()
    kernel[ex.grid](x, y, out, N)
    (entry,) = Store().entries()
    crafted = replace(entry, config={**entry.config, "BLOCK": 128}, time_ms=1e-6)  # faster, not a candidate
    Store().put(crafted)
    again = _kernel(configs=ex.CONFIGS, name="t:crafted")
    out.fill_(float("nan"))
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        again[ex.grid](x, y, out, N)
    assert again.best_config.kwargs["BLOCK"] != 128 and again.stats.benchmarks == len(ex.CONFIGS)
    assert torch.equal(out, x + y)
    assert any("is not one of the kernel's candidates" in r.getMessage() for r in caplog.records)


def test_a_database_shipped_with_a_package_is_served_without_benchmarks(tmp_path, monkeypatch, caplog):
    from tunekit.store.database import write_document

    kernel = _kernel(configs=ex.CONFIGS, name="t:shipped")
    x, y, out = _args()
    kernel[ex.grid](x, y, out, N)
    shipped = tmp_path / "tuned.json"
    write_document(shipped, Store().entries())
    monkeypatch.setenv("TUNEKIT_CACHE_DIR", str(tmp_path / "a user's empty store"))
    user = _kernel(configs=ex.CONFIGS, name="t:shipped", databases=[shipped])
    user[ex.grid](x, y, out, N)
    assert user.stats.benchmarks == 0 and user.stats.stored == 1
    assert user.best_config == kernel.best_config and torch.equal(out, x + y)
    shipped.write_text("{")  # a broken file is skipped in one warning: the kernel measures
    broken = _kernel(configs=ex.CONFIGS, name="t:shipped", databases=[shipped])
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        broken[ex.grid](x, y, out, N)
    assert broken.stats.measured == 1 and sum("skipping the database" in r.getMessage() for r in caplog.records) == 1


def test_over_triton_heuristics_the_identity_is_the_wrapped_jit_functions():
    from tunekit.core.identity import walk_jit

    even = triton.heuristics({"EVEN": lambda args: args["n"] % 64 == 0})(ex.add_even_kernel)
    kernel = tunekit.autotune(configs=ex.CONFIGS, key=["n"], do_bench=ex.FakeBench())(even)
    x, y, out = _args()
    kernel[ex.grid](x, y, out, N)
    assert torch.equal(out, x + y) and kernel.name == "user_kernel_example:add_even_kernel"
    code = kernel.stored.identity.split(".")[1]
    assert code == walk_jit([ex.add_even_kernel]).digest() != walk_jit([]).digest()
    assert kernel.keys == ["n"] and kernel.configs == ex.CONFIGS  # triton.autotune's attributes
