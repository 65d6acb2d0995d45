"""`tunekit explain` as text: what the model sees for a problem on a device (H200 limits, no GPU needed)."""

from __future__ import annotations

import re

from fingerprints import H200, H200_LIMITS

from tunekit.core.registry import get_spec
from tunekit.tuning.explain import WIDTH, explain


def gemm_4097() -> dict:
    spec = get_spec("gemm")
    # problem_from_shape buckets M (4097 -> 8192, what the ops key on); explain models the exact M it is given.
    return dict(spec.problem_from_shape((4097, 4096, 4096), "bfloat16"), m=4097)


def test_gemm_explain_shows_tiles_pruning_and_seeds():
    text = explain(get_spec("gemm"), gemm_4097(), H200, H200_LIMITS)
    lines = text.splitlines()
    assert all(len(line) <= WIDTH for line in lines)
    assert "132 SMs" in text and "m=4097" in text
    family_rows = [line for line in lines if re.match(r"(grouped|persistent|tma|splitk) 128x256\s", line)]
    assert family_rows and all(line.split()[4] == "528" for line in family_rows)  # 33 x 16 tiles
    assert any("3.0%" in line for line in family_rows)
    assert "Pruned by the space's rules" in text and "Pruned by the model" in text
    assert "Seeds:" in text and "variant=" in text.split("Seeds:")[1]


def test_gemm_explain_counts_rule_breaks_and_model_reasons():
    spec = get_spec("gemm")
    text = explain(spec, gemm_4097(), H200, H200_LIMITS)
    rules_section = text.split("Pruned by the space's rules")[1].split("Pruned by the model")[0]
    problem = gemm_4097()
    broken = {name for c in spec.space.all_configs() for name in spec.space.violations(c, problem, H200)}
    assert broken and all(name in rules_section for name in broken)


def test_row_kernel_explain():
    spec = get_spec("layernorm")
    text = explain(spec, spec.problem_from_shape((4096, 4097), "bfloat16"), H200, H200_LIMITS)
    lines = text.splitlines()
    assert all(len(line) <= WIDTH for line in lines)
    assert "variant x BLOCK_N x ROWS" in text
    looped = next(line for line in lines if line.startswith("looped 1024x1 "))
    assert looped.split()[4] == "4096" and "20.0%" in looped  # a program per row; 5 chunks of 1024 for 4097
    assert any(line.startswith("single 8192x") for line in lines)
