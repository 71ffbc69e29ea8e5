"""``udpo study PLAN --sample-size EFFECT``: the seeds per arm a follow-up study needs, from a pilot's
records, blind to the difference between its arms (docs/lab/plan_udpo_pilot.md).

Each trained arm's per-seed change of a metric over Standard MAD (the seed's mean over the test questions
of after - before) gives the pooled within-arm standard deviation (:func:`udpo.study.power.pooled_sd`);
the rule returns it and the seeds per arm of :func:`udpo.study.power.seeds_per_arm`, and never an
arm's mean or the difference between arms.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from udpo.analysis.results import question_metrics
from udpo.study.plan import CompareConfig
from udpo.study.power import pooled_sd, seeds_per_arm
from udpo.study.tables import evaluated, load_records


@dataclass(frozen=True)
class SampleSize:
    """metric; the trained arms and the seeds pooled; the pooled sd of the per-seed change; the effect to
    detect, the test's level and power, and the seeds per arm they need."""

    metric: str
    arms: list[str]
    seeds: list[int]
    pooled_sd: float
    effect: float
    level: float
    power: float
    seeds_per_arm: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def blind_sample_size(
    config: CompareConfig,
    effect: float,
    metric: str = "accuracy",
    level: float = 0.95,
    power: float = 0.8,
    grader: str = "recorded",
) -> SampleSize:
    """The sample-size rule on the recorded runs of ``config`` (the seeds whose every run is recorded),
    their debates graded by ``grader`` (:data:`udpo.study.regrade.GRADERS`)."""
    seeds, arms = arm_changes(config, metric, grader)
    sd = pooled_sd(list(arms.values()))
    return SampleSize(
        metric, list(arms), seeds, sd, effect, level, power, seeds_per_arm(sd, effect, level, power)
    )


def arm_changes(
    config: CompareConfig, metric: str, grader: str = "recorded"
) -> tuple[list[int], dict[str, list[float]]]:
    """The seeds whose every run is recorded, and per trained arm each seed's mean change of ``metric`` over
    Standard MAD (debates graded by ``grader``): what the rule pools (never compared between arms)."""
    records, seeds, missing = load_records(config, grader)
    if len(seeds) < 2:
        raise ValueError(
            f"the rule needs 2 or more seeds with every run recorded; missing: {', '.join(missing)}"
        )
    runs = evaluated(config, records, seeds)
    before = [question_metrics(records[(config.trained()[0], s)].evaluation(0)) for s in seeds]
    return seeds, {
        method: [
            float(np.mean([q[metric] - b[qid][metric] for qid, q in question_metrics(debates).items()]))
            for b, (_, debates) in zip(before, runs[method], strict=True)
        ]
        for method in config.trained()
    }


def second_stage(config: CompareConfig, grader: str = "recorded") -> tuple[int, str]:
    """The plan's ``second_stage`` rule on its recorded runs, blind to the arms: the seeds per arm for a
    difference of ``effect`` if that is at most ``most_seeds``; else for ``fallback_effect``, at most
    ``most_seeds``. Returns the seeds per arm (never fewer than the recorded ones) and the line to commit
    (which says so when the debates were re-graded: ``grader`` ``current``)."""
    rule = config.second_stage
    if rule is None:
        raise ValueError("the plan sets no second_stage rule")
    seeds, arms = arm_changes(config, "accuracy", grader)
    sd = pooled_sd(list(arms.values()))
    first, most = seeds_per_arm(sd, rule["effect"]), int(rule["most_seeds"])
    if first <= most:
        n, why = first, f"{rule['effect']:g} needs {first} <= {most}"
    else:
        fallback = seeds_per_arm(sd, rule["fallback_effect"])
        n = min(fallback, most)
        why = f"{rule['effect']:g} needs {first} > {most}; {rule['fallback_effect']:g} needs {fallback}" + (
            f", capped at {most}" if fallback > most else ""
        )
    n = max(n, len(seeds))
    line = (
        f"second stage: {n} seeds per arm ({why}); pooled within-arm sd of the per-seed accuracy change "
        f"{sd:.4f} over seeds {seeds} of {', '.join(arms)}"
        + ("; every debate re-graded by the current grader and vote" if grader == "current" else "")
    )
    return n, line
