"""The documentation's reference parts, checked against the code and the data, so that they cannot go stale.

cache/README.md's example database is one shipped entry (its trials cut short), and it reads back through the code
unchanged: the document's format name and schema, the entry's fields (tunekit.store.entry.Entry), its key's
(tunekit.store.key.CacheKey), its device's (tunekit.core.device.DeviceFingerprint) and its trials'. The working
store's file name and table are the code's, and .ci/run runs the README's test command as the README writes it.
(The README's and the guides' examples run in test_readme_examples.py; the CLI and environment references are
checked in tests/cli/.)
"""

from __future__ import annotations

import json
import re

from helpers import ROOT

from tunekit.core.device import DeviceFingerprint
from tunekit.store.document_reader import FORMAT
from tunekit.store.entry import TRIAL_STATUSES, Entry
from tunekit.store.file_safety import DB_NAME, TABLE_SQL
from tunekit.store.key import SCHEMA_VERSION

DOC = ROOT / "cache" / "README.md"


def _example() -> dict:
    (block,) = re.findall(r"^```json\n(.*?)^```$", DOC.read_text(), re.M | re.S)
    return json.loads(block)


def test_the_example_database_reads_back_through_the_code_unchanged():
    document = _example()
    assert set(document) == {"format", "schema", "entries"}
    assert document["format"] == FORMAT and document["schema"] == SCHEMA_VERSION
    for entry in document["entries"]:
        assert Entry.from_json(entry).to_json() == entry
        assert DeviceFingerprint.from_json(entry["device"]).to_json() == entry["device"]
        assert {trial["status"] for trial in entry["trials"]} <= set(TRIAL_STATUSES)


def test_the_example_is_a_shipped_entry():
    shipped = [
        entry for path in sorted((ROOT / "cache").glob("*.json")) for entry in json.loads(path.read_text())["entries"]
    ]
    for entry in _example()["entries"]:
        (same,) = [s for s in shipped if s["key"] == entry["key"]]
        assert {**same, "trials": same["trials"][: len(entry["trials"])]} == entry


def test_the_working_store_is_named_as_the_code_names_it():
    text = " ".join(DOC.read_text().split())
    assert f"`{DB_NAME}`" in text and f"`{TABLE_SQL}`" in text


def test_ci_runs_the_readme_test_command_verbatim():
    """.ci/run holds a copy of the README's test command (the last ```bash setup block of its Install section)."""
    readme = (ROOT / "README.md").read_text()
    install = readme[readme.index("## Install\n") : readme.index("### Supported versions")]
    command = re.findall(r"^```bash setup\n(.*?)\n```$", install, re.M | re.S)[-1]
    assert command.endswith(".venv/bin/pytest -q -n auto --dist loadfile"), command
    assert f"\n{command} || tests=$?\n" in (ROOT / ".ci" / "run").read_text()
