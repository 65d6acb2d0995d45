"""Write the benchmark suite's problems (tunekit.evaluation.suite, full scope) as plan files for `tunekit tune --plan`.

Four files in DIR, in the order they are worth tuning when time is short: memory_large (bandwidth-bound rows),
gemm_main (no epilogue, bias+GELU), gemm_rest (bias+ReLU, bias+GELU+residual), memory_small (launch-bound rows,
where a config changes little); and gemm_large_aligned, a subset of the GEMM ones (the suite's large aligned
group) for a deeper re-tune. Usage: python tests/gpu/suite_plan.py DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tunekit.core.registry import get_spec
from tunekit.evaluation.results import SMALL_PROBLEM_BYTES
from tunekit.evaluation.suite import GEMM_GROUPS, GEMM_LARGE, SUITES, families


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[dict]] = {"memory_large": [], "gemm_main": [], "gemm_rest": [], "memory_small": []}
    for name in SUITES["all"]:
        family = families()[name]
        spec = get_spec(family.kernel)
        for problem in family.problems("full"):
            item = {"kernel": family.kernel, "problem": problem}
            if family.bound == "compute":
                gelu = "gelu" in str(problem["activation"]) and not problem["has_residual"]
                main_epilogue = problem["activation"] == "none" or gelu
                groups["gemm_main" if main_epilogue else "gemm_rest"].append(item)
            elif spec.bytes_moved(problem) < SMALL_PROBLEM_BYTES:
                groups["memory_small"].append(item)
            else:
                groups["memory_large"].append(item)
    # Not one of the four above: the large aligned GEMM rows again, for a deeper re-tune of the rows the
    # cuBLASLt target is judged on (PLANS=gemm_large_aligned GEMM_TRIALS=12 bash tests/gpu/suite_tune.sh).
    large = {name: pred for name, pred in GEMM_GROUPS}[GEMM_LARGE]
    gemm = groups["gemm_main"] + groups["gemm_rest"]
    groups["gemm_large_aligned"] = [i for i in gemm if large(i["problem"])]
    for group, items in groups.items():
        (out / f"{group}.jsonl").write_text("".join(json.dumps(i) + "\n" for i in items))
        print(f"{group}: {len(items)} problems")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
