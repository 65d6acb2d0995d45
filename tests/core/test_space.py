from __future__ import annotations

import optuna
import pytest

from tunekit.core.device import fingerprint
from tunekit.core.errors import InvalidConfigError
from tunekit.core.space import Choice, PowerOfTwo, Rule, SearchSpace, config_id

SPACE = SearchSpace(
    params=(PowerOfTwo("BLOCK", 16, 256), Choice("variant", ("single", "looped")), Choice("flag", (True, False))),
    rules=(
        Rule("single_fits", lambda c, p, d: c["variant"] != "single" or c["BLOCK"] >= p["cols"]),
        Rule("looped_needs_wide_rows", lambda c, p, d: c["variant"] != "looped" or c["BLOCK"] < p["cols"]),
    ),
)


def test_power_of_two_values_and_encoding():
    p = PowerOfTwo("BLOCK", 16, 256)
    assert p.values == (16, 32, 64, 128, 256)
    assert p.encode(64) == {"log2_BLOCK": 6}


@pytest.mark.parametrize("low, high", [(3, 16), (16, 8), (0, 4)])
def test_power_of_two_rejects_bad_bounds(low, high):
    with pytest.raises(ValueError):
        PowerOfTwo("X", low, high)


def test_size_and_enumeration():
    assert SPACE.size == 5 * 2 * 2 == len(list(SPACE.all_configs()))


def test_constraints_are_pure_predicates_used_by_enumeration():
    device = fingerprint()
    valid = SPACE.valid_configs({"cols": 100}, device)
    assert {(c["variant"], c["BLOCK"]) for c in valid} == {
        ("looped", 16),
        ("looped", 32),
        ("looped", 64),
        ("single", 128),
        ("single", 256),
    }
    assert SPACE.violations({"BLOCK": 16, "variant": "single", "flag": True}, {"cols": 100}, device) == ["single_fits"]


def test_membership_check_names_the_bad_value():
    assert SPACE.check_membership({"BLOCK": 32, "variant": "looped", "flag": False})
    with pytest.raises(InvalidConfigError, match=r"'BLOCK' must be one of \[16, 32, 64, 128, 256\], but got 48"):
        SPACE.check_membership({"BLOCK": 48, "variant": "looped", "flag": False})
    with pytest.raises(InvalidConfigError, match="'flag' must be one of"):
        SPACE.check_membership({"BLOCK": 32, "variant": "looped", "flag": 1})  # 1 is not True
    with pytest.raises(InvalidConfigError, match="exactly"):
        SPACE.check_membership({"BLOCK": 32})


def test_suggest_round_trips_through_optuna_encoding():
    study = optuna.create_study()
    config = {"BLOCK": 128, "variant": "single", "flag": False}
    study.enqueue_trial(SPACE.encode(config))
    assert SPACE.suggest(study.ask()) == config


def test_config_id_is_order_independent():
    assert config_id({"a": 1, "b": 2}) == config_id({"b": 2, "a": 1})
