"""Agent-tailored coefficients (docs/metrics.md, "Agent-tailored coefficients"): formulas, monotonicity,
Cohen's d base weights and fallbacks."""

from __future__ import annotations

import hashlib
import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from udpo.rewards import calibrate
from udpo.rewards.calibration import cohens_d_base_weights

# N = 4, T = 2. Agent 2 is the unstable one: it flips in both and is the only pivot in PIVOT. The silent
# agents 0 and 1 of PIVOT change their answer every round too (the silence rule), but only there.
STABLE_BUT_2 = [["a", "a", "a"], ["a", "a", "a"], ["b", "c", "a"], ["a", "a", "a"]]  # final unanimous a
PIVOT = [[None] * 3, [None] * 3, ["c", "d", "a"], ["b", "b", "b"]]  # vote a; without agent 2 it is b
#: the question ids of these warm-up debates: under "q7" PIVOT's tie (a, b) goes to a (smaller digest)
KEYS2, KEYS3 = ["q0", "q7"], ["q0", "q7", "q0"]
assert hashlib.sha256(b"q7\na").hexdigest() < hashlib.sha256(b"q7\nb").hexdigest()


def test_profile_and_coefficients_by_hand():
    cal = calibrate(
        [STABLE_BUT_2, PIVOT], golds=["a", "a"], keys=KEYS2, kappa=2.0, base_weights=(0.5, 0.3, 0.2)
    )
    # agent 2: F = 1 (c->a, d->a), M = 1 (b->a, c->a) in both -> 1; agents 0/1: 0, and 1 in PIVOT
    # (None -> None is a change) -> 0.5; agent 3: 0
    assert cal.u_intra == pytest.approx([0.5, 0.5, 1, 0])
    # u_inter, STABLE_BUT_2: agent 2 differs from all 3 peers in rounds 0 and 1 -> 2/3, others 1/3 of that;
    # PIVOT: every agent differs from all 3 peers (two Nones differ too), every round
    assert cal.u_inter == pytest.approx([(2 / 9 + 1) / 2, (2 / 9 + 1) / 2, (2 / 3 + 1) / 2, (2 / 9 + 1) / 2])
    assert cal.loo == pytest.approx([0, 0, 0.5, 0])
    assert cal.u_sys == pytest.approx((cal.u_intra + cal.u_inter + cal.loo) / 3)
    assert cal.alpha == pytest.approx(0.5 * (1 + 2 * cal.u_intra))
    assert cal.beta == pytest.approx(0.3 * (1 + 2 * cal.u_inter))
    assert cal.gamma == pytest.approx(0.2 * (1 + 2 * cal.loo))
    assert cal.lambda_ == pytest.approx(1.0 / (1 + 2 * cal.u_sys))
    assert cal.eta == pytest.approx(0.01 * (1 + 2 * cal.u_sys))
    assert cal.base.source == "explicit"
    assert (cal.n_debates, cal.n_fail, cal.n_agents) == (2, 0, 4)


def test_more_uncertain_agent_gets_larger_weights_and_smaller_task_reward():
    cal = calibrate([STABLE_BUT_2, PIVOT], golds=["a", "a"], keys=KEYS2)  # all succeed: base weights 1/3 each
    i = 2
    for others in range(4):
        if others == i:
            continue
        assert cal.alpha[i] > cal.alpha[others]
        assert cal.beta[i] > cal.beta[others]
        assert cal.gamma[i] > cal.gamma[others]
        assert cal.eta[i] > cal.eta[others]
        assert cal.lambda_[i] < cal.lambda_[others]


@st.composite
def warmups(draw):
    n = draw(st.integers(2, 4))
    t1 = draw(st.integers(1, 4))
    row = st.lists(st.sampled_from(["a", "b", None]), min_size=t1, max_size=t1)
    debates = draw(st.lists(st.lists(row, min_size=n, max_size=n), min_size=1, max_size=6))
    golds = draw(st.lists(st.sampled_from(["a", "b"]), min_size=len(debates), max_size=len(debates)))
    return debates, golds


