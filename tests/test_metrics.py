"""Uncertainty metrics of one debate (docs/metrics.md, "Formulas as implemented"): hand-computed cases,
properties, bad input."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from udpo.rewards import agent_uncertainty, check_answers, uncertainty

H_2_1 = -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3)) / math.log(2)  # entropy of a 2:1 split, K = 2

# agents 0..2 over rounds 0..2
DEBATE = [["a", "b", "b"], ["a", "a", "b"], ["c", "c", "b"]]


def digest(key: str, answer: str) -> str:
    """The vote's tie-break digest, computed here by hand: sha256 of key, newline, answer."""
    return hashlib.sha256(f"{key}\n{answer}".encode()).hexdigest()


# the ties of the bare-list cases below (key ""): b beats a
assert digest("", "b") < digest("", "a")


def test_three_agents_two_rounds():
    u = uncertainty(DEBATE)
    # flips t=1->2: agent1 a->b, agent2 c->b: 2 of N(T-1) = 3
    assert u.flip_rate == pytest.approx(2 / 3)
    assert u.revision_rate == pytest.approx(1.0)  # every agent ends elsewhere than it started
    assert u.u_intra == pytest.approx(0.5 * 2 / 3 + 0.5 * 1.0)
    # round 0: (a,a,c) 2 of 3 pairs differ; round 1: (b,a,c) all; round 2: (b,b,b) none
    assert u.conflict == pytest.approx((2 / 3, 1.0, 0.0))
    assert u.u_inter == pytest.approx(5 / 9)
    assert (u.entropy, u.disagreement, u.loo_instability, u.u_sys) == (0.0, 0.0, 0.0, 0.0)


def test_lam_weights_flip_rate_against_revision():
    assert uncertainty(DEBATE, lam=1.0).u_intra == pytest.approx(2 / 3)
    assert uncertainty(DEBATE, lam=0.0).u_intra == pytest.approx(1.0)
    assert uncertainty(DEBATE, lam=0.25).u_intra == pytest.approx(0.25 * 2 / 3 + 0.75)


def test_single_agent():
    u = uncertainty([["a", "b", "c", "c"]])  # N = 1, T = 3
    assert u.flip_rate == pytest.approx(1 / 2)  # t=1->2 flips, t=2->3 does not
    assert u.revision_rate == 1.0
    assert u.u_intra == pytest.approx(0.75)
    assert u.conflict == (0.0, 0.0, 0.0, 0.0)  # no pairs
    assert u.u_inter == 0.0
    assert (u.entropy, u.disagreement, u.loo_instability, u.u_sys) == (0.0, 0.0, 0.0, 0.0)


def test_no_debate_rounds():
    u = uncertainty([["a"], ["b"], ["a"]])  # T = 0: only the independent answers
    assert (u.flip_rate, u.revision_rate, u.u_intra) == (0.0, 0.0, 0.0)
    assert u.conflict == pytest.approx((2 / 3,))
    assert u.u_inter == pytest.approx(2 / 3)
    assert u.entropy == pytest.approx(H_2_1)
    assert u.disagreement == 1.0
    # vote a; without agent 0 or 2 the tie (a, b) goes to b (smaller digest); without agent 1 it stays a
    assert u.loo_instability == pytest.approx(2 / 3)
    assert u.u_sys == pytest.approx((H_2_1 + 1 + 2 / 3) / 3)


def test_one_debate_round():
    u = uncertainty([["a", "b"], ["a", "a"]])  # T = 1: no flip transitions, F = 0
    assert u.flip_rate == 0.0
    assert u.revision_rate == 0.5
    assert u.u_intra == pytest.approx(0.25)
    assert u.conflict == (0.0, 1.0)
    assert u.u_inter == 0.5
    assert u.entropy == pytest.approx(1.0)  # K = 2, uniform
    assert u.disagreement == 1.0
    assert u.loo_instability == 0.5  # vote b (tie, smaller digest); without agent 0 it is a
    assert u.u_sys == pytest.approx(2.5 / 3)


def test_all_none_is_no_agreement():
    # the silence rule: every None differs from every answer, another None included
    u = uncertainty([[None, None, None], [None, None, None]])
    assert u.to_dict() == {
        "flip_rate": 1.0,
        "revision_rate": 1.0,
        "u_intra": 1.0,
        "conflict": (1.0, 1.0, 1.0),
        "u_inter": 1.0,
        "entropy": 1.0,  # K = N = 2 singletons: a uniform split
        "disagreement": 1.0,
        "loo_instability": 0.0,  # the vote is None with or without any agent
        "u_sys": 2 / 3,
    }


