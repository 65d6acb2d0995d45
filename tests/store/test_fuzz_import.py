"""Importing hostile tuning databases (hypothesis): a clear DatabaseError and an untouched store, or a clean import.

Documents start valid and are then damaged anywhere: wrong types, huge or non-finite numbers, deep nesting, unknown
kernels, configs outside the space, junk bytes. Whatever happens, no other exception escapes, a refused file
writes nothing, and an accepted one leaves only entries that validate again.

`test_the_local_best_is_served_after_any_import` builds documents of entries that break the space's rules, times
below the physical floor, another timer's times, one key twice, and duplicate JSON keys, over a store holding a
tuned best; afterwards dispatch (`tunekit.runtime.dispatch.resolve`) serves exactly what the rules say it must.
"""

from __future__ import annotations

import json
import math

import pytest
from helpers import toy_entry
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from tunekit.core.device import fingerprint
from tunekit.core.errors import DatabaseError, TunekitError
from tunekit.runtime.dispatch import resolve
from tunekit.store import database
from tunekit.store.database import document, import_document, validate_entry
from tunekit.store.store import Store

FUZZ = settings(
    max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([0, -1, 2**31, 2**40, 2**63, 10**30, 3])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -0.0, 5e-324])
    | st.text(max_size=12)
    | st.sampled_from(["toy", "nope", "float32", "a", "b", "wrong", "ok", "failed", "x" * 100])
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=16,
)
# steps that walk into a tunekit-db document: dict keys it has, and list indices
steps = st.sampled_from(
    ["entries", 0, 1, "key", "best", "config", "problem", "trials", "time_ms", "status", "kernel", "schema",
     "BLOCK", "variant", "num_warps", "rows", "cols", "dtype", "device", "provenance", "format", "source_hash",
     "device_key", "error", "name"]
)  # fmt: skip


# most damage goes inside an entry, where validation has the most to check
paths = st.lists(steps, max_size=3) | st.builds(
    lambda i, part, rest: ["entries", i, part, *rest],
    st.sampled_from([0, 1]),
    st.sampled_from(["key", "best", "trials", "device", "provenance"]),
    st.lists(steps, max_size=3),
)


def _valid_document(toy) -> dict:
    return document([toy_entry(toy, fingerprint(), 0.5, rows=16), toy_entry(toy, fingerprint(), 1.0, rows=8)])


def _splice(doc: object, path: list, value: object, delete: bool) -> object:
    """doc with the node at `path` (as far as it exists) replaced by `value`, or deleted."""
    if not path:
        return value
    node = doc
    for step in path[:-1]:
        in_dict = isinstance(node, dict) and step in node and isinstance(node[step], (dict, list))
        in_list = isinstance(node, list) and isinstance(step, int) and step < len(node)
        if not (in_dict or in_list):
            break
        node = node[step]
    last = path[-1]
    if isinstance(node, dict):
        if delete:
            node.pop(last, None)
        else:
            node[last if isinstance(last, str) else str(last)] = value
    elif isinstance(node, list) and node:
        index = last % len(node) if isinstance(last, int) else 0
        if delete:
            node.pop(index)
        else:
            node[index] = value
    return doc


def _snapshot(store: Store) -> list:
    return sorted(json.dumps(e.to_json(), sort_keys=True) for e in store.entries())


def _check_import(toy, tmp_path, text: str | bytes) -> None:
    path = tmp_path / "db.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", errors="surrogatepass"))
    with Store(tmp_path / "store") as store:
        store.put(toy_entry(toy, fingerprint(), 2.0, block=4, rows=8))  # something to keep
        before = _snapshot(store)
        try:
            import_document(store, path)
        except DatabaseError as exc:
            message = str(exc)
            assert message and "\n" not in message and len(message) < 2000
            assert _snapshot(store) == before  # refused: nothing written
            return
        for i, entry in enumerate(store.entries()):  # accepted: everything stored validates again
            validate_entry(json.loads(json.dumps(entry.to_json())), i)
            assert toy.space.check_membership(entry.config) == entry.config


@FUZZ
@given(path=paths, value=json_values, delete=st.booleans())
def test_damaged_documents_are_refused_cleanly_or_imported_cleanly(toy, tmp_path_factory, path, value, delete):
    doc = _splice(_valid_document(toy), path, value, delete)
    try:
        text = json.dumps(doc)
    except (ValueError, TypeError):
        assume(False)
    _check_import(toy, tmp_path_factory.mktemp("fuzz"), text)


