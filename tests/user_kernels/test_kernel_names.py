"""A user kernel's name is checked where it is given: `tunekit.autotune(name=...)` refuses a name
that `tunekit import` would refuse (one rule: tunekit.store.user_entries.check_import_path), and the default name of a
kernel built inside a function is one that export and import round-trip."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
import user_kernel_example as ex
from helpers import cli

import tunekit
from tunekit.core.errors import TunekitError
from tunekit.store.store import Store


@pytest.mark.parametrize("name", ["layernorm", "my kernel!", "pkg.mod:factory.<locals>.kern", "pkg.mod:", ":kern"])
def test_a_name_import_would_refuse_is_refused_at_decoration(name):
    with pytest.raises(TunekitError, match=r"package\.module:attribute") as info:
        tunekit.autotune(configs=ex.CONFIGS, key=["n"], name=name)(ex.add_kernel)
    message = str(info.value)
    assert "\n" not in message and repr(name) in message and "name=" in message


def _factory():
    @triton.jit
    def kern(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) - tl.load(y_ptr + offs, mask=mask), mask=mask)

    return kern


def test_the_default_name_of_a_kernel_built_in_a_function_round_trips_export_and_import(tmp_path):
    kernel = tunekit.autotune(configs=ex.CONFIGS, key=["n"], do_bench=ex.FakeBench())(_factory())
    assert kernel.name == "test_kernel_names:_factory.kern"
    x, y, out = torch.randn(40), torch.randn(40), torch.empty(40)
    kernel[ex.grid](x, y, out, 40)
    assert torch.equal(out, x - y)
    db = tmp_path / "db.json"
    assert cli("export", "--kernel", kernel.name, "-o", str(db)).exit_code == 0
    assert cli("forget", "--kernel", kernel.name).exit_code == 0 and len(Store()) == 0
    imported = cli("import", str(db))
    assert imported.exit_code == 0 and "1 added" in imported.output, imported.output
    again = tunekit.autotune(configs=ex.CONFIGS, key=["n"], do_bench=ex.FakeBench())(_factory())
    again[ex.grid](x, y, out, 40)
    assert again.stats.stored == 1 and again.stats.benchmarks == 0


def test_a_default_name_that_cannot_be_an_import_path_asks_for_name():
    namespace: dict = {}
    exec("def kern(x_ptr, n, BLOCK):\n    pass\n", {"__name__": "not a module"}, namespace)
    jitted = triton.jit(namespace["kern"])
    with pytest.raises(TunekitError, match=r"give tunekit.autotune\(name='package.module:attribute'\)"):
        tunekit.autotune(configs=ex.CONFIGS, key=["n"])(jitted)
