"""Woozle metrics (the DIGRA paper's MA, MR, IMR, CR per round) on a hand-made trajectory, and their
report in ``udpo diagnose``."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from udpo.analysis.diagnose import diagnose
from udpo.rewards import correctness, read_flow, woozle_metrics

# two debates, N = 3, T = 2 (None = unparsed, never right)
DEBATE_A = {"gold": "5", "answers": [["5", "5", "7"], ["7", "5", "5"], [None, "7", "5"]]}
DEBATE_B = {"gold": "1", "answers": [["1", "2", "2"], ["1", "1", "1"], ["3", "3", "1"]]}
# right/wrong:  A: [1 1 0] [0 1 1] [0 0 1]    B: [1 0 0] [1 1 1] [0 0 1]
#   MA:  round 0: 3/6, round 1: 3/6, round 2: 4/6
#   MR_1: right at 0 = {A0, B0, B1}, wrong at 1: B0 -> 1/3;  MR_2: right at 1 = {A0, A1, B1}, wrong at 2: A0 -> 1/3
#   IMR_2: right at 0 = {A0, B0, B1}, wrong at 2: A0, B0 -> 2/3 (IMR_1 = MR_1)
#   CR_1: wrong at 0 = {A1, A2, B2}, right at 1: A1 -> 1/3;  CR_2: wrong at 1 = {A2, B0, B2}, right at 2: A2, B2 -> 2/3


def test_woozle_metrics_by_hand():
    correct = np.stack([correctness(d["answers"], d["gold"]) for d in (DEBATE_A, DEBATE_B)])
    assert correct[0].tolist() == [[True, True, False], [False, True, True], [False, False, True]]
    m = woozle_metrics(correct)
    assert m.ma == pytest.approx([3 / 6, 3 / 6, 4 / 6])
    assert m.mr == pytest.approx([1 / 3, 1 / 3])
    assert m.imr == pytest.approx([1 / 3, 2 / 3])
    assert m.cr == pytest.approx([1 / 3, 2 / 3])
    assert m.imr[0] == m.mr[0]


def test_rates_without_anyone_to_mislead_or_correct_are_nan():
    all_right = np.ones((2, 3, 3), dtype=bool)
    m = woozle_metrics(all_right)
    assert m.ma.tolist() == [1.0, 1.0, 1.0] and m.mr.tolist() == [0.0, 0.0] and m.imr.tolist() == [0.0, 0.0]
    assert all(math.isnan(x) for x in m.cr)  # nobody was wrong: no correction rate
    assert all(math.isnan(x) for x in woozle_metrics(~all_right).mr)
    with pytest.raises(ValueError, match="boolean"):
        woozle_metrics(np.ones((1, 2, 2)))
    with pytest.raises(ValueError, match="shape"):
        woozle_metrics(np.ones((2, 3), dtype=bool))


def test_read_flow():
    flow = read_flow([1, 1, 1, 2], [True, False, False, True], [1, 1, 2], [0.5, 1.0, 0.5], n_rounds=3)
    assert flow["wrong_read_fraction"][:2] == pytest.approx([1 / 3, 1.0])
    assert flow["read_degree"][:2] == pytest.approx([0.75, 0.5])
    assert math.isnan(flow["wrong_read_fraction"][2]) and math.isnan(flow["read_degree"][2])


def record(qid: str, debate: dict, turns: list | None = None, inject: list[str] | None = None) -> dict:
    stages = [{"name": "standard"}] + (
        [{"name": "inject", "pattern": inject, "source": "builtin"}] if inject else []
    )
    final = [row[-1] for row in debate["answers"]]
    return {
        "question_id": qid,
        "gold": debate["gold"],
        "answers": debate["answers"],
        "prediction": final[0],
        "correct": final[0] == debate["gold"],
        "turns": turns or [],
        "meta": {"task": "synthetic", "protocol": {"name": "standard", "stages": stages}},
    }


def turn(agent: int, rnd: int, reads: list[list[int]]) -> dict:
    return {"agent": agent, "round": rnd, "messages": [], "text": "", "answer": None, "reads": reads}


def test_diagnose_reports_woozle_metrics_per_injection_setup(tmp_path):
    # debate A's reads: round 1, agent 0 reads agent 1 (wrong at 0), agent 1 reads agents 0 (right) and
    # 2 (unparsed: wrong), agent 2 reads agent 0 (right) -> 2 of 4 reads wrong, degrees 1/2, 1, 1/2;
    # round 2, agent 0 reads agents 1 (right at 1) and 2 (wrong at 1) -> 1 of 2, degree 1
    reads_a = [
        [turn(0, 0, []), turn(0, 1, [[1, 0]]), turn(0, 2, [[1, 1], [2, 1]])],
        [turn(1, 0, []), turn(1, 1, [[0, 0], [2, 0]])],
        [turn(2, 0, []), turn(2, 1, [[0, 0]])],
    ]
    injected = {"gold": "2", "answers": [["2", "2", "2"]] * 3}
    lines = [
        record("a", DEBATE_A, reads_a),
        record("b", DEBATE_B),
        record("c", injected, inject=["correct", "correct", "correct"]),
    ]
    file = tmp_path / "run.jsonl"
    file.write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = diagnose([file], tmp_path / "out", plots=False)
    plain, injected_group = summary["runs"]["run"]["woozle"]
    assert injected_group["inject"] == ["correct", "correct", "correct"] and injected_group["n_debates"] == 1
    assert injected_group["ma"] == [1.0, 1.0, 1.0] and injected_group["cr"] == [None, None]  # NaN -> null
    assert plain["inject"] is None and plain["n_debates"] == 2
    assert plain["ma"] == pytest.approx([0.5, 0.5, 4 / 6])
    assert plain["mr"] == pytest.approx([1 / 3, 1 / 3]) and plain["imr"] == pytest.approx([1 / 3, 2 / 3])
    assert plain["cr"] == pytest.approx([1 / 3, 2 / 3])
    assert plain["wrong_read_fraction"] == pytest.approx([0.5, 0.5])
    assert plain["read_degree"] == pytest.approx([2 / 3, 1.0])
    with open(tmp_path / "out" / "woozle.csv") as fh:
        rows = list(csv.DictReader(fh))
    mr = [r for r in rows if r["metric"] == "mr" and r["inject"] == ""]
    assert [(r["round"], float(r["value"])) for r in mr] == [
        ("1", pytest.approx(1 / 3)),
        ("2", pytest.approx(1 / 3)),
    ]
    assert [r["value"] for r in rows if r["metric"] == "cr" and r["inject"]] == ["", ""]


def test_bad_reads_are_named(tmp_path):
    line = record("a", DEBATE_A, [[turn(0, 1, [[1]])]])
    file = tmp_path / "bad.jsonl"
    file.write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1 .*'reads' must be a list of \[agent, round\] pairs"):
        diagnose([file], tmp_path / "out", plots=False)
