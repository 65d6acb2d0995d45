"""Trials to within 3% of the exhaustive best, from a recorded timing table (tests/gpu/autotune_big_spaces.py writes
it): tunekit.autotune's own search, replayed, against random order. Runs on the CPU.

    python tests/gpu/autotune_replay.py --analyse TABLE.json [--out DIR] [--replay-trials 100]

Per kernel and shape, a config is "good" when it ran, matched the reference and took at most (1 + within) times the
best recorded time. Trials to 3% is the 1-based position of the first good config measured:
- tunekit: the search a user of `tunekit.autotune(space=..., key=...)` gets (Optuna TPE, seed 0, the space's first
  valid config first), replayed: the kernel is a stub jit function with the same key arguments and meta-parameters,
  launched in Triton's interpreter, and its `do_bench` answers each config's recorded time (its `pre_hook` sees which
  config is launched); a config recorded as failed or wrong raises, as a failing launch does. Nothing of tunekit is
  changed or bypassed: the order is the order tunekit's search benchmarks. Run once with a large trial budget for
  the trials to 3%, and once per `--budgets` value for the config tunekit serves after that many trials.
- random: the configs in a uniformly random order (failed and wrong configs cost a trial too); exact expectation
  (N+1)/(G+1) and median of the first good position, for N configs of which G are good.
- list: the config list in its own order (what `configs=`, like `triton.autotune`, measures; it measures them all).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

import tunekit
from tunekit.core.space import SearchSpace, config_id

sys.path.insert(0, str(Path(__file__).resolve().parent))
from big_space_kernels import KERNELS  # this folder; it picks the GPU or the interpreter before the stubs below

FORMAT = "tunekit-big-space-table/1"
WITHIN = 0.03
REPLAY_TRIALS = 100
BUDGETS = (15, 30)  # tunekit.autotune's default trials= is 30


@triton.jit
def matmul_stub(M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pass


@triton.jit
def layer_norm_stub(N, BLOCK_SIZE: tl.constexpr):
    pass


@triton.jit
def jsd_stub(n_cols, BLOCK_SIZE: tl.constexpr):
    pass


# Each kernel's stand-in: its key arguments and meta-parameters, nothing else (what tunekit's search reads).
STUBS: dict[str, Any] = {"matmul": matmul_stub, "layer_norm": layer_norm_stub, "jsd": jsd_stub}


class TableError(ValueError):
    """A timing table this analysis cannot read: the message names what is wrong."""


def good_configs(results: Sequence[dict[str, Any]], within: float) -> tuple[float | None, set[int]]:
    """The best recorded time and the indices of the configs within `within` of it (None, empty: none ran)."""
    ok = [(i, float(r["ms"])) for i, r in enumerate(results) if r["status"] == "ok"]
    if not ok:
        return None, set()
    best = min(ms for _, ms in ok)
    return best, {i for i, ms in ok if ms <= best * (1 + within)}


def random_order(n: int, good: int) -> tuple[float, int]:
    """Expected and median position of the first of `good` marked items in a random order of `n` items."""
    if not 0 < good <= n:
        raise ValueError(f"0 < good <= n must hold, but got good={good}, n={n}")
    expected = (n + 1) / (good + 1)
    total = math.comb(n, good)
    for k in range(1, n - good + 2):
        if 1 - math.comb(n - k, good) / total >= 0.5:  # P(first good at position <= k)
            return expected, k
    raise AssertionError("unreachable: the first good item is at position n - good + 1 at the latest")


def first_hit(order: Sequence[int], good: set[int]) -> int | None:
    return next((position for position, index in enumerate(order, 1) if index in good), None)


@contextlib.contextmanager
def fresh_store() -> Iterator[None]:
    """tunekit's store in a new directory for the replay (a stored entry would be served, not searched)."""
    before = os.environ.get("TUNEKIT_CACHE_DIR")
    quiet = logging.getLogger("tunekit")
    level = quiet.level
    with tempfile.TemporaryDirectory(prefix="tunekit-replay-") as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna's experimental-feature warnings
        os.environ["TUNEKIT_CACHE_DIR"] = folder
        quiet.setLevel(logging.ERROR)  # every recorded failure would be a "never served" warning
        try:
            yield
        finally:
            quiet.setLevel(level)
            if before is None:
                os.environ.pop("TUNEKIT_CACHE_DIR", None)
            else:
                os.environ["TUNEKIT_CACHE_DIR"] = before


