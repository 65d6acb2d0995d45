"""Stored text is escaped wherever the CLI prints it (tunekit.core.render): rich markup and terminal control sequences
in device names, problems, job errors and worker names print as themselves, never as markup or escapes."""

from __future__ import annotations

import dataclasses
import json

import pytest
from helpers import cli, toy_entry

from tunekit.core.device import fingerprint
from tunekit.core.render import markup, plain
from tunekit.fleet.queue import JobQueue
from tunekit.store.database import document
from tunekit.store.entry import Entry
from tunekit.store.store import Store

ESC = "\x1b"
HOSTILE = [
    "[/nope]",  # a closing tag with nothing open: rich raises MarkupError
    "[bold red]loud[/bold red]",
    "\x1b[2J\x1b[H wiped",  # clear the screen
    "\x1b]0;pwned\x07",  # set the window title (OSC ... BEL)
    "\x9b31m C1 CSI",
    "right\u202eto-left",  # a bidi override reorders what follows
    "tail\\",  # a trailing backslash would escape rich's next tag
    "new\nline\rreturn\ttab",
]


pytestmark = pytest.mark.usefixtures("wide_terminal")


@pytest.mark.parametrize("text", HOSTILE)
def test_plain_and_markup_show_the_text_as_itself(text):
    from rich.console import Console

    shown = plain(text)
    assert all(c.isprintable() for c in shown) and "\u202e" not in shown
    console = Console(width=400, record=True, force_terminal=False)
    console.print(markup(text))  # parses as markup without error, and prints exactly `plain(text)`
    printed = console.export_text().rstrip("\n")
    # (rich's escape doubles a trailing backslash, so that a tag after it could not be escaped by it)
    assert printed == shown or (shown.endswith("\\") and printed == shown + "\\")


def test_plain_names_each_control_character():
    assert plain("a\x1b[31mb\x07\x9b\u202e") == "a\\x1b[31mb\\x07\\x9b\\u202e"
    assert plain("München → 東京") == "München → 東京"  # printable text is untouched
    assert markup("[/nope]") == "\\[/nope]"


def _hostile_entries(toy, in_problem: bool = False):
    """Entries of foreign devices whose names hold markup and control sequences: valid by every import rule (the
    device object is the one each key names). `in_problem`: their problem dtype strings too, which only an entry of
    another kernel source can hold (import and the store refuse problems the kernel does not declare)."""
    entries = []
    for i, name in enumerate(HOSTILE):
        device = dataclasses.replace(fingerprint(), name=name)
        e = toy_entry(toy, device, 1.0 + i, rows=1 << i)
        data = e.to_json()
        if in_problem:
            data["key"]["problem"]["dtype"] = name
            data["key"]["source_hash"] = "0123456789abcdef"
        entries.append(data)
    return entries


def test_show_prints_hostile_stored_text_as_itself(toy, tmp_path):
    path = tmp_path / "db.json"
    path.write_text(json.dumps(document([]) | {"entries": _hostile_entries(toy)}))
    result = cli("import", str(path))
    assert result.exit_code == 0 and f"{len(HOSTILE)} added" in result.output, result.output
    with Store() as store:
        for data in _hostile_entries(toy, in_problem=True):
            store.put(Entry.from_json(data))
    for args in (["show", "--all-devices"], ["show", "--kernel", "toy", "--all-devices"]):  # other devices' entries
        result = cli(*args)
        assert result.exit_code == 0, result.output
        assert ESC not in result.output and "\x07" not in result.output and "\u202e" not in result.output
        assert "[/nope]" in result.output and "[bold red]loud[/bold red]" in result.output
        assert "\\x1b[2J\\x1b[H wiped" in result.output and "\\x1b]0;pwned\\x07" in result.output
        assert "dtype=[/nope]" in result.output and "dtype=\\x1b[2J\\x1b[H wiped" in result.output
        assert f"{2 * len(HOSTILE)} entries" in result.output


def test_fleet_status_escapes_job_errors_and_worker_names(toy, tmp_path):
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    queue = JobQueue(url)
    from tunekit.fleet.jobs import Job

    queue.submit([Job("toy", {"rows": 8, "cols": 32, "dtype": "[/nope]\x1b[31m"}, trials=2)])
    claim = queue.claim("[bold]worker\x1b]0;x\x07")
    assert claim is not None
    queue.fail(claim, "[/nope] failed \x1b[2J")
    result = cli("status", "--storage", url, "--jobs")
    assert result.exit_code == 0, result.output
    assert ESC not in result.output and "\x07" not in result.output
    assert "[/nope] failed \\x1b[2J" in result.output and "[bold]worker\\x1b]0;x\\x07" in result.output
    assert "dtype=[/nope]\\x1b[31m" in result.output


def test_one_line_errors_escape_what_they_quote(toy, tmp_path):
    missing = str(tmp_path / "\x1b[2Jmissing[/nope].json")
    result = cli("import", missing)
    assert result.exit_code == 1 and "cannot read" in result.output and "\\x1b[2Jmissing[/nope].json" in result.output
    assert ESC not in result.output


def test_export_and_import_messages_escape_paths(toy, tmp_path):
    with Store() as store:
        store.put(toy_entry(toy, fingerprint(), 1.0))
    out = tmp_path / "db[bold].json"
    result = cli("export", "--out", str(out))
    assert result.exit_code == 0 and "db[bold].json" in result.output, result.output
    result = cli("import", str(out))
    assert result.exit_code == 0 and "db[bold].json: 1 entry read" in result.output, result.output


def test_a_plan_file_s_problems_print_as_themselves(toy, tmp_path):
    plan = tmp_path / "plan.jsonl"
    plan.write_text(json.dumps({"kernel": "toy", "problem": {"rows": 8, "cols": 32, "dtype": "[/nope]\x1b[2J"}}) + "\n")
    result = cli("plan", str(plan))  # not a dtype of the toy kernel: refused, quoting it as itself
    assert result.exit_code == 1 and "[/nope]\\x1b[2J" in result.output and ESC not in result.output


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("\u061c", "\\u061c"),  # ARABIC LETTER MARK (Cf, bidi)
        ("a\U000e0041b", "a\\U000e0041b"),  # TAG LATIN CAPITAL LETTER A (Cf)
        ("\ud800", "\\ud800"),  # a lone surrogate (Cs): printing it raised UnicodeEncodeError
        ("\ue000", "\\ue000"),  # private use (Co)
        ("x\u2028y\u2029", "x\\u2028y\\u2029"),  # line and paragraph separators (Zl, Zp)
        ("\u00ad", "\\xad"),  # soft hyphen (Cf)
        ("\U000f0000", "\\U000f0000"),  # supplementary private use (Co)
        ("é漢字 ok", "é漢字 ok"),  # letters stay as they are
    ],
)
def test_every_invisible_character_category_is_escaped(raw, shown):
    """Issue 29: U+061C and U+E0041 printed raw; a lone surrogate made `show` raise. Categories Cc, Cf, Co, Cs, Zl
    and Zp are escaped, and the result always encodes as UTF-8."""
    assert plain(raw) == shown
    plain(raw).encode("utf-8")
