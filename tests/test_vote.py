"""The majority vote (SPEC section 1, "Majority vote"; docs/metrics.md, "The vote"): the most frequent
non-None answer, a tie to the tied answer of smallest sha256(f"{key}\\n{answer}") hex digest, whatever agent
gave it. Hand cases with digests computed here, the permutation and repeatability properties, a fair share
of ties over many question keys, and the vectorized votes (the final round and without each agent) equal
to it."""

from __future__ import annotations

import hashlib
import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from udpo.rewards import agent_rewards, debate_metrics, majority_vote, rewards, uncertainty
from udpo.rewards.vote import tie_digest


def sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_hand_computed_ties():
    # key "": sha256 of "\nb" 5e79.., of "\na" 7361.., of "\nc" a4ef..
    assert sha("\nb") < sha("\na") < sha("\nc")
    assert majority_vote(["a", "b"]) == "b"
    assert majority_vote(["b", "a"]) == "b"
    assert majority_vote(["c", "a", "b"]) == "b"
    assert majority_vote(["c", "a"]) == "a"
    # the key is the question id: the same split of another question may go the other way
    assert sha("q7\na") < sha("q7\nb")
    assert majority_vote(["a", "b"], "q7") == "a"
    assert majority_vote(["b", "a"], "q7") == "a"
    # normalized answers of a numeric task, key a GSM8K-style id
    assert sha("gsm8k/test/3\n18") > sha("gsm8k/test/3\n42")
    assert majority_vote(["18", "42", None], "gsm8k/test/3") == "42"
    assert tie_digest("q7", "a") == sha("q7\na")


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        (["a", "b", "a"], "a"),
        (["b", "a", "a"], "a"),
        (["a"], "a"),
        # a plurality needs no tie-break
        (["c", "b", "a", "b"], "b"),
        # None abstains, even when it is the most frequent value
        ([None, None, "a"], "a"),
        ([None, "b", None, "a", "a"], "a"),
        # nobody answered
        ([None, None], None),
        ([], None),
        # any hashable answers, compared with ==
        ([3, 2.0, 2, 3.0, 2], 2.0),
    ],
)
def test_majority_vote(answers, expected):
    assert majority_vote(answers) == expected


def test_other_hashables_are_read_as_their_str():
    assert majority_vote([3, 7]) == min((3, 7), key=lambda a: sha(f"\n{a}"))
    assert majority_vote([(1, 2), "x"], "k") == min(((1, 2), "x"), key=lambda a: sha(f"k\n{a}"))


def test_majority_vote_accepts_tuples_and_generators():
    assert majority_vote(("x", "y", "y")) == "y"
    assert majority_vote(a for a in ["x", "y", "x"]) == "x"


def test_bad_keys_and_unorderable_ties():
    with pytest.raises(ValueError, match="key is the question id, a string"):
        majority_vote(["a"], 3)
    with pytest.raises(ValueError, match="differ but read as the same string"):
        majority_vote([1, "1"])
    assert majority_vote([1, "1", 1]) == 1  # no tie, nothing to order
    with pytest.raises(ValueError, match="differ but read as the same string"):
        debate_metrics([[[1], ["1"]]])
    with pytest.raises(ValueError, match="got 1 keys"):
        debate_metrics([[["a"]], [["b"]]], keys=["q"])
    with pytest.raises(ValueError, match="debate 1: a vote's key"):
        debate_metrics([[["a"]], [["b"]]], keys=["q", None])


answers = st.lists(st.sampled_from(["a", "b", "c", "d", None]), min_size=1, max_size=7)
keys = st.text(max_size=6)


@settings(max_examples=200, deadline=None)
@given(answers, keys, st.randoms(use_true_random=False))
def test_permuting_the_agents_never_changes_the_vote(final, key, rnd):
    shuffled = list(final)
    rnd.shuffle(shuffled)
    assert majority_vote(shuffled, key) == majority_vote(final, key)