config_values = st.sampled_from([1, 2, 3, 8, 64, 128, 2**40, -4, 0, True, "a", "b", "wrong", "c", "8", None, 8.0])


@FUZZ
@given(
    config=st.dictionaries(st.sampled_from(["BLOCK", "variant", "num_warps", "extra"]), config_values, max_size=4),
    where=st.sampled_from(["best", "trial"]),
)
def test_a_config_is_accepted_exactly_when_it_is_in_the_space(toy, tmp_path_factory, config, where):
    doc = _valid_document(toy)
    target = doc["entries"][1]["best"] if where == "best" else doc["entries"][1]["trials"][1]
    target["config"] = config
    try:
        toy.space.check_membership(config)
        member = True
    except TunekitError:
        member = False
    # A config that ran (the best, an "ok" trial) must also pass the rules (BLOCK <= cols = 32); trials[1] is
    # "wrong": membership only.
    valid = member and (where == "trial" or toy.space.is_valid(config, {"rows": 8, "cols": 32}, fingerprint()))
    tmp = tmp_path_factory.mktemp("fuzz")
    path = tmp / "db.json"
    path.write_text(json.dumps(doc))
    with Store(tmp / "store") as store:
        if valid:
            assert import_document(store, path).added == 2
        else:
            with pytest.raises(DatabaseError, match="outside the toy space" if not member else "breaks the toy"):
                import_document(store, path)
            assert len(store) == 0


@FUZZ
@given(
    field=st.sampled_from(["rows", "cols", "dtype"]),
    value=st.sampled_from([8, 0, -1, 2**40, 2**39, True, False, "8", "float32", "", None, 1.5, [8], {"x": 1}]),
)
def test_a_problem_value_of_the_wrong_type_or_range_is_refused(toy, tmp_path_factory, field, value):
    doc = _valid_document(toy)
    problem = doc["entries"][1]["key"]["problem"]
    problem[field] = value
    want = int if field in ("rows", "cols") else str
    # the toy kernel's declaration: a size in [1, 2^40), a dtype of its tolerances
    ok = type(value) is want and (value in toy.tolerances if want is str else 1 <= value < 2**40)
    tmp = tmp_path_factory.mktemp("fuzz")
    path = tmp / "db.json"
    path.write_text(json.dumps(doc))
    with Store(tmp / "store") as store:
        if not ok:
            with pytest.raises(DatabaseError, match=f"key.problem.{field} must be"):
                import_document(store, path)
        elif problem == doc["entries"][0]["key"]["problem"]:
            with pytest.raises(DatabaseError, match="the same key as entry 0"):
                import_document(store, path)
        elif problem["cols"] < 16:  # the entry's BLOCK is 16: the rule BLOCK <= cols
            with pytest.raises(DatabaseError, match="breaks the toy space's rule 'block_fits_row'"):
                import_document(store, path)
        elif database.time_floor_ms(toy, problem) > 1.0:  # its 1 ms is faster than its bytes at 20 TB/s
            with pytest.raises(DatabaseError, match="physical floor"):
                import_document(store, path)
        else:
            assert import_document(store, path).read == 2
            return
        assert len(store) == 0


