"""What has been measured for one problem, by config identity: the source of 'never twice'."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import optuna

from tunekit.core.space import Config, config_id
from tunekit.store.entry import TrialRecord

if TYPE_CHECKING:
    pass


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