def test_none_is_no_answer_in_metrics_and_abstains_in_the_vote():
    u = uncertainty([["a", None], [None, None], ["a", "a"]])
    # changes: agent 0 a->None; agent 1 None->None (silence is no stability); agent 2 none
    assert u.revision_rate == pytest.approx(2 / 3)
    # round 0 (a, None, a): 2 of 3 pairs differ; round 1 (None, None, a): all 3 do
    assert u.conflict == pytest.approx((2 / 3, 1.0))
    # final (None, None, a): K = 3 singletons, uniform; vote a; without agent 2 nobody answers -> None
    assert u.entropy == 1.0
    assert u.loo_instability == pytest.approx(1 / 3)


def test_tie_in_the_vote_and_leave_one_out():
    u = uncertainty([["a"], ["b"], ["a"], ["b"]])
    # vote b (tie, smaller digest); drop 0 -> (b,a,b) b; drop 1 -> a; drop 2 -> (a,b,b) b; drop 3 -> a
    assert u.loo_instability == 0.5
    assert u.entropy == pytest.approx(1.0)
    assert u.u_sys == pytest.approx(2.5 / 3)


def test_entropy_bounds():
    assert uncertainty([["x"]] * 5).entropy == 0.0  # K = 1
    assert uncertainty([["a"], ["b"], ["c"], ["d"]]).entropy == pytest.approx(1.0)  # K = N, uniform
    # K = 2 split 3:1 with natural logs normalized by ln 2
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) / math.log(2)
    assert uncertainty([["a"], ["a"], ["a"], ["b"]]).entropy == pytest.approx(h)


# (N, K) pairs whose sum of logs rounds above or below 1 (e.g. 1.0000000000000002 for N = K = 5)
UNIFORM_SPLITS = [(3, 3), (5, 5), (6, 3), (7, 7), (12, 12), (13, 13), (14, 7)]


def uniform_final_round(n: int, k: int) -> list[list]:
    """N agents' final answers split evenly over K values; when K = N, agents 0 and 1 say None (a class
    of one each, by the silence rule)."""
    values = [None, None, *"abcdefghijklm"][:n] if k == n else [*"abcdefghijklm"][:k]
    return [[values[i % k]] for i in range(n)]


@pytest.mark.parametrize(("n", "k"), UNIFORM_SPLITS)
def test_uniform_split_has_entropy_exactly_one(n, k):
    assert uncertainty(uniform_final_round(n, k)).entropy == 1.0


def test_agent_uncertainty_hand_case():
    p = agent_uncertainty(DEBATE)
    assert p.flips == (1, 1, 1)  # each agent changes once over t = 0..T-1
    assert p.u_intra == pytest.approx((0.5, 1.0, 1.0))  # F_i (t=1->2) = 0, 1, 1; M_i = 1
    # agent 0: round 0 disagrees with 1 of 2 peers, round 1 with 2, round 2 with none
    assert p.u_inter == pytest.approx((0.5, 0.5, 2 / 3))
    assert p.loo == (0.0, 0.0, 0.0)


def test_agent_uncertainty_single_agent_and_pivot():
    single = agent_uncertainty([["a", "b"]])
    assert single.u_inter == (0.0,) and single.loo == (0.0,)
    # final (None, None, a, b): the tie goes to b (smaller digest), so only agent 3 decides the vote
    pivot = agent_uncertainty([[None], [None], ["a"], ["b"]])
    assert pivot.loo == (0.0, 0.0, 0.0, 1.0)
    # the same split of another question can go the other way: the key picks the tied answer
    assert digest("q7", "a") < digest("q7", "b")
    assert agent_uncertainty([[None], [None], ["a"], ["b"]], key="q7").loo == (0.0, 0.0, 1.0, 0.0)


# --- properties ---

LABELS = ["a", "b", "c", None]


@st.composite
def answer_matrices(draw, max_agents=5, max_rounds=5):
    n = draw(st.integers(1, max_agents))
    t1 = draw(st.integers(1, max_rounds))
    return [draw(st.lists(st.sampled_from(LABELS), min_size=t1, max_size=t1)) for _ in range(n)]