def replay_search(
    kernel: str, space: SearchSpace, configs: Sequence[dict[str, Any]], results: Sequence[dict[str, Any]],
    problem: dict[str, Any], trials: int,
) -> tuple[list[int], int]:  # fmt: skip
    """tunekit.autotune's search of `space` for `problem` over the recorded `results`, with a budget of `trials`:
    the configs it benchmarks (indices into `configs`, in order) and the one it serves. Call inside fresh_store()."""
    index = {config_id(c): i for i, c in enumerate(configs)}
    launched: dict[str, int] = {}
    order: list[int] = []

    def pre_hook(nargs: dict[str, Any], reset_only: bool = False) -> None:
        if not reset_only:
            launched["config"] = index.get(config_id({name: nargs[name] for name in space.names}), -1)

    def do_bench(fn: Any, quantiles: Any = None) -> float:
        fn()  # the stub's launch: its pre_hook says which config this is
        i = launched["config"]
        order.append(i)
        if i < 0:
            raise RuntimeError("not in the recorded table")
        record = results[i]
        if record["status"] != "ok":
            raise RuntimeError(f"recorded {record['status']}: {record.get('error')}")
        return float(record["ms"])

    stub = STUBS[kernel]
    keys = list(KERNELS[kernel].key)
    tuned = tunekit.autotune(
        space=space,
        key=keys,
        trials=trials,
        do_bench=do_bench,
        pre_hook=pre_hook,
        name=f"autotune_replay:{kernel}_stub_{trials}",  # one store key per budget: each run searches afresh
    )(stub)
    tuned[(1,)](*(problem[k] for k in keys))
    served = tuned.best_config.all_kwargs()
    return order, index[config_id({name: served[name] for name in space.names})]


def _check_table(table: dict[str, Any]) -> None:
    if table.get("format") != FORMAT:
        raise TableError(f"a timing table has format {FORMAT!r}, but this one has {table.get('format')!r}")
    for name, kernel in table["kernels"].items():
        if name not in KERNELS:
            raise TableError(f"kernel {name!r} is not one of {sorted(KERNELS)}")
        listed = KERNELS[name].configs(bool(table["smoke"]))
        if kernel["configs"] != listed:
            raise TableError(
                f"{name}: the table's {len(kernel['configs'])} configs are not its space's {len(listed)} valid configs "
                "in order (recorded with another space: record it again)"
            )
        for shape in kernel["shapes"]:
            if len(shape["results"]) != len(listed):
                raise TableError(f"{name} {shape['label']}: {len(shape['results'])} results for {len(listed)} configs")


def analyse_shape(
    kernel: str, space: SearchSpace, configs: list[dict[str, Any]], shape: dict[str, Any], within: float,
    replay_trials: int, budgets: Sequence[int],
) -> dict[str, Any]:  # fmt: skip
    results = shape["results"]
    best, good = good_configs(results, within)
    row: dict[str, Any] = {"label": shape["label"], "configs": len(configs)}
    row["failed"] = sum(r["status"] == "failed" for r in results)
    row["wrong"] = sum(r["status"] == "wrong" for r in results)
    if any(r["status"] == "not_measured" for r in results):
        return {**row, "skipped": "not every config was measured (the run's deadline)"}
    if best is None:
        return {**row, "skipped": "no config ran and matched the reference"}
    expected, median = random_order(len(configs), len(good))
    order, served = replay_search(kernel, space, configs, results, shape["problem"], replay_trials)
    picks: dict[str, Any] = {}
    for budget in budgets:
        short, pick = replay_search(kernel, space, configs, results, shape["problem"], budget)
        ok = results[pick]["status"] == "ok"
        picks[str(budget)] = {
            "config": configs[pick],
            "gap": (float(results[pick]["ms"]) / best - 1) if ok else None,
            # the longer run's first trials are this run's: the budget only stops the search
            "prefix_of_long_run": short == order[: len(short)],
        }
    return {
        **row,
        "best_ms": best,
        "best_config": configs[min(good, key=lambda i: results[i]["ms"])],
        "good": len(good),
        "tunekit_trials": first_hit(order, good),
        "tunekit_measured": len(order),
        "tunekit_served_after_long_run_gap": float(results[served]["ms"]) / best - 1,
        "tunekit_order": order[:40],
        "tunekit_picks": picks,
        "random_expected": expected,
        "random_median": median,
        "list_trials": first_hit(range(len(configs)), good),
    }


def _stats(values: list[float | None], cap: int) -> dict[str, Any]:
    """Median and worst; a None (never within reach in `cap` trials) counts as past the cap."""
    numbers = [cap + 1 if v is None else v for v in values]
    worst = max(numbers)
    return {
        "median": statistics.median(numbers),
        "worst": worst,
        "worst_text": f">{cap}" if worst > cap else f"{worst:g}",
    }