@settings(max_examples=60, deadline=None)
@given(warmups(), st.floats(0.1, 3.0))
def test_coefficients_follow_the_profile_order(warmup, kappa):
    cal = calibrate(*warmup, kappa=kappa)
    assert cal.base.alpha + cal.base.beta + cal.base.gamma == pytest.approx(1.0)
    n = cal.n_agents
    for i in range(n):
        for j in range(n):
            for coef, prof, base in (
                (cal.alpha, cal.u_intra, cal.base.alpha),
                (cal.beta, cal.u_inter, cal.base.beta),
                (cal.gamma, cal.loo, cal.base.gamma),
            ):
                if prof[i] > prof[j] + 1e-12 and base > 0:
                    assert coef[i] > coef[j]
            if cal.u_sys[i] > cal.u_sys[j] + 1e-12:
                assert cal.eta[i] > cal.eta[j] and cal.lambda_[i] < cal.lambda_[j]
    assert np.all(cal.lambda_ <= 1.0) and np.all(cal.eta >= 0.01)


def test_cohens_d_base_weights_by_hand():
    correct = np.array([False, False, True, True])
    u_intra = np.array([0.5, 0.7, 0.1, 0.3])  # means 0.6 vs 0.2, pooled sd sqrt(0.04 / 2)
    u_inter = np.array([0.2, 0.4, 0.3, 0.5])  # failures *less* uncertain: d < 0, clipped to 0
    u_sys = np.array([0.6, 0.8, 0.2, 0.2])  # means 0.7 vs 0.2, pooled sd sqrt(0.02 / 2) = 0.1
    base = cohens_d_base_weights(u_intra, u_inter, u_sys, correct)
    d_intra, d_sys = 0.4 / math.sqrt(0.02), 5.0
    assert base.cohens_d["u_intra"] == pytest.approx(d_intra)
    assert base.cohens_d["u_inter"] == pytest.approx(-0.1 / math.sqrt(0.02))
    assert base.cohens_d["u_sys"] == pytest.approx(d_sys)
    assert base.source == "cohens_d"
    assert (base.alpha, base.beta, base.gamma) == pytest.approx(
        (d_intra / (d_intra + d_sys), 0, d_sys / (d_intra + d_sys))
    )


@pytest.mark.parametrize(
    ("u", "correct", "reason"),
    [
        ([0.1, 0.2, 0.3], [True, True, True], "no failed warm-up debates"),
        ([0.1, 0.2, 0.3], [False, False, False], "no successful warm-up debates"),
        ([0.5, 0.5, 0.1, 0.1], [False, False, True, True], "Cohen's d undefined"),  # pooled sd 0
        ([0.5, 0.1], [False, True], "Cohen's d undefined"),  # one debate per class: no pooled sd
        ([0.1, 0.2, 0.6, 0.7], [False, False, True, True], "every Cohen's d <= 0"),
    ],
)
def test_cohens_d_fallbacks(u, correct, reason):
    u = np.array(u)
    base = cohens_d_base_weights(u, u, u, np.array(correct))
    assert (base.alpha, base.beta, base.gamma) == (1 / 3, 1 / 3, 1 / 3)
    assert base.source.startswith("fallback") and reason in base.source


def test_calibrate_uses_the_cohens_d_fallback_and_reports_it():
    # every warm-up debate succeeds: no failures to compare against
    cal = calibrate([STABLE_BUT_2, PIVOT], golds=["a", "a"], keys=KEYS2)
    assert cal.base.source == "fallback: no failed warm-up debates"
    assert cal.alpha == pytest.approx(1 / 3 * (1 + 1.5 * cal.u_intra))


