"""The vectorized path (the library's one implementation) gives the numbers of the formulas written out
one debate at a time (tests/reference_metrics.py, the oracle); integer coding; per-agent UDPO rewards."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_metrics import agent_uncertainty, majority_vote, rewards, uncertainty
from test_metrics import DEBATE, UNIFORM_SPLITS, answer_matrices, uniform_final_round

import udpo.rewards as library
from udpo.rewards import NONE_CODE, agent_rewards, batch_uncertainty, debate_metrics, encode_answers

SCALAR_FIELDS = [
    "flip_rate",
    "revision_rate",
    "u_intra",
    "u_inter",
    "entropy",
    "disagreement",
    "loo_instability",
    "u_sys",
]


#: question ids the vote's tie-break is keyed by
KEYS = st.sampled_from(["", "q0", "q1", "gsm8k/test/17", "é"])


def assert_matches_reference(metrics, matrices, golds=None, lam=0.5, keys=None):
    for m, a in enumerate(matrices):
        key = keys[m] if keys is not None else ""
        u = uncertainty(a, lam=lam, key=key)
        for name in SCALAR_FIELDS:
            assert getattr(metrics, name)[m] == pytest.approx(getattr(u, name)), (m, name)
        t1 = len(a[0])
        assert metrics.conflict[m, :t1] == pytest.approx(u.conflict)
        assert np.isnan(metrics.conflict[m, t1:]).all()
        p = agent_uncertainty(a, lam=lam, key=key)
        n = len(a)
        assert metrics.agent_flips[m, :n] == pytest.approx(p.flips)
        assert metrics.agent_u_intra[m, :n] == pytest.approx(p.u_intra)
        assert metrics.agent_u_inter[m, :n] == pytest.approx(p.u_inter)
        assert metrics.agent_loo[m, :n] == pytest.approx(p.loo)
        gold = golds[m] if golds is not None else None
        traj, agent = rewards(a, gold, key=key), rewards(a, gold, scope="agent", key=key)
        assert metrics.r_intra[m] == pytest.approx(traj.r_intra)
        assert metrics.r_inter[m] == pytest.approx(traj.r_inter)
        assert metrics.r_sys[m] == pytest.approx(traj.r_sys)
        assert metrics.agent_r_intra[m, :n] == pytest.approx(agent.r_intra)
        assert metrics.agent_r_inter[m, :n] == pytest.approx(agent.r_inter)
        assert metrics.agent_r_sys[m, :n] == pytest.approx(agent.r_sys)
        assert metrics.predictions[m] == majority_vote([row[-1] for row in a], key)
        if golds is not None:
            assert metrics.r_task[m] == traj.r_task


@settings(max_examples=60, deadline=None)
@given(st.lists(answer_matrices(), min_size=1, max_size=8), st.floats(0, 1), st.data())
def test_batch_equals_reference_on_mixed_shapes(matrices, lam, data):
    golds = data.draw(
        st.lists(st.sampled_from(["a", "b", None]), min_size=len(matrices), max_size=len(matrices))
    )
    keys = data.draw(st.lists(KEYS, min_size=len(matrices), max_size=len(matrices)))
    metrics = debate_metrics(matrices, golds, lam=lam, keys=keys)
    assert len(metrics) == len(matrices)
    assert_matches_reference(metrics, matrices, golds, lam, keys)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 6),
    st.integers(1, 6),
    st.integers(1, 4),
    st.randoms(use_true_random=False),
    st.lists(KEYS, min_size=5, max_size=5),
)
def test_batch_uncertainty_on_codes_equals_reference(n, t1, k, rnd, keys):
    # integer codes straight from a generator, NONE_CODE included; code c stands for the answer values[c]
    codes = np.array(
        [[[rnd.randint(NONE_CODE, k - 1) for _ in range(t1)] for _ in range(n)] for _ in range(5)]
    )
    values = [f"answer {c}" for c in range(k)]
    metrics = batch_uncertainty(codes, values=values, keys=keys)
    for m in range(len(codes)):
        a = [[None if c == NONE_CODE else values[c] for c in row] for row in codes[m]]
        u = uncertainty(a, key=keys[m])
        for name in SCALAR_FIELDS:
            assert getattr(metrics, name)[m] == pytest.approx(getattr(u, name)), name
        vote = majority_vote([row[-1] for row in a], keys[m])
        assert metrics.vote[m] == (NONE_CODE if vote is None else values.index(vote))


@settings(max_examples=60, deadline=None)
@given(answer_matrices(), st.floats(0, 1), st.sampled_from(["a", "b", None]), KEYS)
def test_one_debate_functions_equal_the_oracle(a, lam, gold, key):
    """uncertainty, agent_uncertainty, rewards and majority_vote (the scalar vote) equal the oracle."""
    for name, value in library.uncertainty(a, lam=lam, key=key).to_dict().items():
        assert value == pytest.approx(getattr(uncertainty(a, lam=lam, key=key), name)), name
    ours, oracle = library.agent_uncertainty(a, lam=lam, key=key), agent_uncertainty(a, lam=lam, key=key)
    assert ours.flips == oracle.flips
    for name in ("u_intra", "u_inter", "loo"):
        assert getattr(ours, name) == pytest.approx(getattr(oracle, name)), name
    for scope in ("trajectory", "agent"):
        ours, oracle = library.rewards(a, gold, scope=scope, key=key), rewards(a, gold, scope=scope, key=key)
        for name in ("r_intra", "r_inter", "r_sys", "r_task"):
            assert np.asarray(getattr(ours, name)) == pytest.approx(np.asarray(getattr(oracle, name))), name
    for t in range(len(a[0])):
        assert library.majority_vote((row[t] for row in a), key) == majority_vote([row[t] for row in a], key)


def test_uniform_split_has_entropy_exactly_one():
    metrics = debate_metrics([uniform_final_round(n, k) for n, k in UNIFORM_SPLITS])
    assert metrics.entropy.tolist() == [1.0] * len(UNIFORM_SPLITS)


def test_encode_answers():
    codes, values = encode_answers(
        [DEBATE, [["b", None, "z"], [None, "a", "a"], ["b", "b", "b"]]], return_values=True
    )
    assert codes.shape == (2, 3, 3) and codes.dtype == np.int32
    assert codes[1, 0, 1] == NONE_CODE and codes[1, 1, 0] == NONE_CODE
    decoded = [[[None if c == NONE_CODE else values[c] for c in row] for row in m] for m in codes]
    assert decoded[0] == DEBATE
    assert codes[0, 0, 0] == codes[1, 1, 1]  # "a" gets one code across debates
    assert (codes >= NONE_CODE).all()


def test_encode_rejects_mixed_shapes_and_bad_matrices():
    with pytest.raises(ValueError, match="debate 1: shape 1x1 differs from debate 0's 3x3"):
        encode_answers([DEBATE, [["a"]]])
    with pytest.raises(ValueError, match="debate 1: ragged"):
        encode_answers([DEBATE, [["a"], []]])
    with pytest.raises(ValueError, match="no answer matrices"):
        encode_answers([])


@pytest.mark.parametrize(
    ("codes", "message"),
    [
        (np.zeros((3, 4)), "shape M x N x \\(T\\+1\\)"),
        (np.zeros((2, 0, 3), dtype=int), "N >= 1 agents"),
        (np.full((1, 2, 2), np.nan), "NaN"),
        (np.zeros((1, 2, 2), dtype=float), "must be integers"),
        (np.full((1, 2, 2), -3), "below NONE_CODE"),
    ],
)
def test_batch_uncertainty_rejects_bad_codes(codes, message):
    with pytest.raises(ValueError, match=message):
        batch_uncertainty(codes, values=["a"])


def test_debate_metrics_bad_input():
    with pytest.raises(ValueError, match="no debates"):
        debate_metrics([])
    with pytest.raises(ValueError, match="got 1 golds for 2 debates"):
        debate_metrics([DEBATE, DEBATE], ["a"])
    for nan in (float("nan"), np.float32("nan"), np.float16("nan")):
        with pytest.raises(ValueError, match=r"debate 1: answer of agent 0 at round 0 is NaN \(use None"):
            debate_metrics([DEBATE, [[nan]]])
        with pytest.raises(ValueError, match="debate 0: answer of agent 1 at round 2 is NaN"):
            encode_answers([[["a", "b", "c"], ["a", "b", nan]]])
    with pytest.raises(ValueError, match="lam must lie"):
        debate_metrics([DEBATE], lam=2)


def test_mixed_shapes_pad_with_nan():
    metrics = debate_metrics([DEBATE, [["a"], ["b"]]], ["b", "b"])
    assert metrics.agent_loo.shape == (2, 3) and np.isnan(metrics.agent_loo[1, 2])
    assert metrics.conflict.shape == (2, 3) and np.isnan(metrics.conflict[1, 1:]).all()
    assert metrics.predictions == ["b", "b"]  # the 1-1 tie: sha256("\nb") < sha256("\na")
    assert metrics.r_task.tolist() == [1.0, 1.0]


def test_agent_rewards_combines_terms_with_per_agent_coefficients():
    metrics = debate_metrics([DEBATE], ["b"])
    alpha, beta, gamma, lam = [1.0, 2.0, 0.0], [0.5, 0.5, 0.5], 0.25, [1.0, 0.0, 2.0]
    r = agent_rewards(metrics, alpha, beta, gamma, lam)
    r_inter = 1 - 5 / 9
    expected = [
        a * 0.5 + b * r_inter + gamma * 1.0 + lm * 1.0 for a, b, lm in zip(alpha, beta, lam, strict=True)
    ]
    assert r.shape == (1, 3)
    assert r[0] == pytest.approx(expected)
    ra = agent_rewards(metrics, alpha, beta, gamma, lam, scope="agent")
    agent_inter = [0.5, 0.5, 1 / 3]
    expected = [
        a * 0.5 + b * ri + gamma + lm for a, b, ri, lm in zip(alpha, beta, agent_inter, lam, strict=True)
    ]
    assert ra[0] == pytest.approx(expected)


def test_agent_rewards_bad_input():
    with pytest.raises(ValueError, match="no r_task"):
        agent_rewards(debate_metrics([DEBATE]), 1, 1, 1, 1)
    metrics = debate_metrics([DEBATE], ["b"])
    with pytest.raises(ValueError, match="alpha must be a scalar or 3 per-agent values"):
        agent_rewards(metrics, [1, 2], 1, 1, 1)
    with pytest.raises(ValueError, match="scope must be"):
        agent_rewards(metrics, 1, 1, 1, 1, scope="team")