def analyse(
    table: dict[str, Any], within: float = WITHIN, replay_trials: int = REPLAY_TRIALS, budgets: Sequence[int] = BUDGETS
) -> dict[str, Any]:
    _check_table(table)
    smoke = bool(table["smoke"])
    out: dict[str, Any] = {"within": within, "replay_trials": replay_trials, "budgets": list(budgets), "kernels": {}}
    with fresh_store():
        for name, kernel in table["kernels"].items():
            space = KERNELS[name].space(smoke)
            configs = kernel["configs"]
            rows = [
                analyse_shape(name, space, configs, shape, within, replay_trials, budgets) for shape in kernel["shapes"]
            ]
            done = [r for r in rows if "skipped" not in r]
            summary: dict[str, Any] = {"configs": len(configs), "shapes": len(done)}
            summary["skipped_shapes"] = len(rows) - len(done)
            if done:
                summary["tunekit"] = _stats([r["tunekit_trials"] for r in done], replay_trials)
                summary["random"] = _stats([r["random_expected"] for r in done], len(configs))
                summary["list"] = _stats([r["list_trials"] for r in done], len(configs))
                for budget in budgets:
                    gaps = [r["tunekit_picks"][str(budget)]["gap"] for r in done]
                    summary[f"worst_gap_at_{budget}"] = None if None in gaps else max(gaps)
                    summary[f"within_at_{budget}"] = sum(g is not None and g <= within for g in gaps)
                summary["prefix_consistent"] = all(
                    p["prefix_of_long_run"] for r in done for p in r["tunekit_picks"].values()
                )
            out["kernels"][name] = {"summary": summary, "shapes": rows}
    return out


def _cell(stats: dict[str, Any] | None, digits: int = 0) -> str:
    if stats is None:
        return "-"
    worst = stats["worst_text"] if digits == 0 else format(stats["worst"], f".{digits}f")
    return f"{stats['median']:.{digits}f} / {worst}"


def format_table(analysis: dict[str, Any], host: dict[str, Any] | None = None) -> str:
    """The short table: per kernel, configs, shapes, trials to within 3% (median / worst over shapes), the config
    tunekit serves at the default budget, and host time per call (tunekit vs a plain launch) where measured."""
    budget = max(analysis["budgets"]) if analysis["budgets"] else None
    pct = round(analysis["within"] * 100, 2)
    head = (
        f"{'kernel':11} {'configs':>7} {'shapes':>6}  {f'tunekit to {pct:g}%':>15}  {'random (exp.)':>13}  "
        f"{'list order':>10}  {f'@{budget} within':>10}  {f'@{budget} worst':>9}  "
        f"{'host us tunekit':>15} {'plain':>7} {'diff':>6}"
    )
    lines = [head, "-" * len(head)]
    for name, kernel in analysis["kernels"].items():
        s = kernel["summary"]
        host_row = (host or {}).get(name) or {}
        tk, plain, paired = host_row.get("tunekit_us"), host_row.get("plain_us"), host_row.get("diff_us_paired_median")
        diff = "-" if paired is None else f"{paired:+.2f}"
        gap = s.get(f"worst_gap_at_{budget}")
        lines.append(
            f"{name:11} {s['configs']:>7} {s['shapes']:>6}  {_cell(s.get('tunekit')):>15}  "
            f"{_cell(s.get('random'), 1):>13}  {_cell(s.get('list')):>10}  "
            f"{str(s.get(f'within_at_{budget}', '-')) + '/' + str(s['shapes']):>10}  "
            f"{'-' if gap is None else f'{gap * 100:+.1f}%':>9}  "
            f"{'-' if tk is None else f'{tk:.2f}':>15} {'-' if plain is None else f'{plain:.2f}':>7} {diff:>6}"
        )
    lines.append(
        f"trials to within {pct:g}% of the exhaustive best: median / worst over shapes (tunekit: its search replayed, "
        f"{analysis['replay_trials']}-trial cap; random: expected position). @{budget}: shapes whose config served "
        f"after tunekit's default {budget} trials is within {pct:g}%, and the worst gap. Host: us per call in a "
        "second process served by the store (medians of rounds of calls; diff: median of the rounds' differences)."
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--analyse", required=True, metavar="TABLE", help="a timing table autotune_big_spaces.py wrote")
    parser.add_argument("--out", help="folder for analysis.json (default: beside the table)")
    parser.add_argument("--within", type=float, default=WITHIN, help="good: within this fraction of the best")
    parser.add_argument("--replay-trials", type=int, default=REPLAY_TRIALS, help="tunekit search budget replayed")
    parser.add_argument("--budgets", default=",".join(map(str, BUDGETS)), help="budgets whose served config is kept")
    opts = parser.parse_args(argv)
    path = Path(opts.analyse)
    try:
        table = json.loads(path.read_text())
        budgets = [int(b) for b in opts.budgets.split(",") if b]
        analysis = analyse(table, opts.within, opts.replay_trials, budgets)
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {path}: {exc}", file=sys.stderr)
        return 1
    out = Path(opts.out) if opts.out else path.parent
    out.mkdir(parents=True, exist_ok=True)
    (out / "analysis.json").write_text(json.dumps(analysis, indent=1))
    print(format_table(analysis))
    return 0


if __name__ == "__main__":
    sys.exit(main())
