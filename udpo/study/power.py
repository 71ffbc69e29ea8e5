"""How many training seeds a study needs, from a pilot's run-to-run variance, blind to the difference
between its arms (docs/lab/plan_udpo_pilot.md).

- :func:`pooled_sd`: the standard deviation of per-seed values around their own arm's mean, pooled over
  arms, ``sqrt(sum_arms sum_seeds (x - mean_arm)^2 / (n - arms))``. It reads every arm's mean and returns
  none of them: a rule built on it cannot be steered by the difference it will test.
- :func:`seeds_per_arm`: the smallest number of seeds per arm at which a two-sided two-sample t-test at
  ``level`` detects a true difference ``effect`` with probability ``power`` (the noncentral t), given the
  pooled sd.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def pooled_sd(arms: Sequence[Sequence[float]]) -> float:
    """Pooled within-arm standard deviation of per-seed values (each arm needs 2 or more)."""
    if len(arms) < 1 or any(len(a) < 2 for a in arms):
        raise ValueError(f"every arm needs at least 2 seeds, got {[len(a) for a in arms]}")
    values = [np.asarray(a, dtype=float) for a in arms]
    if not all(np.isfinite(v).all() for v in values):
        raise ValueError("per-seed values must be finite numbers")
    squares = sum(float(((v - v.mean()) ** 2).sum()) for v in values)
    return math.sqrt(squares / (sum(len(v) for v in values) - len(values)))


def seeds_per_arm(
    sd: float, effect: float, level: float = 0.95, power: float = 0.8, most: int = 10_000
) -> int:
    """Seeds per arm (at least 2) for a two-sided two-sample t-test at ``level`` to find a difference of
    ``effect`` between arms with probability ``power``, when each seed's value has standard deviation
    ``sd``; ValueError when not even ``most`` seeds would do."""
    from scipy import stats

    if not (sd > 0 and math.isfinite(sd)) or not (effect > 0 and math.isfinite(effect)):
        raise ValueError(f"sd and effect must be finite numbers > 0, got {sd} and {effect}")
    if not (0 < level < 1 and 0 < power < 1):
        raise ValueError(f"level and power must be in (0, 1), got {level} and {power}")
    for n in range(2, most + 1):
        df = 2 * n - 2
        critical = stats.t.ppf((1 + level) / 2, df)
        shift = effect / (sd * math.sqrt(2 / n))
        achieved = stats.nct.sf(critical, df, shift) + stats.nct.cdf(-critical, df, shift)
        if achieved >= power:
            return n
    raise ValueError(f"more than {most} seeds per arm would be needed (sd {sd}, effect {effect})")
