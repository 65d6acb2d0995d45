"""`tunekit forget`: remove cache entries by kernel, device key or cache key; at least one filter."""

from __future__ import annotations

import dataclasses

import pytest
from crafting import plant
from fingerprints import H200
from helpers import cli, toy_entry

from tunekit.core.device import fingerprint
from tunekit.core.errors import TunekitError
from tunekit.store.forget import Selection, forget
from tunekit.store.store import Store

pytestmark = pytest.mark.usefixtures("wide_terminal")



@pytest.fixture
def three(toy):
    """Two entries on this device, one on an H200."""
    entries = [toy_entry(toy, fingerprint(), 1.0, rows=8), toy_entry(toy, fingerprint(), 1.0, rows=16)]
    entries.append(toy_entry(toy, H200, 1.0, rows=8))
    with Store() as store:
        for e in entries:
            store.put(e)
    return entries


def _left() -> set[str]:
    with Store() as store:
        return {e.key.digest for e in store.entries()}


def test_forget_needs_a_filter(three):
    result = cli("forget")
    assert result.exit_code == 1 and "forget needs at least one of --kernel, --device or --key" in result.output
    assert len(_left()) == 3


def test_forget_by_device_prefix_as_show_prints_it(three):
    result = cli("forget", "--device", H200.key[:8])
    assert result.exit_code == 0 and "removed 1 entry" in result.output, result.output
    assert _left() == {e.key.digest for e in three[:2]}
    assert "removed 2 entries" in cli("forget", "--device", "current").output
    assert _left() == set()


def test_forget_by_kernel_and_key(three):
    result = cli("forget", "--key", three[1].key.digest[:10], "--dry-run")
    assert (
        result.exit_code == 0 and three[1].key.digest in result.output and "1 entry would be removed" in result.output
    )
    assert len(_left()) == 3
    assert "removed 1 entry" in cli("forget", "--key", three[1].key.digest[:10]).output
    assert _left() == {three[0].key.digest, three[2].key.digest}
    assert "removed 0 entries" in cli("forget", "--kernel", "toy", "--device", "abcdef12").output
    assert "removed 2 entries" in cli("forget", "--kernel", "toy").output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--kernel", "nope"], "unknown kernel 'nope'"),
        (["--key", "xyz!"], "--key must be 4 to 64 lowercase hex digits"),
        (["--device", "ab"], "--device must be 4 to 64 lowercase hex digits"),
    ],
)
def test_bad_filters_are_one_line(three, args, message):
    result = cli("forget", *args)
    assert result.exit_code == 1 and message in result.output and "Traceback" not in result.output
    assert len(_left()) == 3


def test_an_ambiguous_prefix_is_refused(toy):
    seen: dict[str, object] = {}
    rows = 0
    while True:  # two problems whose digests share their first 4 hex digits (a few hundred tries)
        rows += 1
        entry = toy_entry(toy, fingerprint(), 1.0, rows=rows)
        other = seen.setdefault(entry.key.digest[:4], entry)
        if other is not entry:
            break
    with Store() as store:
        store.put(entry)
        store.put(other)
        with pytest.raises(TunekitError, match=r"--key .{4} is the prefix of 2 keys"):
            forget(store, Selection(digest=entry.key.digest[:4]))
        assert len(store) == 2
        assert forget(store, Selection(digest=entry.key.digest[:12])) == 1


def test_an_entry_that_breaks_show_can_be_forgotten(toy, tmp_path):
    """The issue's case: an imported device name that broke `show` for good, and no command to delete it."""
    device = dataclasses.replace(fingerprint(), name="[/nope]")
    with Store() as store:
        store.put(toy_entry(toy, device, 1.0))
    assert cli("show").exit_code == 0
    result = cli("forget", "--device", device.key)
    assert result.exit_code == 0 and "removed 1 entry" in result.output
    assert "0 entries" in cli("show").output


def test_a_full_digest_removes_an_unreadable_row(toy, three):
    """The store skips an unreadable row with a warning naming its digest: `forget --key DIGEST` removes it."""
    plant(three[0].key.digest, "{not json")
    with Store() as store:
        assert store.get(three[0].key) is None
    result = cli("forget", "--key", three[0].key.digest)
    assert result.exit_code == 0 and "removed 1 entry" in result.output, result.output
    with Store() as store:
        assert len(store) == 2
