"""RESULTS.md's generated tables are what tests/results_tables.py renders from the recorded JSON today: a table
edited by hand, or a JSON file changed under it, fails here."""

from __future__ import annotations

import re

import pytest
from results_tables import ROOT, block, render

RESULTS = ROOT / "RESULTS.md"
FOLDERS = re.findall(r"<!-- generated: (\S+) -->", RESULTS.read_text())


def test_results_has_generated_tables() -> None:
    assert "cache/bench/h200-sm90-132sm/compiled_choices" in FOLDERS


@pytest.mark.parametrize("folder", FOLDERS)
def test_a_generated_table_is_what_its_json_renders(folder: str) -> None:
    assert block(RESULTS.read_text(), folder) == render(folder)


def test_every_listed_run_has_its_file_and_provenance() -> None:
    import json

    for folder in FOLDERS:
        for run in json.loads((ROOT / folder / "runs.json").read_text()):
            assert (ROOT / folder / run["file"]).is_file()
            assert all(run.get(k) for k in ("date", "commit", "gpu", "command")), run