def test_explicit_base_weights_override_and_keep_the_d_values():
    cal = calibrate([STABLE_BUT_2, PIVOT], golds=["a", "a"], keys=KEYS2, base_weights=(1.0, 0.0, 0.0))
    assert (cal.base.alpha, cal.base.beta, cal.base.gamma, cal.base.source) == (1.0, 0.0, 0.0, "explicit")
    assert cal.beta == pytest.approx([0, 0, 0, 0])
    assert set(cal.base.cohens_d) == {"u_intra", "u_inter", "u_sys"}


def test_to_dict_is_json():
    cal = calibrate([STABLE_BUT_2, PIVOT, STABLE_BUT_2], golds=["a", "b", "b"], keys=KEYS3)
    d = json.loads(json.dumps(cal.to_dict(), allow_nan=False))
    assert set(d) == {"coefficients", "profile", "base_weights", "settings", "warmup"}
    assert d["coefficients"]["lambda_"] == pytest.approx(cal.lambda_.tolist())
    assert d["profile"]["loo"] == pytest.approx(cal.loo.tolist())
    assert d["warmup"] == {"n_debates": 3, "n_fail": 2, "n_success": 1}
    assert d["settings"] == {"kappa": 1.5, "lam": 0.5, "lambda_base": 1.0, "eta_base": 0.01}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"answer_matrices": [], "golds": []}, "at least one warm-up debate"),
        ({"answer_matrices": [STABLE_BUT_2, [["a"], ["a"]]], "golds": ["a", "a"]}, "same N in every warm-up"),
        ({"answer_matrices": [STABLE_BUT_2], "golds": ["a", "b"]}, "got 2 golds for 1 debates"),
        ({"answer_matrices": [[["a"], ["a", "b"]]], "golds": ["a"]}, "debate 0: ragged"),
        ({"answer_matrices": [STABLE_BUT_2], "golds": ["a"], "kappa": -1}, "kappa must be"),
        ({"answer_matrices": [STABLE_BUT_2], "golds": ["a"], "eta_base": float("nan")}, "eta_base must be"),
        ({"answer_matrices": [STABLE_BUT_2], "golds": ["a"], "base_weights": (1, 2)}, "three finite numbers"),
    ],
)
def test_calibrate_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        calibrate(**kwargs)


def test_round_trip_table_and_coefficients_feed_agent_rewards():
    from udpo.rewards import agent_rewards, calibration_from_dict, debate_metrics

    cal = calibrate([STABLE_BUT_2, PIVOT, STABLE_BUT_2], golds=["a", "b", "b"], keys=KEYS3)
    again = calibration_from_dict(json.loads(json.dumps(cal.to_dict())))
    assert again.to_dict() == cal.to_dict()
    with pytest.raises(ValueError, match="not a calibration record"):
        calibration_from_dict({"coefficients": {}})
    lines = cal.table().splitlines()
    assert len(lines) == 2 + cal.n_agents and lines[0].startswith("base weights (cohens_d)")
    metrics = debate_metrics([STABLE_BUT_2], ["a"])
    r = agent_rewards(metrics, **cal.coefficients())
    # unanimous, correct final round: r_i = alpha_i r_intra + beta_i r_inter + gamma_i + lambda_i
    expected = cal.alpha * metrics.r_intra[0] + cal.beta * metrics.r_inter[0] + cal.gamma + cal.lambda_
    assert r[0] == pytest.approx(expected)


def test_correct_flags_replace_golds():
    # the task judged debate 1 wrong although its vote equals the gold string (e.g. a numeric tolerance)
    by_flags = calibrate(
        [STABLE_BUT_2, PIVOT, STABLE_BUT_2], golds=None, correct=[True, False, False], keys=KEYS3
    )
    by_golds = calibrate([STABLE_BUT_2, PIVOT, STABLE_BUT_2], golds=["a", "b", "b"], keys=KEYS3)
    assert by_flags.to_dict() == by_golds.to_dict()
    with pytest.raises(ValueError, match="golds or correct flags"):
        calibrate([STABLE_BUT_2], golds=None)
    with pytest.raises(ValueError, match="got 2 correct flags for 1 debates"):
        calibrate([STABLE_BUT_2], golds=None, correct=[True, False])
