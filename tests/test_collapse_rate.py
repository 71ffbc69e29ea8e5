"""Collapse rate: the share of agents whose answers an evaluation could mostly not parse."""

from __future__ import annotations

import pytest

from udpo.env.summary import summarize
from udpo.env.trajectory import Trajectory
from udpo.rewards import agent_unparsed_rates, collapse_rate


def test_collapse_rate_counts_agents_mostly_silent_over_the_evaluation():
    # agent 0 always answers, agent 1 is silent in 3 of 4 turns, agent 2 in exactly half (not above 0.5)
    debates = [
        [["4", "4"], [None, None], [None, "4"]],
        [["5", "4"], [None, "4"], ["4", None]],
    ]
    assert agent_unparsed_rates(debates).tolist() == [0.0, 0.75, 0.5]
    assert collapse_rate(debates) == pytest.approx(1 / 3)
    assert collapse_rate(debates, threshold=0.4) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="same number of agents"):
        collapse_rate([[["4"]], [["4"], ["4"]]])


def test_an_evaluation_summary_reports_the_collapse_rate():
    debates = [Trajectory(f"q{k}", "?", "4", [["4"], [None]], "4", True) for k in range(3)]
    assert summarize(debates)["collapse_rate"] == pytest.approx(0.5)
