"""What has been measured for one problem, by config identity: the source of 'never twice'."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna

from tunekit.core.space import Config, config_id
from tunekit.store.entry import TrialRecord

TUNEKIT_ATTR = "tunekit"


class Candidates:
    """What has been measured for this problem, by config identity; the source of 'never twice'."""

    def __init__(self, records: list[TrialRecord]) -> None:
        self.by_id: dict[Any, TrialRecord] = {config_id(r.config): r for r in records}

    def __contains__(self, config: Config) -> bool:
        return config_id(config) in self.by_id

    def get(self, config: Config) -> TrialRecord:
        return self.by_id[config_id(config)]

    def add(self, record: TrialRecord) -> None:
        self.by_id[config_id(record.config)] = record

    def ok(self) -> list[TrialRecord]:
        return sorted((r for r in self.by_id.values() if r.status == "ok"), key=lambda r: r.time_ms or 0.0)


def records_from_study(study: optuna.Study) -> list[TrialRecord]:
    records = []
    for trial in study.get_trials(deepcopy=False):
        data = trial.user_attrs.get(TUNEKIT_ATTR)
        if data is not None:
            records.append(TrialRecord.from_json(data))
    return records


def confirm_best(seen: Candidates, top: int, retime: Callable[[Config], TrialRecord]) -> TrialRecord | None:
    """Re-measure the few fastest before declaring a winner: one lucky sample must not win.

    A contender that fails when measured again is recorded as failed and the next fastest takes its place.
    """
    ok = seen.ok()
    if not ok:
        return None
    if len(ok) == 1 or top <= 1:
        return ok[0]
    timed: list[tuple[float, TrialRecord]] = []
    for record in ok:
        if len(timed) >= top:
            break
        again = retime(record.config)
        if again.status != "ok" or again.time_ms is None:
            seen.add(TrialRecord(record.config, "failed", error=f"failed when measured again: {again.error}"))
            continue
        timed.append((min(again.time_ms, record.time_ms or again.time_ms), record))
    if not timed:
        return None
    best_time, best = min(timed, key=lambda t: t[0])
    return TrialRecord(best.config, "ok", time_ms=best_time)
