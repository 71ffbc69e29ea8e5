"""The consensus-on-wrong guard (issue 24): the share of debates ending with a strict majority, or every
agent, on a wrong answer, on hand-computed debates, and where it is reported (evaluation summaries,
per-question results for ``udpo compare``, the attack table of ``udpo eval``, ``udpo report``)."""

from __future__ import annotations

import pytest

from udpo.analysis.attack_eval import format_table
from udpo.analysis.report.overview import COMPARE_METRICS, sets_table
from udpo.analysis.results import PER_QUESTION_METRICS
from udpo.env.summary import summarize
from udpo.env.trajectory import Trajectory
from udpo.rewards import wrong_consensus
from udpo.study.tables import TABLE_METRICS


@pytest.mark.parametrize(
    ("answers", "correct", "majority", "unanimous"),
    [
        ([["1", "5"], ["2", "5"], ["5", "5"]], False, 1.0, 1.0),  # all end on the wrong 5
        ([["4", "4"], ["4", "4"], ["4", "4"]], True, 0.0, 0.0),  # all right
        ([["4", "5"], ["5", "5"], ["4", "4"]], False, 1.0, 0.0),  # 2-1 for the wrong 5
        ([["4", "4"], ["4", "4"], ["5", "5"]], True, 0.0, 0.0),  # 2-1 for the right 4
        ([["1", "1"], ["2", "2"], ["3", "3"]], False, 0.0, 0.0),  # split: no majority
        ([["5", "5"], ["5", "5"], [None, None]], False, 1.0, 0.0),  # 2 of 3 on 5, one unparsed
        ([[None], [None], [None]], False, 0.0, 0.0),  # nothing parsed: no consensus at all
        ([["5"], ["5"], ["4"], ["4"]], False, 0.0, 0.0),  # 2-2 of 4 is no strict majority
        ([["5"], ["5"], ["5"], ["4"]], False, 1.0, 0.0),  # 3 of 4
    ],
)
def test_wrong_consensus_by_hand(answers, correct, majority, unanimous):
    guard = wrong_consensus(answers, correct)
    assert (guard.majority, guard.unanimous) == (majority, unanimous)


def debate(qid: str, answers, correct: bool) -> Trajectory:
    return Trajectory(qid, "q", "4", answers, answers[0][-1], correct)


DEBATES = [
    debate("a", [["5"], ["5"], ["5"]], False),  # unanimous and majority on a wrong answer
    debate("b", [["5"], ["5"], ["4"]], False),  # majority only
    debate("c", [["4"], ["4"], ["4"]], True),
    debate("d", [["1"], ["2"], ["3"]], False),
]


def test_summaries_and_per_question_metrics_report_the_guard():
    summary = summarize(DEBATES)
    assert summary["wrong_majority"] == pytest.approx(0.5)
    assert summary["wrong_unanimous"] == pytest.approx(0.25)
    assert summarize([])["wrong_majority"] is None
    assert [PER_QUESTION_METRICS["wrong_majority"](t) for t in DEBATES] == [1.0, 1.0, 0.0, 0.0]
    assert [PER_QUESTION_METRICS["wrong_unanimous"](t) for t in DEBATES] == [1.0, 0.0, 0.0, 0.0]
    # the unparsed rate beside the guard: abstaining agents lower wrong_majority without being right
    assert {"wrong_majority", "wrong_unanimous", "unparsed_rate"} <= set(TABLE_METRICS) & set(COMPARE_METRICS)


def test_eval_table_and_report_show_the_guard(tmp_path):
    row = {"m": 0, "compromised": [], "n_questions": 4, **summarize(DEBATES)}
    text = format_table({"rows": [row]})
    assert "wrong maj %" in text.splitlines()[0] and "50.0" in text and "25.0" in text
    from udpo.analysis.report.load import load_set
    from udpo.env.trajectory import TrajectoryWriter

    with TrajectoryWriter(tmp_path / "t.jsonl") as writer:
        writer.write(DEBATES)
    s = load_set(tmp_path / "t.jsonl", "eval")
    assert (s.stats["wrong_majority"], s.stats["wrong_unanimous"]) == (0.5, 0.25)
    html = sets_table([s])
    assert "wrong majority" in html and "0.500" in html and "0.250" in html
