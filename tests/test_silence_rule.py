"""The silence rule (SPEC section 1, issue 39): an unparsed answer (None) differs from every answer, another
None included, in every uncertainty metric, reward and calibration statistic; the vote still abstains.

Hand cases at agent 0's calibrated coefficients of the study in issue 39 (alpha .822, beta .843,
gamma .337, lambda .511), N = 3, T = 2, trajectory scope, gold "g".
"""

from __future__ import annotations

import numpy as np
import pytest
from reference_metrics import rewards as reference_rewards
from reference_metrics import uncertainty as reference_uncertainty

from udpo.rewards import NONE_CODE, agent_rewards, batch_uncertainty, debate_metrics, rewards, uncertainty
from udpo.rewards.coding import answer_classes, unparsed_apart

AGENT_0 = {"alpha": 0.822, "beta": 0.843, "gamma": 0.337, "lambda_": 0.511}

ALL_SILENT = [[None, None, None]] * 3
UNANIMOUS_WRONG = [["w", "w", "w"]] * 3
CORRECT_2_1 = [["g", "g", "g"], ["g", "g", "g"], ["w", "w", "w"]]
# everyone flips every round, then two agents go silent; the one answer left is wrong
TWO_SILENT = [["a", "b", None], ["c", "d", None], ["e", "f", "w"]]


def reward(answers) -> float:
    return float(agent_rewards(debate_metrics([answers], ["g"]), **AGENT_0)[0, 0])


def test_all_silent_debate_by_hand():
    r = rewards(ALL_SILENT, "g")
    # every transition is a change, every pair disagrees in every round
    assert (r.r_intra, r.r_inter, r.r_task) == (0.0, 0.0, 0.0)
    u = uncertainty(ALL_SILENT)
    # final round: three singletons (K = 3, uniform: H = 1), D = 1; the vote is None with or without anyone
    assert (u.entropy, u.disagreement, u.loo_instability) == (1.0, 1.0, 0.0)
    assert r.r_sys == pytest.approx(1 / 3)
    assert reward(ALL_SILENT) == pytest.approx(0.337 / 3) and round(reward(ALL_SILENT), 3) == 0.112


def test_unanimous_wrong_debate_by_hand():
    r = rewards(UNANIMOUS_WRONG, "g")
    assert (r.r_intra, r.r_inter, r.r_sys, r.r_task) == (1.0, 1.0, 1.0, 0.0)
    assert reward(UNANIMOUS_WRONG) == pytest.approx(0.822 + 0.843 + 0.337)  # 2.002


def test_correct_two_one_stable_debate_by_hand():
    r = rewards(CORRECT_2_1, "g")
    h = -(2 / 3 * np.log(2 / 3) + 1 / 3 * np.log(1 / 3)) / np.log(2)
    # stable agents; one pair of three agrees each round; L = 0 (without a g agent the tie goes to g: sha256("\\ng") < sha256("\\nw"))
    assert (r.r_intra, r.r_task) == (1.0, 1.0)
    assert r.r_inter == pytest.approx(1 / 3)
    assert r.r_sys == pytest.approx(1 - (h + 1) / 3)
    expected = 0.822 + 0.843 / 3 + 0.337 * (1 - (h + 1) / 3) + 0.511
    assert reward(CORRECT_2_1) == pytest.approx(expected) and round(expected, 3) == 1.736
    assert reward(CORRECT_2_1) < reward(UNANIMOUS_WRONG)  # the ordering the calibration reports


def test_two_silent_debate_by_hand():
    r = rewards(TWO_SILENT, "g")
    assert (r.r_intra, r.r_inter, r.r_task) == (0.0, 0.0, 0.0)
    u = uncertainty(TWO_SILENT)
    # final (None, None, w): K = 3 singletons, H = 1, D = 1; only removing agent 2 changes the vote (w -> None)
    assert (u.entropy, u.disagreement, u.loo_instability) == (1.0, 1.0, pytest.approx(1 / 3))
    assert reward(TWO_SILENT) == pytest.approx(0.337 * 2 / 9) and round(reward(TWO_SILENT), 3) == 0.075


@pytest.mark.parametrize("answers", [ALL_SILENT, UNANIMOUS_WRONG, CORRECT_2_1, TWO_SILENT])
def test_hand_cases_agree_with_the_oracle(answers):
    for got, expected in [
        (uncertainty(answers).to_dict(), reference_uncertainty(answers).to_dict()),
        (rewards(answers, "g").to_dict(), reference_rewards(answers, "g").to_dict()),
    ]:
        assert got.keys() == expected.keys()
        for name, value in got.items():
            assert value == pytest.approx(expected[name]), name


def test_silence_never_counts_as_stability_or_agreement():
    u = uncertainty([["a", None, None], ["a", None, None]])
    assert u.flip_rate == 1.0 and u.revision_rate == 1.0  # None -> None is a change
    assert u.conflict == (0.0, 1.0, 1.0)  # two Nones disagree
    one_silent = uncertainty([["a"], [None]])  # a single None is a singleton as before
    assert (one_silent.entropy, one_silent.disagreement) == (1.0, 1.0)


def test_the_vote_still_abstains():
    m = debate_metrics([[["a"], [None], [None]], [[None], [None]]], ["a", None])
    assert m.predictions == ["a", None] and m.r_task.tolist() == [1.0, 0.0]


def test_codes_that_repeat_none_code_follow_the_rule():
    codes = np.array([[[NONE_CODE, NONE_CODE], [NONE_CODE, NONE_CODE], [0, 0]]], dtype=np.int8)
    m = batch_uncertainty(codes, values=["a"])
    assert m.conflict.tolist() == [[1.0, 1.0]] and m.agent_flips.tolist() == [[1, 1, 0]]
    assert m.vote.tolist() == [0] and m.entropy.tolist() == [1.0]
    assert codes.min() == NONE_CODE  # the caller's array is left alone


def test_unparsed_apart_gives_each_none_its_own_negative_code():
    codes = np.array([[[NONE_CODE, 3], [NONE_CODE, NONE_CODE]]], dtype=np.int8)
    apart = unparsed_apart(codes)
    unparsed = apart[codes == NONE_CODE]
    assert len(set(unparsed.tolist())) == 3 and (unparsed < 0).all() and apart[0, 0, 1] == 3
    single = np.array([[[NONE_CODE, 1]]])
    assert unparsed_apart(single) is single
    assert answer_classes(["x", None, "x", None])[0] == answer_classes(["x", None, "x", None])[2]
    assert len(set(answer_classes([None, None, None]))) == 3