@FUZZ
@given(doc=json_values)
def test_arbitrary_json_is_refused(toy, tmp_path_factory, doc):
    tmp = tmp_path_factory.mktemp("fuzz")
    path = tmp / "db.json"
    path.write_text(json.dumps(doc))
    with Store(tmp / "store") as store, pytest.raises(DatabaseError):
        import_document(store, path)
    assert len(Store(tmp / "store")) == 0


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200))
def test_junk_bytes_are_refused(toy, tmp_path_factory, data):
    _check_import(toy, tmp_path_factory.mktemp("fuzz"), data)


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,  # deeper than the JSON parser's recursion
        '{"format": "tunekit-db", "schema": 1, "entries": [' + "{" * 5000 + "}" * 5000 + "]}",
        '{"format": "tunekit-db", "schema": 1, "entries": [1' + "0" * 5000 + "]}",  # an int too long to parse
        '{"format": "tunekit-db", "schema": 1e999, "entries": []}',
        '{"format": "tunekit-db", "schema": NaN, "entries": []}',
        "\ufeff{}",
    ],
)
def test_pathological_documents_are_refused(toy, tmp_path, text):
    _check_import(toy, tmp_path, text)


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda e: e["best"]["config"].update(BLOCK=2**80), "must be one of"),
        (lambda e: e["best"].update(time_ms=math.inf), "not valid JSON: Infinity is not JSON"),
        (lambda e: e["best"].update(time_ms=math.nan), "not valid JSON: NaN is not JSON"),
        (lambda e: e["trials"][0].update(time_ms=-math.inf), "not valid JSON: -Infinity is not JSON"),
        (lambda e: e["best"].update(time_ms=1e300), "time_ms must be a number in"),
        (lambda e: e["best"].update(time_ms=0), "time_ms must be a number in"),
        (lambda e: e["trials"][1].update(error={"nested": [1]}), "error must be a string or null"),
        (lambda e: e["trials"][1].update(time_ms="slow"), "time_ms must be a number or null"),
        (lambda e: e["device"].update(name=["H200"]), r"device values must be .* but device.name is \['H200'\]"),
        (lambda e: e["device"].update(name=7), "device.name must be a string"),
        (lambda e: e["device"].update(sm_count={"deep": {"er": 1}}), "device values must be"),
        (lambda e: e["provenance"].update(date=[1, 2]), "provenance values must be"),
        (lambda e: e["key"].update(schema=True), "key schema must be 1"),
        (lambda e: e["key"]["problem"].update(rows=True), "key.problem.rows must be an int"),
        (lambda e: e["key"]["problem"].update(dtype=16), "key.problem.dtype must be a string"),
        (lambda e: e["key"].update(kernel=["toy"]), "unknown kernel"),
        (lambda e: e.update(trials=[{"config": {}, "status": "ok"}] * 2), "config outside the toy space"),
    ],
)
def test_wrong_types_and_values_name_the_rule(toy, tmp_path, mutate, message):
    doc = _valid_document(toy)
    mutate(doc["entries"][1])
    path = tmp_path / "db.json"
    path.write_text(json.dumps(doc))
    with Store() as store, pytest.raises(DatabaseError, match=message):
        import_document(store, path)
    with Store() as store:
        assert list(store.entries()) == []


# --- the previous best is still what is served ---------------------------------------------------------------------

LOCAL_PROBLEM = {"rows": 8, "cols": 32, "dtype": "float32"}
LOCAL_BEST = {"BLOCK": 4, "variant": "a", "num_warps": 1}
LOCAL_TIMER = "interpreter-wall-clock"

imported_entries = st.fixed_dictionaries(
    {
        "rows": st.sampled_from([8, 8, 8, 16, 32, 64]),  # mostly the local problem's key (rows 8, cols 32)
        "cols": st.sampled_from([32, 32, 32, 32, 8]),  # 8: BLOCK > 8 breaks the rule block_fits_row
        "BLOCK": st.sampled_from([1, 2, 4, 8, 8, 16, 16, 32, 32, 64]),  # 64 > 32 breaks it for the local problem too
        "variant": st.sampled_from(["a", "b"]),
        "num_warps": st.sampled_from([1, 2, 4, 8]),
        # below the 1 us floor, then valid times on both sides of the local best's 2.0 ms
        "time_ms": st.sampled_from([5e-324, 0.0009, 0.001, 0.01, 0.25, 0.5, 1.0, 1.5, 1.999, 2.0, 3.0, 10.0]),
        "timer": st.sampled_from([LOCAL_TIMER] * 3 + ["cuda-events-median-l2-flushed", None]),
        "trial_breaks_rule": st.sampled_from([False] * 7 + [True]),
    }
)


def _imported(toy, item: dict):
    config = {"BLOCK": item["BLOCK"], "variant": item["variant"], "num_warps": item["num_warps"]}
    entry = toy_entry(toy, fingerprint(), item["time_ms"], rows=item["rows"], cols=item["cols"], timer=item["timer"])
    data = entry.to_json()
    data["best"]["config"] = config
    data["trials"][0]["config"] = dict(config)
    if item["trial_breaks_rule"]:  # an "ok" trial of another config that breaks the rule
        data["trials"].append({"config": {**config, "BLOCK": 64}, "status": "ok", "time_ms": 1.0, "error": None})
    if item["timer"] is None:
        del data["provenance"]["timer"]
    return data


def _cleaned(items: list[dict]) -> list[dict]:
    """The items with no damage: BLOCK within the row, times at or above the floor, each key once, no bad trial."""
    kept: dict[tuple[int, int], dict] = {}
    for item in items:
        block = min(item["BLOCK"], item["cols"])
        fixed = item | {"BLOCK": block, "time_ms": max(item["time_ms"], 0.001), "trial_breaks_rule": False}
        kept.setdefault((item["rows"], item["cols"]), fixed)
    return list(kept.values())


