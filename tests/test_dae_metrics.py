"""DiverseAgentEntropy weights, entropy and thresholds, self-consistency, AUROC and abstention scores,
against hand computations."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

from udpo.env.trajectory import Trajectory
from udpo.rewards.diverse_agent_entropy import (
    LOOSE_THRESHOLD,
    STRICT_THRESHOLD,
    abstains,
    agent_weights,
    answer_changes,
    answer_distribution,
    dae_calibration_reward,
    dae_certainty_reward,
    diverse_agent_entropy,
    entropy,
    make_dae_reward,
    self_consistency,
)
from udpo.rewards.statistics import abstention_scores, auroc


def test_thresholds_are_the_entropies_of_the_papers_splits():
    assert math.isclose(STRICT_THRESHOLD, -(0.6 * math.log(0.6) + 0.4 * math.log(0.4)))
    assert math.isclose(LOOSE_THRESHOLD, -(0.6 * math.log(0.6) + 2 * 0.2 * math.log(0.2)))
    assert round(STRICT_THRESHOLD, 6) == 0.673012 and round(LOOSE_THRESHOLD, 6) == 0.950271


def test_weights_follow_the_formula():
    # R = 3 rounds; agents changed 0, 1, 3, 0, 2 times: numerators 4, 3, 1, 4, 2 over 14
    assert agent_weights([0, 1, 3, 0, 2], 3) == pytest.approx((4 / 14, 3 / 14, 1 / 14, 4 / 14, 2 / 14))
    assert agent_weights([0, 0, 0], 0) == pytest.approx((1 / 3,) * 3)  # no interaction: equal weights
    assert sum(agent_weights([1, 2, 2, 0, 1], 2)) == pytest.approx(1.0)


def test_changes_are_counted_from_the_answer_matrix():
    matrix = [["A", "B", "B", "A"], ["A", "A", "A", "A"], [None, "A", None, None]]
    assert answer_changes(matrix) == (2, 0, 3)  # None -> None is a change too (the silence rule)


def test_a_three_two_split_of_five_stable_agents_sits_at_the_strict_threshold():
    """Five agents that never changed, final answers 3 x A and 2 x B: H = H(0.6, 0.4) exactly, so the
    strict policy still answers (it abstains only above the threshold)."""
    score = diverse_agent_entropy([["A"], ["B"], ["A"], ["B"], ["A"]])
    assert [p for _, p in score.distribution] == [0.6, 0.4]
    assert score.entropy == STRICT_THRESHOLD  # bit-identical, whatever the agents' order
    assert not abstains(score.entropy, STRICT_THRESHOLD)
    assert not score.abstains(STRICT_THRESHOLD) and score.prediction == "A"
    # the same split after two rounds in which nobody moved
    assert diverse_agent_entropy([["B", "B", "B"]] * 2 + [["A", "A", "A"]] * 3).entropy == STRICT_THRESHOLD


def test_splits_around_the_thresholds():
    loose_split = diverse_agent_entropy([["A"], ["A"], ["A"], ["B"], ["C"]])  # 3/1/1
    assert loose_split.entropy == pytest.approx(LOOSE_THRESHOLD)
    assert loose_split.abstains(STRICT_THRESHOLD) and not loose_split.abstains(LOOSE_THRESHOLD)
    two_two_one = diverse_agent_entropy([["A"], ["A"], ["B"], ["B"], ["C"]])
    assert two_two_one.entropy == pytest.approx(-(2 * 0.4 * math.log(0.4) + 0.2 * math.log(0.2)))  # 1.0549
    assert two_two_one.abstains(STRICT_THRESHOLD) and two_two_one.abstains(LOOSE_THRESHOLD)
    unanimous = diverse_agent_entropy([["B", "A"]] * 5)
    assert unanimous.entropy == 0.0 and unanimous.normalized == 0.0 and not unanimous.abstains()


def test_weighted_entropy_by_hand():
    """R = 2. Agents 0-2 end on A having changed 0, 1, 2 times (weights 3, 2, 1); agents 3-4 end on B
    having changed 0 times (weights 3, 3). Total 12: p(A) = 6/12, p(B) = 6/12, H = ln 2."""
    matrix = [
        ["A", "A", "A"],
        ["B", "A", "A"],
        ["A", "B", "A"],
        ["B", "B", "B"],
        ["B", "B", "B"],
    ]
    score = diverse_agent_entropy(matrix)
    assert score.changes == (0, 1, 2, 0, 0) and score.rounds == 2
    assert score.weights == pytest.approx((3 / 12, 2 / 12, 1 / 12, 3 / 12, 3 / 12))
    assert dict(score.distribution) == {"A": 0.5, "B": 0.5}
    assert score.entropy == pytest.approx(math.log(2))
    assert score.normalized == pytest.approx(math.log(2) / math.log(5))
    # a tie: the vote's tie-break picks, whichever agents gave the answers (key "": B, key "q1": A)
    assert hashlib.sha256(b"\nB").hexdigest() < hashlib.sha256(b"\nA").hexdigest()
    assert hashlib.sha256(b"q1\nA").hexdigest() < hashlib.sha256(b"q1\nB").hexdigest()
    assert score.prediction == "B"
    assert diverse_agent_entropy(matrix, key="q1").prediction == "A"
    assert diverse_agent_entropy(matrix[::-1], key="q1").prediction == "A"
    # without the weights it would be a 3/2 split for A
    assert entropy([0.6, 0.4]) < score.entropy


def test_rounds_run_can_be_fewer_than_the_matrix_columns():
    """A debate that stopped after 1 round and carried its answers forward: R = 1, not 3."""
    matrix = [["A", "B", "B", "B"], ["B", "B", "B", "B"], ["C", "C", "C", "C"]]
    score = diverse_agent_entropy(matrix, rounds=1)
    assert score.weights == pytest.approx((1 / 5, 2 / 5, 2 / 5))
    assert dict(score.distribution) == pytest.approx({"B": 0.6, "C": 0.4})
    with pytest.raises(ValueError, match=r"changed its answer 1 times, which must lie in \[0, R = 0\]"):
        diverse_agent_entropy(matrix, rounds=0)


def test_each_none_is_a_class_of_its_own_and_never_the_prediction():
    score = diverse_agent_entropy([[None], [None], [None], ["A"], ["B"]])
    assert [y for y, _ in score.distribution] == [None, None, None, "A", "B"]
    assert [p for _, p in score.distribution] == pytest.approx([0.2] * 5)
    assert score.normalized == pytest.approx(1.0) and score.prediction == "B"  # the tie's smaller digest
    nothing = diverse_agent_entropy([[None], [None]])
    assert nothing.entropy == pytest.approx(math.log(2)) and nothing.prediction is None
    assert nothing.abstains(LOOSE_THRESHOLD)
    assert answer_distribution(["x", None, "x", None]) == (("x", 0.5), (None, 0.25), (None, 0.25))


def test_distribution_and_entropy_validation():
    assert answer_distribution(["x", "y", "x"]) == (("x", 2 / 3), ("y", 1 / 3))
    with pytest.raises(ValueError, match="sum to 1"):
        entropy([0.5, 0.2])
    with pytest.raises(ValueError, match="rounds R"):
        agent_weights([0], -1)
    with pytest.raises(ValueError, match="2 final answers but 1 change counts"):
        answer_distribution(["a", "b"], [0], 0)


def test_self_consistency_and_sc_three_of_five():
    sc = self_consistency(["A", "A", "B", "A", None])
    assert sc.prediction == "A" and sc.votes == 3 and not sc.abstain_majority
    assert sc.entropy == pytest.approx(-(0.6 * math.log(0.6) + 2 * 0.2 * math.log(0.2)))
    split = self_consistency(["A", "A", "B", "B", "C"])
    assert split.prediction == "B" and split.votes == 2 and split.abstain_majority  # the smaller digest
    assert self_consistency(["A", "A", "B", "B", "C"], key="q1").prediction == "A"
    silent = self_consistency([None] * 5)
    assert silent.abstain_majority and silent.normalized == pytest.approx(1.0)


def test_auroc_against_a_hand_computation():
    # uncertainty of 6 answers, wrong ones are the positives: wrong = {0.9, 0.6, 0.4}, right = {0.5, 0.4, 0.1}
    scores = [0.9, 0.5, 0.6, 0.4, 0.4, 0.1]
    wrong = [True, False, True, False, True, False]
    # pairs (wrong > right): 0.9 beats 3; 0.6 beats 3; 0.4 beats 0.1, ties 0.4 (half), loses to 0.5 -> 1.5
    assert auroc(scores, wrong) == pytest.approx((3 + 3 + 1.5) / 9)
    assert auroc([0.1, 0.9], [False, True]) == 1.0
    assert auroc([0.3, 0.3], [False, True]) == 0.5
    assert math.isnan(auroc([0.3, 0.4], [True, True]))


def test_abstention_scores_by_hand():
    correct = [True, True, False, False, True]
    abstained = [False, True, True, False, False]
    s = abstention_scores(correct, abstained)
    assert s.n_answered == 3
    assert s.accuracy == pytest.approx(2 / 3)  # answered: right, wrong, right
    assert s.abstention_rate == pytest.approx(0.4)
    assert s.correctness == pytest.approx(0.4)  # 2 of 5 answered and right
    assert s.truthfulness == pytest.approx(0.8)  # those 2 plus the 2 abstentions
    assert math.isnan(abstention_scores([True], [True]).accuracy)


def _traj(answers, correct=True, rounds_run=None) -> Trajectory:
    meta = {} if rounds_run is None else {"rounds_run": rounds_run}
    return Trajectory("q", "?", "A", answers, "A", correct, meta=meta)


def test_reward_hooks_take_a_trajectory_and_an_agent():
    split = _traj([["A"], ["A"], ["A"], ["B"], ["B"]])
    h = STRICT_THRESHOLD / math.log(5)
    assert dae_certainty_reward(split, 0) == pytest.approx(1 - h)
    assert dae_certainty_reward(split, 4) == dae_certainty_reward(split, 0)  # a trajectory-level term
    assert dae_calibration_reward(split, 0) == pytest.approx(1 - h)
    wrong = _traj([["A"], ["A"], ["A"], ["B"], ["B"]], correct=False)
    assert dae_calibration_reward(wrong, 0) == pytest.approx(h)
    # the JSON dict of a trajectory works too, with R from meta["rounds_run"]
    record = _traj([["A", "B", "B", "B"], ["B", "B", "B", "B"], ["C", "C", "C", "C"]], rounds_run=1).to_dict()
    expected = 1 - entropy([0.6, 0.4]) / math.log(3)
    assert dae_certainty_reward(record, 1) == pytest.approx(expected)
    assert make_dae_reward("certainty").__name__ == "dae_certainty_reward"
    with pytest.raises(ValueError, match="unknown DAE reward mode"):
        make_dae_reward("entropy")
    values = [dae_certainty_reward(_traj([[a] for a in f]), 0) for f in ("AAAAA", "AAABB", "ABCDE")]
    assert values[0] == 1.0 and values[2] == pytest.approx(0.0) and 0 < values[1] < 1
    assert np.all(np.diff(values) < 0)
