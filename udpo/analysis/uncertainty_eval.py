"""Scores of uncertainty-estimation runs (DiverseAgentEntropy, self-consistency): AUROC and abstention.

For a run's trajectories (``meta["entropy"]`` the method's uncertainty in nats, ``meta["abstain"]`` its
abstention decision per policy, ``correct`` whether its top answer is right):

- ``auroc``: how well the entropy separates wrong answers (positives) from right ones
  (:func:`udpo.rewards.statistics.auroc`; nan when all are right or all wrong);
- per abstention policy (strict and loose thresholds, and SC(3/5) for self-consistency; ``none``
  answers everything): accuracy on answered questions, abstention rate, correctness and truthfulness
  (:func:`udpo.rewards.statistics.abstention_scores`);
- mean entropy, and for DiverseAgentEntropy the mean number of interaction rounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from udpo.env.trajectory import Trajectory
from udpo.rewards.statistics import abstention_scores, auroc


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def summarize_uncertainty(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """AUROC, per-policy abstention scores and means of a run (see the module docstring)."""
    if not trajectories:
        return {"n_items": 0, "auroc": None, "policies": {}}
    for t in trajectories:
        if "entropy" not in t.meta or "abstain" not in t.meta:
            raise ValueError(
                f"item {t.question_id!r} has no entropy/abstain in its meta: not a `udpo uncertainty` run"
            )
    correct = np.array([t.correct for t in trajectories], dtype=bool)
    entropy = np.array([t.meta["entropy"] for t in trajectories], dtype=float)
    decisions = {"none": np.zeros(len(correct), dtype=bool)}
    for name in trajectories[0].meta["abstain"]:
        decisions[name] = np.array([bool(t.meta["abstain"][name]) for t in trajectories])
    policies = {
        name: {k: _finite(v) for k, v in abstention_scores(correct, abstained).to_dict().items()}
        for name, abstained in decisions.items()
    }
    return {
        "n_items": len(trajectories),
        "method": trajectories[0].meta.get("method"),
        "auroc": _finite(auroc(entropy, ~correct)),
        "mean_entropy": float(entropy.mean()),
        "mean_rounds": float(np.mean([t.meta.get("rounds_run", 0) for t in trajectories])),
        "policies": policies,
    }


def format_table(summary: dict[str, Any]) -> str:
    """A plain-text table of one run's policies."""

    def cell(x: float | None) -> str:
        return f"{x:>12.3f}" if x is not None else f"{'n/a':>12}"

    keys = ("accuracy", "abstention_rate", "correctness", "truthfulness")
    lines = [f"{'policy':<12} " + " ".join(f"{k:>12}" for k in keys)]
    for name, s in summary["policies"].items():
        lines.append(f"{name:<12} " + " ".join(cell(s[k]) for k in keys))
    lines.append(f"AUROC (entropy vs wrong answers): {cell(summary['auroc']).strip()}")
    return "\n".join(lines)
