"""How much the GEMM results of the tuning-efficiency benchmark depend on the model's one fitted constant.

`Arch.loop_step_clk` (tunekit/tuning/roofline.py) was chosen by looking at the recorded GEMM tables. This script
reruns the model strategy (seed 0) on those tables for a range of values and prints the trials to within 2% of each
table's best, then a leave-one-out choice per table (ties broken towards the smallest constant, not the shipped one).
Not a test (pytest does not collect it): `python tests/perf_model_constant_sensitivity.py`, on a CPU.
"""

from __future__ import annotations

import dataclasses
import statistics

import optuna

from tunekit.evaluation.efficiency import describe_table, run_once
from tunekit.evaluation.timing_table import load_all
from tunekit.tuning import roofline

VALUES = (0, 100, 200, 300, 400, 600, 800)


def trials_to_near_best(table) -> int:  # type: ignore[no-untyped-def]
    run = run_once(table, describe_table(table), "model", 0)
    return run.trials if run.reached else len(table.rows)


def main() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    tables = [t for t in load_all() if t.kernel == "gemm"]
    shipped = roofline.ARCHS[9]
    results = {}
    try:
        for value in VALUES:
            roofline.ARCHS[9] = dataclasses.replace(shipped, loop_step_clk=float(value))
            results[value] = [trials_to_near_best(t) for t in tables]
            print(f"loop_step_clk={value}: trials {results[value]}", flush=True)
    finally:
        roofline.ARCHS[9] = shipped
    for i, table in enumerate(tables):
        others = {v: statistics.mean(r[j] for j in range(len(tables)) if j != i) for v, r in results.items()}
        chosen = min(others, key=lambda v: (others[v], v))
        print(f"held out m={table.problem['m']}: chosen {chosen}, trials {results[chosen][i]} of {len(table.rows)}")


if __name__ == "__main__":
    main()
