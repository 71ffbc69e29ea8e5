"""Reward terms (docs/metrics.md, "Rewards") and the replay priority (docs/algorithms.md, "Uncertainty-driven
replay"): hand cases and properties."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_metrics import DEBATE, answer_matrices

from udpo.rewards import Rewards, composite_uncertainty, is_correct, rewards, uncertainty


def test_trajectory_rewards_hand_case():
    r = rewards(DEBATE, gold="b")
    # transitions t = 0..T-1: agent0 a->b, agent1 a->b (at t=1), agent2 c->b: 3 changes of N*T = 6
    assert r.r_intra == pytest.approx(0.5)
    assert r.r_inter == pytest.approx(1 - 5 / 9)
    assert r.r_sys == 1.0  # unanimous final round
    assert r.r_task == 1.0
    assert rewards(DEBATE, gold="a").r_task == 0.0


def test_r_intra_counts_the_round_zero_transition():
    # only change is round 0 -> 1: U_intra's flip rate ignores it, r_intra does not
    a = [["a", "b", "b"], ["b", "b", "b"]]
    assert uncertainty(a).flip_rate == 0.0
    assert rewards(a, "b").r_intra == pytest.approx(1 - 1 / 4)


def test_no_rounds_gives_full_intra_reward():
    r = rewards([["a"], ["b"]], gold="a")
    assert r.r_intra == 1.0
    assert r.r_inter == 0.0
    assert r.r_sys == pytest.approx(1 - (1 + 1 + 0.5) / 3)
    # the 1-1 tie goes to the answer of smaller sha256(key + "\n" + answer): b for key "", a for "q7"
    assert hashlib.sha256(b"\nb").hexdigest() < hashlib.sha256(b"\na").hexdigest()
    assert r.r_task == 0.0
    assert hashlib.sha256(b"q7\na").hexdigest() < hashlib.sha256(b"q7\nb").hexdigest()
    assert rewards([["a"], ["b"]], gold="a", key="q7").r_task == 1.0
    assert rewards([["b"], ["a"]], gold="a", key="q7").r_task == 1.0  # whoever says it


def test_single_agent_one_round_hand_case():
    # N = 1, T = 1, a = [[a, b]]: one change in N*T = 1 transition -> r_intra = 1 - 1/1 = 0;
    # no pairs, so C_0 = C_1 = 0 and r_inter = 1; final (b): K = 1 -> H = 0, D = 0, L = 0 (N = 1), r_sys = 1;
    # vote b == gold b -> r_task = 1
    assert rewards([["a", "b"]], "b") == Rewards(r_intra=0.0, r_inter=1.0, r_sys=1.0, r_task=1.0)
    # agent scope: flips_0 / T = 1 -> 0; no peers -> r_inter_0 = 1; L_0 = 0 -> r_sys_0 = 1; r_task is the team's
    assert rewards([["a", "b"]], "b", scope="agent").to_dict() == {
        "r_intra": [0.0],
        "r_inter": [1.0],
        "r_sys": [1.0],
        "r_task": [1.0],
    }
    assert rewards([["a", "b"]], "a").r_task == 0.0  # the round-0 answer does not count


# N = 3, T = 1: the round-0 majority (a) is right, the debate scatters it into a three-way split
ONE_ROUND = [["a", "b"], ["a", "a"], ["b", "c"]]


def test_one_round_debate_trajectory_hand_case():
    r = rewards(ONE_ROUND, gold="a")
    # transitions: agent0 a->b, agent1 none, agent2 b->c: 2 of N*T = 3 -> r_intra = 1/3
    assert r.r_intra == pytest.approx(1 / 3)
    # C_0 on (a, a, b): 2 of 3 pairs differ; C_1 on (b, a, c): 3 of 3 -> U_inter = (2/3 + 1) / 2 = 5/6
    assert r.r_inter == pytest.approx(1 / 6)
    # final (b, a, c): K = 3 uniform -> H = 1; D = 1; vote b (the tie's smallest digest under key "":
    # b 5e79.., a 7361.., c a4ef..); without agent 0 the tie (a, c) goes to a, without agent 1 or 2 it
    # stays b -> L = 1/3; U_sys = (1 + 1 + 1/3) / 3 = 7/9
    assert r.r_sys == pytest.approx(2 / 9)
    assert r.r_task == 0.0  # vote b, gold a


def test_one_round_debate_agent_hand_case():
    r = rewards(ONE_ROUND, gold="a", scope="agent")
    assert r.r_intra == pytest.approx([0.0, 1.0, 0.0])  # 1 - flips_i / T with flips (1, 0, 1)
    # share of the two peers an agent disagrees with, rounds 0 and 1:
    # agent0 (1/2, 2/2), agent1 (1/2, 2/2), agent2 (2/2, 2/2) -> means 3/4, 3/4, 1
    assert r.r_inter == pytest.approx([1 / 4, 1 / 4, 0.0])
    # H = 1, D = 1 for everyone; only agent 0 is pivotal (L_i = 1, 0, 0) -> 1 - (2 + L_i) / 3
    assert r.r_sys == pytest.approx([0.0, 1 / 3, 1 / 3])
    assert r.r_task == pytest.approx([0.0, 0.0, 0.0])
    assert rewards(ONE_ROUND, gold="b", scope="agent").r_task == pytest.approx([1.0, 1.0, 1.0])


def test_all_none_prediction_is_wrong():
    r = rewards([[None, None], [None, None]], gold=None)
    assert r.r_task == 0.0
    # and silence earns no stability or agreement: every None differs from every other
    assert (r.r_intra, r.r_inter, r.r_sys) == (0.0, 0.0, pytest.approx(1 / 3))


def test_match_decides_correctness():
    a = [["41.9999999"], ["41.9999999"]]
    assert rewards(a, gold="42").r_task == 0.0
    close = lambda p, g: abs(float(p) - float(g)) < 1e-6  # noqa: E731
    assert rewards(a, gold="42", match=close).r_task == 1.0
    assert not is_correct(None, None, close)


def test_agent_scope_hand_case():
    r = rewards(DEBATE, gold="b", scope="agent")
    assert r.r_intra == pytest.approx([0.5, 0.5, 0.5])  # each agent changes once in T = 2
    assert r.r_inter == pytest.approx([0.5, 0.5, 1 / 3])
    assert r.r_sys == pytest.approx([1.0, 1.0, 1.0])
    assert r.r_task == pytest.approx([1.0, 1.0, 1.0])
    # final (None, None, a, b): K = 4 singletons (H = 1), D = 1; under key "q7" the tie goes to a
    # (smaller digest), so only agent 2 is pivotal; under key "" it goes to b and agent 3 is
    pivot = rewards([[None], [None], ["a"], ["b"]], gold="a", scope="agent", key="q7")
    assert pivot.r_sys == pytest.approx([1 / 3, 1 / 3, 0.0, 1 / 3])
    assert pivot.r_task == pytest.approx([1.0] * 4)
    other = rewards([[None], [None], ["a"], ["b"]], gold="a", scope="agent")
    assert other.r_sys == pytest.approx([1 / 3, 1 / 3, 1 / 3, 0.0])
    assert other.r_task == pytest.approx([0.0] * 4)
    assert pivot.r_intra == pytest.approx([1.0] * 4)


def test_rewards_to_dict_and_bad_scope():
    assert rewards(DEBATE, "b", scope="agent").to_dict()["r_intra"] == [0.5, 0.5, 0.5]
    with pytest.raises(ValueError, match="scope must be"):
        rewards(DEBATE, "b", scope="team")
    with pytest.raises(ValueError, match="ragged"):
        rewards([["a"], []], "a")


@settings(max_examples=150, deadline=None)
@given(answer_matrices(), st.sampled_from(["a", "b", None]))
def test_reward_properties(a, gold):
    u = uncertainty(a)
    r = rewards(a, gold)
    # docs/metrics.md, "Rewards": r_inter = 1 - U_inter and r_sys = 1 - U_sys
    assert r.r_inter == pytest.approx(1 - u.u_inter)
    assert r.r_sys == pytest.approx(1 - u.u_sys)
    for value in (r.r_intra, r.r_inter, r.r_sys, r.r_task):
        assert -1e-12 <= value <= 1 + 1e-12
    ra = rewards(a, gold, scope="agent")
    for traj, agent in ((r.r_intra, ra.r_intra), (r.r_inter, ra.r_inter), (r.r_sys, ra.r_sys)):
        assert len(agent) == len(a)
        assert np.all((agent >= -1e-12) & (agent <= 1 + 1e-12))
        assert np.mean(agent) == pytest.approx(traj)  # the agent terms average to the team's
    assert np.all(ra.r_task == r.r_task)


def test_composite_uncertainty():
    assert composite_uncertainty(1.0, 1.0, 1.0) == 0.0
    assert composite_uncertainty(0.5, 0.2, 0.8, alpha=0.5, beta=0.3, gamma=0.2) == pytest.approx(
        0.5 * 0.5 + 0.3 * 0.8 + 0.2 * 0.2
    )
    out = composite_uncertainty(np.array([1.0, 0.0]), np.array([1.0, 0.0]), np.array([1.0, 0.0]))
    assert out == pytest.approx([0.0, 1.0])
    r = rewards(DEBATE, "b")
    assert composite_uncertainty(r.r_intra, r.r_inter, r.r_sys) == pytest.approx((0.5 + 5 / 9 + 0) / 3)
    with pytest.raises(ValueError, match="alpha must be"):
        composite_uncertainty(1, 1, 1, alpha=-1)
    with pytest.raises(ValueError, match="NaN"):
        composite_uncertainty(np.array([np.nan]), 1, 1)
