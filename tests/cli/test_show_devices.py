"""`tunekit show` lists this device's entries; other devices' (the shipped H200 and H100 databases on a CPU machine)
are counted, by device, with the flag that lists them (a fresh CPU install once printed 2,013 lines of them)."""

from __future__ import annotations

import json

from fingerprints import H200
from helpers import cli, toy_entry

from tunekit.core.device import fingerprint
from tunekit.store.database import shipped_entries
from tunekit.store.store import Store


def _plant(toy) -> None:
    with Store() as store:
        store.put(toy_entry(toy, fingerprint(), 1.0))
        store.put(toy_entry(toy, H200, 0.5, rows=16))


def test_show_on_a_fresh_install_lists_no_other_devices_entries_and_says_how_to(narrow_terminal):
    result = cli("show")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert not any("served here by" in line for line in lines)  # no shipped GPU entry listed on this CPU
    assert len(lines) <= 6, result.output
    others = len(shipped_entries())
    summary = " ".join(lines[-2:])  # at 80 columns the summary may wrap once
    assert f"{others} entries of other devices not listed" in summary and "--all-devices" in summary, summary
    assert "NVIDIA H200" in summary


def test_show_lists_this_devices_cache_entries_and_counts_the_others(toy):
    _plant(toy)
    result = cli("show", "--no-shipped", env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "toy rows=8 cols=32" in result.output and "rows=16" not in result.output
    assert result.output.splitlines()[-1] == (
        "1 entry in the cache for this device (shipped entries hidden by --no-shipped); 1 entry of other devices "
        "not listed (NVIDIA H200: 1), --all-devices lists them"
    )


def test_all_devices_lists_every_entry(toy):
    _plant(toy)
    result = cli("show", "--no-shipped", "--all-devices", env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "toy rows=8 cols=32" in result.output and "toy rows=16 cols=32" in result.output
    assert result.output.splitlines()[-1] == "2 entries in the cache (shipped entries hidden by --no-shipped)"


def test_show_json_holds_this_devices_entries_and_counts_the_others(toy):
    _plant(toy)
    document = json.loads(cli("show", "--json").stdout)
    assert [e["problem"]["rows"] for e in document["entries"]] == [8]
    assert document["other_devices"] == {"NVIDIA H200": 1 + _shipped_count("NVIDIA H200")} | {
        name: _shipped_count(name) for name in _shipped_names() if name != "NVIDIA H200"
    }
    everything = json.loads(cli("show", "--json", "--all-devices").stdout)
    assert len(everything["entries"]) == 2 + len(shipped_entries()) and everything["other_devices"] == {}


def _shipped_names() -> set[str]:
    return {e.device.get("name", "?") for e in shipped_entries().values()}


def _shipped_count(name: str) -> int:
    return sum(e.device.get("name", "?") == name for e in shipped_entries().values())