@settings(max_examples=150, deadline=None)
@given(answer_matrices(), st.floats(0, 1))
def test_values_lie_in_unit_interval(a, lam):
    u = uncertainty(a, lam=lam)
    for name, value in u.to_dict().items():
        values = value if name == "conflict" else [value]
        assert all(0.0 <= v <= 1.0 + 1e-12 for v in values), (name, value)
    p = agent_uncertainty(a, lam=lam)
    for values in (p.u_intra, p.u_inter, p.loo):
        assert all(0.0 <= v <= 1.0 + 1e-12 for v in values)


@settings(max_examples=150, deadline=None)
@given(answer_matrices(), st.permutations(["a", "b", "c"]))
def test_relabelling_answers_changes_only_the_vote(a, perm):
    """Every metric but L reads only which answers are equal; L reads the vote, whose ties the answers'
    digests decide (test_vote.py)."""
    relabel = dict(zip(["a", "b", "c"], perm, strict=True))
    renamed = [[relabel.get(x, x) if x is not None else None for x in row] for row in a]
    u, v = uncertainty(renamed).to_dict(), uncertainty(a).to_dict()
    for name in ("loo_instability", "u_sys"):
        del u[name], v[name]
    assert u == v
    ours, theirs = agent_uncertainty(renamed), agent_uncertainty(a)
    assert (ours.flips, ours.u_intra, ours.u_inter) == (theirs.flips, theirs.u_intra, theirs.u_inter)


@settings(max_examples=100, deadline=None)
@given(answer_matrices(), st.randoms(use_true_random=False), st.sampled_from(["", "q1", "q2"]))
def test_agent_order_changes_no_metric(a, rnd, key):
    """Permuting the agents permutes the per-agent values and changes no debate metric, L included."""
    order = list(range(len(a)))
    rnd.shuffle(order)
    shuffled = [a[i] for i in order]
    u, v = uncertainty(a, key=key), uncertainty(shuffled, key=key)
    for name, value in u.to_dict().items():
        assert getattr(v, name) == pytest.approx(value), name
    p, q = agent_uncertainty(a, key=key), agent_uncertainty(shuffled, key=key)
    for name in ("flips", "u_intra", "u_inter", "loo"):
        assert getattr(q, name) == pytest.approx(tuple(getattr(p, name)[i] for i in order)), name


@settings(max_examples=150, deadline=None)
@given(answer_matrices(), st.floats(0, 1))
def test_agent_profiles_average_to_the_debate_metrics(a, lam):
    u, p = uncertainty(a, lam=lam), agent_uncertainty(a, lam=lam)
    assert np.mean(p.u_intra) == pytest.approx(u.u_intra)
    assert np.mean(p.u_inter) == pytest.approx(u.u_inter)
    assert np.mean(p.loo) == pytest.approx(u.loo_instability)


# --- bad input ---


@pytest.mark.parametrize(
    ("answers", "message"),
    [
        ([["a", "b"], ["a"]], "ragged"),
        ([], "no agents"),
        ([[], []], "no rounds"),
        ("ab", "expected N per-agent sequences"),
        (["ab", "cd"], "agent 0 must be a sequence"),
        ([["a", float("nan")]], "agent 0 at round 1 is NaN"),
        ([["a"], [np.float32("nan")]], r"agent 1 at round 0 is NaN \(use None for unparsed\)"),
        ([["a", np.float16("nan")]], "agent 0 at round 1 is NaN"),
        ([["a", np.longdouble("nan")]], "agent 0 at round 1 is NaN"),
        (np.array([[1.0, np.nan]], dtype=np.float32), "agent 0 at round 1 is NaN"),
        ([["a"], [["list"]]], "agent 1 at round 0 is unhashable"),
        (None, "expected N per-agent sequences"),
    ],
)
def test_bad_answer_matrices_are_named(answers, message):
    with pytest.raises(ValueError, match=message):
        uncertainty(answers)
    with pytest.raises(ValueError, match=message):
        agent_uncertainty(answers)


def test_check_answers_prefix_and_arrays():
    with pytest.raises(ValueError, match=r"^debate 7: ragged"):
        check_answers([["a"], ["a", "b"]], where="debate 7")
    assert check_answers(np.array([["a", "b"], ["c", "d"]], dtype=object)) == (("a", "b"), ("c", "d"))


@pytest.mark.parametrize("lam", [-0.1, 1.5])
def test_lam_out_of_range(lam):
    with pytest.raises(ValueError, match="lam must lie in"):
        uncertainty(DEBATE, lam=lam)
