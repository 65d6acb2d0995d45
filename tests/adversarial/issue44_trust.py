"""Issue 44's trust cases (items 1, 7 and 8) as an adversary would try them, on the CPU (a script, not a test).

    .venv/bin/python tests/adversarial/issue44_trust.py

Each case runs in its own empty cache directory: an edited or forged database imported, a wrong config in a package
database, a shipped entry or another Triton's entry swapped after it passed, demotions lost or forged through
imports and new tunes. A case is "refused" where the attack's entry was refused (at import or by the check before
serving) and what served is correct, "served correctly" where a legitimate entry served as it should, a failure
otherwise (a wrong answer, a wrong layer, an exception). Prints one line per case, then
`tried N / refused R / served correctly S / failures F`.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(TESTS), str(TESTS / "user_kernels")]

import test_imported_trust as uk  # noqa: E402  (the row-sum user kernel of item 1)
from helpers import toy_entry  # noqa: E402

from tunekit.core import registry  # noqa: E402
from tunekit.core.device import fingerprint  # noqa: E402
from tunekit.core.registry import get_spec  # noqa: E402
from tunekit.runtime import dispatch  # noqa: E402
from tunekit.store.database import import_document, read_shipped, write_document  # noqa: E402
from tunekit.store.entry import MODEL_VERIFIED, Entry, TrialRecord, config_digest, demoted  # noqa: E402
from tunekit.store.key import CacheKey  # noqa: E402
from tunekit.store.store import Store  # noqa: E402

REFUSED, SERVED = "refused", "served correctly"
TOY_PROBLEM = {"rows": 8, "cols": 32, "dtype": "float32"}


def fresh_cache() -> Path:
    path = Path(tempfile.mkdtemp(prefix="tunekit-issue44-"))
    os.environ["TUNEKIT_CACHE_DIR"] = str(path)
    dispatch.reset_all()
    dispatch.shipped_entries = _real_shipped  # type: ignore[assignment]
    return path


_real_shipped = dispatch.shipped_entries


def ship(*entries: Entry) -> None:
    """`entries` as the shipped set (a database in a folder of its own)."""
    root = Path(tempfile.mkdtemp(prefix="tunekit-issue44-shipped-"))
    write_document(root / "device.json", entries)
    shipped = read_shipped(root)
    dispatch.shipped_entries = lambda: shipped  # type: ignore[assignment]


def import_file(entries: list[Entry] | None = None, doc: dict | None = None):
    path = Path(tempfile.mkdtemp()) / "db.json"
    if doc is not None:
        path.write_text(json.dumps(doc))
    else:
        write_document(path, entries or [])
    return import_document(Store(), path)


# ------------------------------------------------------------------------------------------ user kernel (item 1)


def edited_doc(block: int, extra_trials: bool = True, mark: bool = False) -> dict:
    """The store exported, then edited: `block` the best at 0.5 ms, its trial "ok"."""
    path = Path(tempfile.mkdtemp()) / "x.json"
    write_document(path, Store().entries())
    doc = json.loads(path.read_text())
    (entry,) = doc["entries"]
    fast = {**entry["best"]["config"], "BLOCK": block}
    entry["best"] = {"config": fast, "time_ms": 0.5}
    entry["trials"] = [{"config": fast, "status": "ok", "time_ms": 0.5, "error": None}] if extra_trials else []
    if mark:
        entry["provenance"][MODEL_VERIFIED] = config_digest(fast)
    return doc


def serve_user(**options) -> tuple[bool, int]:
    kernel = uk.kernel(**options)
    out, want = uk.run(kernel)
    return uk.matches(out, want), int(kernel.best_config.kwargs["BLOCK"])


def user_edited_over_local(block: int) -> str:
    fresh_cache()
    serve_user()
    result = import_file(doc=edited_doc(block))
    ok, served = serve_user()
    statuses = [t.status for t in next(iter(Store().entries())).trials if t.config["BLOCK"] == block]
    return REFUSED if ok and served == 64 and result.refused == 1 and statuses == ["wrong"] else "failure"


def user_edited_into_fresh_cache(block: int, mark: bool = False) -> str:
    fresh_cache()
    serve_user()
    doc = edited_doc(block, mark=mark)
    fresh_cache()
    import_file(doc=doc)
    ok, served = serve_user()
    again_ok, again = serve_user()
    return REFUSED if ok and again_ok and served == again == 64 else "failure"


def user_package_database(block: int) -> str:
    fresh_cache()
    serve_user()
    path = Path(tempfile.mkdtemp()) / "shipped.json"
    path.write_text(json.dumps(edited_doc(block)))
    fresh_cache()
    ok, served = serve_user(databases=[path])
    return REFUSED if ok and served == 64 else "failure"


def user_good_import_then_swapped() -> str:
    fresh_cache()
    serve_user()
    good = json.loads(json.dumps(edited_doc(64)))
    good["entries"][0]["best"]["time_ms"] = 1.0
    bad = edited_doc(16)
    fresh_cache()
    import_file(doc=good)
    ok_first, first = serve_user()
    import_file(doc=bad)  # faster, another config: imported over the checked one
    ok, served = serve_user()
    return REFUSED if ok_first and first == 64 and ok and served == 64 else "failure"


def user_reimported_after_refusal() -> str:
    fresh_cache()
    serve_user()
    doc = edited_doc(16)
    fresh_cache()
    import_file(doc=doc)
    serve_user()
    second = import_file(doc=doc)
    ok, served = serve_user()
    return REFUSED if ok and served == 64 and second.changed == 0 else "failure"


# ------------------------------------------------------------------------------------------ tunekit's kernels


def toy_layer() -> tuple[str, dict]:
    with Store() as store:
        res = dispatch.resolve(get_spec("toy"), TOY_PROBLEM, fingerprint(), store)
    return res.layer, dict(res.config)


def clean(entry: Entry) -> Entry:
    return replace(entry, trials=(TrialRecord(entry.config, "ok", entry.time_ms),))


def toy_verdict(variant: str, came_through: str) -> str:
    """After the toy's entry of `variant` came in through `came_through` (its layer): a wrong one refused (served
    from another layer, and not wrong), a correct one served from that layer."""
    layer, config = toy_layer()
    if variant == "wrong":
        return REFUSED if config.get("variant") != "wrong" and layer != came_through else "failure"
    return SERVED if layer == came_through else "failure"


def toy_imported(variant: str, forged_mark: bool = False) -> str:
    fresh_cache()
    entry = clean(toy_entry(get_spec("toy"), fingerprint(), 0.5, variant=variant))
    if forged_mark:
        entry = replace(entry, provenance={**entry.provenance, MODEL_VERIFIED: config_digest(entry.config)})
    import_file([entry])
    return toy_verdict(variant, "cache")


def toy_self_contradicting() -> str:
    fresh_cache()
    entry = toy_entry(get_spec("toy"), fingerprint(), 0.5, variant="a")
    entry = replace(entry, trials=(TrialRecord(entry.config, "wrong", error="x"),))
    import_file([entry])
    layer, _ = toy_layer()
    return REFUSED if layer != "cache" else "failure"


def toy_shipped(variant: str) -> str:
    fresh_cache()
    ship(clean(toy_entry(get_spec("toy"), fingerprint(), 1.0, variant=variant)))
    return toy_verdict(variant, "shipped")


def toy_other_triton_swapped() -> str:
    fresh_cache()
    old = replace(fingerprint(), triton_version="0.9.0")
    entry = clean(toy_entry(get_spec("toy"), old, 1.0, block=8))
    shipped = {entry.key: entry}
    dispatch.shipped_entries = lambda: shipped  # type: ignore[assignment]
    first = toy_layer()
    shipped[entry.key] = replace(entry, config={**entry.config, "variant": "wrong"})
    dispatch.reset_all()
    layer, config = toy_layer()
    ok = first[0] == "shipped" and layer != "shipped" and config.get("variant") != "wrong"
    return REFUSED if ok else "failure"


# ------------------------------------------------------------------------------------------ demotions (item 8)

GEMM_SHAPE = (24, 48, 32)


def gemm_entry(time_ms: float, which: int = 0) -> Entry:
    spec, device = get_spec("gemm"), fingerprint()
    problem = spec.problem_from_shape(GEMM_SHAPE, "float32")
    config = dict(list(spec.space.valid_configs(problem, device))[which])
    key = CacheKey.make("gemm", spec.source_hash, device.key, problem)
    return Entry(key, config, time_ms, device.to_json(), {"timer": "fake"}, (TrialRecord(config, "ok", time_ms),))


def gemm_layer() -> str:
    spec = get_spec("gemm")
    with Store() as store:
        return dispatch.resolve(spec, spec.problem_from_shape(GEMM_SHAPE, "float32"), fingerprint(), store).layer


def demotion_case(shipped: bool, then: Callable[[], None]) -> str:
    fresh_cache()
    marked = demoted(gemm_entry(1.0), "a model step ran slower with it")
    if shipped:
        ship(marked)
    else:
        Store().put(marked)
    then()
    return REFUSED if gemm_layer() == "demoted" else "failure"


def demotion_forged_by_a_losing_import() -> str:
    fresh_cache()
    Store().put(gemm_entry(0.5))
    result = import_file([demoted(gemm_entry(1.0, which=1), "another machine's model")])
    return REFUSED if gemm_layer() == "cache" and result.changed == 0 else "failure"


CASES: dict[str, Callable[[], str]] = {
    "user kernel: edited export, BLOCK 16 over local wrong record": lambda: user_edited_over_local(16),
    "user kernel: edited export, BLOCK 32 over local wrong record": lambda: user_edited_over_local(32),
    "user kernel: edited export into a fresh cache, BLOCK 16": lambda: user_edited_into_fresh_cache(16),
    "user kernel: edited export into a fresh cache, BLOCK 32": lambda: user_edited_into_fresh_cache(32),
    "user kernel: forged model_verified mark": lambda: user_edited_into_fresh_cache(16, mark=True),
    "user kernel: package database with BLOCK 16": lambda: user_package_database(16),
    "user kernel: checked import, then a faster wrong one": user_good_import_then_swapped,
    "user kernel: the refused file imported again": user_reimported_after_refusal,
    "toy: imported wrong variant": lambda: toy_imported("wrong"),
    "toy: imported wrong variant with a forged mark": lambda: toy_imported("wrong", forged_mark=True),
    "toy: imported correct entry": lambda: toy_imported("a"),
    "toy: imported entry whose own trials say wrong": toy_self_contradicting,
    "toy: shipped wrong variant": lambda: toy_shipped("wrong"),
    "toy: shipped correct entry": lambda: toy_shipped("a"),
    "toy: other Triton's entry swapped after it passed": toy_other_triton_swapped,
    "gemm: shipped demotion, then an import": lambda: demotion_case(True, lambda: import_file([gemm_entry(0.5, 1)])),
    "gemm: shipped demotion, then a new tune": lambda: demotion_case(True, lambda: Store().put(gemm_entry(0.5, 1))),
    "gemm: local demotion, then an import": lambda: demotion_case(False, lambda: import_file([gemm_entry(0.5, 1)])),
    "gemm: local demotion, then a new tune": lambda: demotion_case(False, lambda: Store().put(gemm_entry(0.5, 1))),
    "gemm: demotion forged by a losing import": demotion_forged_by_a_losing_import,
}


def main() -> int:
    registry.KERNELS["toy"] = "toy_kernel"
    counts = {REFUSED: 0, SERVED: 0, "failure": 0}
    for name, case in CASES.items():
        try:
            outcome = case()
        except Exception:
            outcome = "failure"
            traceback.print_exc()
        counts[outcome] += 1
        print(f"{outcome:>16}: {name}", flush=True)
    print(
        f"tried {len(CASES)} / refused {counts[REFUSED]} / served correctly {counts[SERVED]} / "
        f"failures {counts['failure']}"
    )
    return 1 if counts["failure"] else 0


if __name__ == "__main__":
    sys.exit(main())