def _refused(toy, items: list[dict], duplicate_json_key: bool) -> bool:
    keys = [(i["rows"], i["cols"]) for i in items]
    for item in items:
        problem = {"rows": item["rows"], "cols": item["cols"], "dtype": "float32"}
        if item["BLOCK"] > item["cols"] or (item["trial_breaks_rule"] and item["cols"] < 64):
            return True
        if item["time_ms"] < database.time_floor_ms(toy, problem):
            return True
    return duplicate_json_key or len(set(keys)) != len(keys)


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=st.lists(imported_entries, min_size=1, max_size=3), duplicate_json_key=st.booleans(), clean=st.booleans())
def test_the_local_best_is_served_after_any_import(toy, tmp_path_factory, items, duplicate_json_key, clean):
    """Over a tuned local best (2.0 ms by the interpreter's timer): a document breaking any rule is refused whole;
    an accepted one replaces the served config only with a faster one measured by the same timer.

    Half the documents are cleaned of every damage (so that about half are imported, and both branches run)."""
    if clean:
        items, duplicate_json_key = _cleaned(items), False
    tmp = tmp_path_factory.mktemp("fuzz")
    device = fingerprint()
    local = toy_entry(toy, device, 2.0, block=LOCAL_BEST["BLOCK"], rows=8, timer=LOCAL_TIMER)
    local = type(local)(local.key, dict(LOCAL_BEST), 2.0, local.device, local.provenance, local.trials)
    text = json.dumps(document([]) | {"entries": [_imported(toy, item) for item in items]})
    if duplicate_json_key:  # a second "time_ms" in the first best: json.loads would keep the last silently
        text = text.replace('"best": {', '"best": {"time_ms": 0.5, ', 1)
    path = tmp / "db.json"
    path.write_text(text)
    with Store(tmp / "store") as store:
        store.put(local)
        before = _snapshot(store)
        try:
            result = import_document(store, path)
        except DatabaseError as exc:
            assert "\n" not in str(exc)
            assert _refused(toy, items, duplicate_json_key), f"refused a valid document: {exc}"
            event("refused")
            assert _snapshot(store) == before
            served = resolve(toy, LOCAL_PROBLEM, device, store)
            assert (served.layer, dict(served.config)) == ("cache", LOCAL_BEST)
            return
        assert not _refused(toy, items, duplicate_json_key), "accepted a document that breaks a rule"
        event(
            "accepted: a faster import serves"
            if any(
                i["timer"] == LOCAL_TIMER and i["time_ms"] < 2.0 and (i["rows"], i["cols"]) == (8, 32) for i in items
            )
            else "accepted: the local best still serves"
        )
        assert result.read == len(items) == result.added + result.improved + result.kept
        served = resolve(toy, LOCAL_PROBLEM, device, store)
        assert served.layer == "cache" and toy.space.is_valid(served.config, LOCAL_PROBLEM, device)
        mine = [i for i in items if (i["rows"], i["cols"]) == (8, 32)]
        faster = [i for i in mine if i["timer"] == LOCAL_TIMER and i["time_ms"] < 2.0]
        if faster:
            (item,) = faster
            want = {"BLOCK": item["BLOCK"], "variant": item["variant"], "num_warps": item["num_warps"]}
            assert dict(served.config) == want and served.entry.time_ms == item["time_ms"]
            assert result.improved == 1
        else:
            assert dict(served.config) == LOCAL_BEST and served.entry.time_ms == 2.0
            assert result.kept == len(mine)


def test_a_rule_breaking_entry_already_in_the_store_is_never_served(toy):
    """Serving checks the rules too (tunekit.runtime.dispatch.resolve): an entry written past import (an older tunekit,
    a hand-edited store) with a config that breaks the rules for its problem falls through to the next layer."""
    device = fingerprint()
    bad = toy_entry(toy, device, 0.001, rows=8)
    bad = type(bad)(bad.key, {"BLOCK": 64, "variant": "a", "num_warps": 1}, 0.001, bad.device, bad.provenance, ())
    with Store() as store:
        store.put(bad)
        assert store.get(bad.key) is not None  # stored, and readable: membership is all the store checks
        served = resolve(toy, LOCAL_PROBLEM, device, store)
    assert served.layer != "cache" and toy.space.is_valid(served.config, LOCAL_PROBLEM, device)