@settings(max_examples=100, deadline=None)
@given(st.lists(answers, min_size=1, max_size=6), st.data())
def test_permuting_agents_never_changes_l_or_the_vote_based_rewards(finals, data):
    """Per debate: the vote, L, r_task and r_sys (both scopes, per-agent values permuted with the agents)
    of debate_metrics/agent_rewards, and the same split of the same question always votes the same way
    (here, in another batch and another position)."""
    matrices = [[[a] for a in final] for final in finals]
    ids = data.draw(st.lists(keys, min_size=len(finals), max_size=len(finals)))
    orders = [data.draw(st.permutations(range(len(f)))) for f in finals]
    shuffled = [[m[i] for i in order] for m, order in zip(matrices, orders, strict=True)]
    golds = ["a"] * len(finals)
    one = debate_metrics(matrices, golds, keys=ids)
    other = debate_metrics(shuffled[::-1], golds, keys=ids[::-1])
    for m, order in enumerate(orders):
        k, n = len(finals) - 1 - m, len(order)
        assert one.predictions[m] == other.predictions[k] == majority_vote(finals[m], ids[m])
        assert one.loo_instability[m] == pytest.approx(other.loo_instability[k])
        assert one.r_task[m] == other.r_task[k]
        assert one.r_sys[m] == pytest.approx(other.r_sys[k])
        assert other.agent_loo[k, :n] == pytest.approx(one.agent_loo[m, :n][list(order)])
        assert other.agent_r_sys[k, :n] == pytest.approx(one.agent_r_sys[m, :n][list(order)])
    team = agent_rewards(one, 0.0, 0.0, 1.0, 1.0), agent_rewards(other, 0.0, 0.0, 1.0, 1.0)
    each = agent_rewards(one, 0.0, 0.0, 1.0, 1.0, "agent"), agent_rewards(other, 0.0, 0.0, 1.0, 1.0, "agent")
    for m, order in enumerate(orders):
        k, n = len(finals) - 1 - m, len(order)
        assert team[1][k] == pytest.approx(team[0][m])
        assert each[1][k, :n] == pytest.approx(each[0][m, :n][list(order)])


def test_the_same_split_of_the_same_question_always_votes_the_same_way():
    final = ["12", "7", "12", "7"]
    matrix = [[a] for a in final]
    batch = debate_metrics([[["x"]], matrix, matrix[::-1]], keys=["q9", "q3", "q3"])
    votes = {majority_vote(final, "q3"), majority_vote(sorted(final), "q3"), *batch.predictions[1:]}
    assert len(votes) == 1
    # and so do L and the rewards, wherever the debate sits
    assert uncertainty(matrix, key="q3") == uncertainty(matrix[::-1], key="q3")
    assert rewards(matrix, "12", key="q3") == rewards(matrix[::-1], "12", key="q3")


def binomial_bound(n: int, p: float, tail: float) -> int:
    """The smallest k with P(|X - n p| >= k) <= tail for X ~ Binomial(n, p), from the exact distribution."""
    log_pmf = [
        math.lgamma(n + 1)
        - math.lgamma(x + 1)
        - math.lgamma(n - x + 1)
        + x * math.log(p)
        + (n - x) * math.log1p(-p)
        for x in range(n + 1)
    ]
    pmf = [math.exp(v) for v in log_pmf]
    mean = n * p
    for k in range(n + 1):
        if sum(q for x, q in enumerate(pmf) if abs(x - mean) >= k) <= tail:
            return k
    return n + 1


@pytest.mark.parametrize("tied", [("a", "b"), ("12", "7", "3.5")])
def test_over_many_questions_each_tied_answer_wins_about_equally_often(tied):
    """Fixed keys q0..q1999, so the counts are fixed (the test cannot flake); each count must lie within
    the bound that a fair Binomial(2000, 1/k) leaves with probability 1e-6, so a rule that favoured
    one answer (or one seat) by more than a few percent could not pass."""
    n = 2000
    final = [a for a in tied for _ in range(2)]  # every answer twice: a k-way tie
    wins = Counter(majority_vote(final, f"q{i}") for i in range(n))
    assert set(wins) == set(tied)
    bound = binomial_bound(n, 1 / len(tied), 1e-6)
    assert bound < 0.07 * n  # the check has teeth
    for answer in tied:
        assert abs(wins[answer] - n / len(tied)) < bound, (answer, wins)
    # the seats do not matter either: agent 0 wins exactly as often as its answer does
    seat0 = Counter(majority_vote(final, f"q{i}") == final[0] for i in range(n))
    assert seat0[True] == wins[final[0]]


def test_vectorized_votes_equal_the_function_on_many_ties():
    """Final rounds with ties everywhere (and the leave-one-out votes their L reads) over many keys."""
    rng = np.random.default_rng(0)
    labels = np.array(["a", "b", "c", None], dtype=object)
    finals = [list(labels[rng.integers(0, 4, size=rng.integers(1, 7))]) for _ in range(600)]
    ids = [f"q{i % 97}" for i in range(len(finals))]
    m = debate_metrics([[[a] for a in f] for f in finals], keys=ids)
    for k, (final, key) in enumerate(zip(finals, ids, strict=True)):
        vote = majority_vote(final, key)
        assert m.predictions[k] == vote
        loo = [float(majority_vote(final[:i] + final[i + 1 :], key) != vote) for i in range(len(final))]
        assert m.agent_loo[k, : len(final)].tolist() == (loo if len(final) > 1 else [0.0])
