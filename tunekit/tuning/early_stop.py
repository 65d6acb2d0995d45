"""Stop a problem's search early when the performance model says nothing left can win (TuneOptions.early_stop).

The rule, with `noise` the relative timing noise (0.03: 3%):

- the model's times are in its own units (SM clocks, with the ranker's correction), so they are put on the
  measured scale with the most optimistic ratio seen, `scale = min(measured ms / modelled)` over the configs
  measured and ok (at least MIN_MEASURED of them, or the rule never stops);
- a config not measured yet can at best take `scale x its modelled time`;
- stop when the incumbent (the fastest measured) is within the noise of the best such bound:
  `incumbent <= (1 + noise) x scale x min(modelled of the rest)`: no remaining config can beat it by more than
  the noise, even if every one ran as well, relative to the model, as the best-modelled measured config did.

Where the model ranks badly, some measured config runs far better than modelled, `scale` drops and the rule
stops nothing; it only ends searches where the measurements agree with the model's order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

MIN_MEASURED = 3
STOP_REASON = "model: nothing left beats the incumbent by more than the noise"


def nothing_left_to_gain(
    measured: Sequence[tuple[float, float]],
    remaining: Iterable[float],
    noise: float,
    min_measured: int = MIN_MEASURED,
) -> bool:
    """True when the search can stop: `measured` holds (modelled, measured ms) of every ok config measured,
    `remaining` the modelled times of the configs the search could still measure (module docstring)."""
    usable = [(modelled, ms) for modelled, ms in measured if modelled > 0 and ms > 0]
    if len(usable) < max(1, min_measured):
        return False
    scale = min(ms / modelled for modelled, ms in usable)
    incumbent = min(ms for _, ms in usable)
    best_left = min((m for m in remaining if m > 0), default=None)
    if best_left is None:
        return True  # nothing left to measure
    return incumbent <= (1.0 + noise) * scale * best_left
