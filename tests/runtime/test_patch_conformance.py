"""tunekit.patch never breaks a model: every causal-LM family the installed transformers ships (enumerated from
transformers, tunekit/evaluation/patch_conformance.py), tiny, random weights, fp32 in the interpreter: the patched
model's logits, training step (loss and every gradient) and greedy generate with the KV cache match the unpatched
model's, and unpatch restores it bit-equal. A family no tiny model is built for is reported as skipped with why.

The families are split by name over a few files (this one and test_patch_conformance_*.py): CI runs one file per
worker, and one file holding all of them would be the slowest of the suite."""

from __future__ import annotations

import pytest

from tunekit.evaluation import patch_conformance

pytest.importorskip("transformers")

FIRST, LAST = "", "e~"  # the model types of this file, by name: [FIRST, LAST]


def families(first: str, last: str) -> list[tuple[str, str]]:
    return [f for f in patch_conformance.causal_lm_families() if first <= f[0] <= last]


def check(model_type: str, class_name: str) -> None:
    """One family's conformance: fails on `failed`, skips (with the reason) what cannot be built or run tiny."""
    result = patch_conformance.check_family(model_type, class_name)
    if result.status in ("cannot build", "cannot run"):
        pytest.skip(f"{model_type}: {result.status}: {result.reason}")
    assert result.status == "matched", f"{model_type} ({class_name}): {result.reason}"


@pytest.mark.parametrize(("model_type", "class_name"), families(FIRST, LAST))
def test_family_conforms(model_type: str, class_name: str) -> None:
    check(model_type, class_name)
