"""Issue 44, item 1: an imported database never makes a user kernel return wrong answers.

A row-sum kernel correct only when BLOCK >= n_cols, tuned here at n_cols=40: BLOCK 16 and 32 are recorded wrong, 64
wins. An export edited so that BLOCK 16 is the best at 0.5 ms is imported: the next resolution must not serve it
(torch-equal results, one warning line), and the local "wrong" record of BLOCK 16 stays.
"""

from __future__ import annotations

import json
import logging

import torch
import triton
import triton.language as tl

import tunekit
from tunekit.store.database import import_document, write_document
from tunekit.store.store import Store

N_COLS, ROWS = 40, 4
CONFIGS = [triton.Config({"BLOCK": b}, num_warps=1) for b in (16, 32, 64)]
NAME = "test_imported_trust:row_sum"


@triton.jit
def row_sum_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    # x_ptr: (rows, n_cols); out_ptr: (rows,). One program per row: it sums the first BLOCK columns only, so the
    # answer is right only when BLOCK >= n_cols.
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(x, axis=0))


def reference(args: dict) -> dict:
    return {"out_ptr": args["x_ptr"].sum(dim=1)}


def grid(meta: dict) -> tuple[int]:
    return (ROWS,)


class Bench:
    """A do_bench answering 3.0 ms for every config (the interpreter's wall clock would make the test flaky)."""

    def __call__(self, fn, quantiles=None):
        fn()
        return [3.0] * 3


def kernel(**options):
    return tunekit.autotune(
        configs=CONFIGS, key=["n_cols"], reference=reference, do_bench=Bench(), name=NAME, **options
    )(row_sum_kernel)


def run(k) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(ROWS, N_COLS)
    out = torch.full((ROWS,), float("nan"))
    k[grid](x, out, N_COLS)
    return out, x.sum(dim=1)


def matches(out: torch.Tensor, want: torch.Tensor) -> bool:
    """Within the check's own tolerance: a wrong config is off by ~8, and float32 sums in another order differ by
    ~1e-7, past allclose's default atol of 1e-8 on a row whose sum is near zero (random rows: a flaky failure)."""
    return torch.allclose(out, want, rtol=1e-4, atol=1e-4)


def edited_export(path) -> None:
    """The store exported, then edited: BLOCK 16 is the best at 0.5 ms, and its trial says "ok"."""
    write_document(path, Store().entries())
    doc = json.loads(path.read_text())
    (entry,) = doc["entries"]
    fast = {**entry["best"]["config"], "BLOCK": 16}
    entry["best"] = {"config": fast, "time_ms": 0.5}
    entry["trials"] = [{"config": fast, "status": "ok", "time_ms": 0.5, "error": None}]
    path.write_text(json.dumps(doc))


def statuses(block: int) -> list[str]:
    (entry,) = Store().entries()
    return [t.status for t in entry.trials if t.config["BLOCK"] == block]


def warnings_about_block_16(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and "'BLOCK': 16" in r.getMessage()]


def test_an_import_never_replaces_a_config_local_trials_marked_wrong(tmp_path, caplog):
    local = kernel()
    out, want = run(local)
    assert matches(out, want) and local.best_config.kwargs["BLOCK"] == 64
    assert statuses(16) == statuses(32) == ["wrong"]
    edited_export(tmp_path / "edited.json")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        result = import_document(Store(), tmp_path / "edited.json")
        fresh = kernel()  # the next process: a new memo
        out, want = run(fresh)
    assert result.improved == 0 and result.refused == 1
    assert fresh.best_config.kwargs["BLOCK"] == 64 and matches(out, want)
    assert statuses(16) == ["wrong"]  # the imported "ok" trial did not overwrite the local record
    lines = warnings_about_block_16(caplog)
    assert len(lines) == 1 and "\n" not in lines[0] and "wrong" in lines[0], lines
    (entry,) = Store().entries()
    assert entry.config["BLOCK"] == 64 and "imported_from" not in entry.provenance


def test_an_imported_wrong_config_in_a_fresh_cache_is_checked_refused_and_measured(tmp_path, monkeypatch, caplog):
    kernel()  # tuned in another machine's cache, exported and edited there
    run(kernel())
    edited_export(tmp_path / "edited.json")
    monkeypatch.setenv("TUNEKIT_CACHE_DIR", str(tmp_path / "a fresh cache"))
    assert import_document(Store(), tmp_path / "edited.json").added == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        fresh = kernel()
        out, want = run(fresh)
    assert matches(out, want) and fresh.best_config.kwargs["BLOCK"] == 64
    lines = warnings_about_block_16(caplog)
    assert any("imported" in line and "wrong" in line for line in lines), lines
    assert statuses(16)[-1] == "wrong"
    (entry,) = Store().entries()
    assert entry.config["BLOCK"] == 64
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        again = kernel()  # a later process: the stored, measured best; nothing checked or measured again
        out, want = run(again)
    assert matches(out, want) and again.stats.measured == 0 and again.stats.stored == 1
    assert not warnings_about_block_16(caplog)


def test_a_package_database_with_a_wrong_config_is_checked_before_served(tmp_path, monkeypatch, caplog):
    run(kernel())
    edited_export(tmp_path / "shipped.json")
    monkeypatch.setenv("TUNEKIT_CACHE_DIR", str(tmp_path / "a user's empty cache"))
    with caplog.at_level(logging.WARNING, logger="tunekit"):
        user = kernel(databases=[tmp_path / "shipped.json"])
        out, want = run(user)
    assert matches(out, want) and user.best_config.kwargs["BLOCK"] == 64
    assert any("wrong" in line for line in warnings_about_block_16(caplog))


def test_an_imported_correct_config_is_checked_once_then_served(tmp_path, monkeypatch):
    from tunekit.user_kernels import search

    run(kernel())
    write_document(tmp_path / "good.json", Store().entries())
    monkeypatch.setenv("TUNEKIT_CACHE_DIR", str(tmp_path / "a fresh cache"))
    import_document(Store(), tmp_path / "good.json")
    checks = []
    real = search.Searcher.check
    monkeypatch.setattr(search.Searcher, "check", lambda *a: checks.append(a) or real(*a))
    first = kernel()
    out, want = run(first)
    assert matches(out, want) and first.stats.measured == 0 and len(checks) == 1
    out, want = run(kernel())  # a new process: the recorded check answers
    assert matches(out, want) and len(checks) == 1


def test_a_launch_never_takes_the_kwargs_of_a_dropped_config_at_the_same_address() -> None:
    """The launch kwargs are memoised by the config's id: were a config dropped and another allocated at its address,
    the old memo would launch the dropped one's kwargs (BLOCK 16 while best_config says 64). The memo holds its
    config, and one that is not this config is never used."""
    k = kernel()
    out, want = run(k)
    assert matches(out, want)
    served = k.best_config
    stale = triton.Config({"BLOCK": 16}, num_warps=1)
    k._tuned_kwargs[id(served)] = (stale, stale.all_kwargs())  # what a dropped config at this address would leave
    out, want = run(k)
    assert k.best_config is served and matches(out, want)
