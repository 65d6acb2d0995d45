"""`tunekit --help` lists every command with its whole one-line summary, at any width (click once cut each
summary mid-sentence, `tune  Tune KERNEL for each shape (a default set when none is...`)."""

from __future__ import annotations

import re

import pytest
import typer
from helpers import ROOT, cli

from tunekit.cli import app


def _summaries() -> dict[str, str]:
    group = typer.main.get_command(app)
    return {name: command.short_help or "" for name, command in group.commands.items()}  # type: ignore[attr-defined]


def _listed(lines: list[str]) -> dict[str, str]:
    """The Commands section: each command's name and its text, continuation lines joined."""
    section = lines[lines.index("Commands:") + 1 :]
    section = section[: section.index("")] if "" in section else section
    listed: dict[str, str] = {}
    name = ""
    for line in section:
        if line.startswith("  ") and not line.startswith("   "):
            name, _, text = line.strip().partition(" ")
            listed[name] = text.strip()
        else:
            listed[name] += " " + line.strip()
    return listed


@pytest.mark.parametrize("columns", ["50", "80", "250"])
def test_help_lists_each_commands_whole_summary(monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", columns)
    result = cli("--help")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert _listed(lines) == _summaries()
    assert all(len(line) <= max(80, int(columns)) for line in lines)
    if columns != "50":  # from 80 columns on, each on its command's own line
        section = lines[lines.index("Commands:") + 1 :]
        assert all(any(line.split()[:1] == [name] for line in section) for name in _summaries())
        assert len(section[: section.index("")]) == len(_summaries())


def test_each_summary_is_a_sentence_that_its_command_help_begins_with_or_names():
    """The summary is what `--help` lists; each command's own --help still says it in full."""
    for name, summary in _summaries().items():
        assert summary[0].isupper() and summary.endswith("."), (name, summary)
        assert len(summary) <= 61, (name, summary)  # one line in click's 78-column help at any terminal width


def test_cli_reference_lists_every_command():
    """The CLI reference's table (tunekit/cli/README.md) has a row for each command (`requeue` once had none);
    model-bench has its section."""
    reference = (ROOT / "tunekit" / "cli" / "README.md").read_text()
    section = reference[reference.index("## CLI\n") : reference.index("### The model benchmark: `tunekit model-bench`")]
    rows = set(re.findall(r"^\| `tunekit ([a-z-]+)", section, re.M))
    assert set(_summaries()) - {"model-bench"} <= rows, sorted(set(_summaries()) - rows)
