"""tunekit.patch's conformance sweep (test_patch_conformance.py), for the model types from 'f' to 'h~'."""

from __future__ import annotations

import pytest
from test_patch_conformance import check, families

pytest.importorskip("transformers")


@pytest.mark.parametrize(("model_type", "class_name"), families("f", "h~"))
def test_family_conforms(model_type: str, class_name: str) -> None:
    check(model_type, class_name)
