"""The UDPO objective (paper eqs. 4-9; docs/algorithms.md, "The objective") on hand-computed tensors."""

from __future__ import annotations

import math

import pytest
import torch

from udpo.algorithms.base import RolloutBatch, kl_estimate
from udpo.algorithms.udpo import UDPO, Coefficients, compute_rewards, group_mean
from udpo.config import AlgorithmArgs
from udpo.env.trajectory import Trajectory, Turn

LN = math.log


def trajectory(qid: str, behavior: list[list[list[float]]], answers=None, correct=True) -> Trajectory:
    """A debate whose agent i spoke in rounds t with behavior log-probs behavior[i][t] (one per token)."""
    turns = [
        [
            Turn(
                agent=i,
                round=t,
                messages=[],
                text="",
                answer=None,
                prompt_ids=[1, 2, 3],
                completion_ids=list(range(10, 10 + len(lp))),
                logprobs=list(lp),
            )
            for t, lp in enumerate(rounds)
        ]
        for i, rounds in enumerate(behavior)
    ]
    answers = answers or [["1"] * len(rounds) for rounds in behavior]
    return Trajectory(qid, "q", "1", answers, "1", correct, turns=turns)


def batch(behaviors, rewards, group_ids=None, weights=None) -> RolloutBatch:
    ids = group_ids or [f"q{m}" for m in range(len(behaviors))]
    trajs = [trajectory(q, b) for q, b in zip(ids, behaviors, strict=True)]
    w = None if weights is None else torch.tensor(weights)
    return RolloutBatch.from_trajectories(trajs, torch.tensor(rewards, dtype=torch.float32), {}, w)


def udpo(eta=(0.0,), **config) -> UDPO:
    ones = [1.0] * len(eta)
    return UDPO(Coefficients(ones, ones, ones, ones, list(eta)), AlgorithmArgs(**config))


def leaf(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


# clipped surrogate, trajectory-level ratio -----------------------------------------------------------
BEHAVIOR = [-1.0, -2.0]  # one agent, one round, two tokens


@pytest.mark.parametrize(
    ("rho", "advantage", "surrogate", "clipped"),
    [
        (1.5, 1.0, 1.2, True),  # A > 0, rho above 1 + eps: capped at (1 + eps) A, no gradient
        (0.5, 1.0, 0.5, False),  # A > 0, rho below 1 - eps: min picks rho A, gradient flows
        (1.5, -1.0, -1.5, False),  # A < 0, rho above 1 + eps: min picks rho A, gradient flows
        (0.5, -1.0, -0.8, True),  # A < 0, rho below 1 - eps: capped at (1 - eps) A, no gradient
        (1.1, 2.0, 2.2, False),  # inside the clip range: rho A
    ],
)
def test_clipped_surrogate_cases(rho, advantage, surrogate, clipped):
    b = batch([[[BEHAVIOR]]], [[0.0]])
    logp = leaf([BEHAVIOR[0] + LN(rho), BEHAVIOR[1]])  # sum(logp) - sum(behavior) = ln(rho)
    loss, info = udpo().loss(b, 0, [logp], b.behavior(0), None, torch.tensor([advantage]))
    assert loss.item() == pytest.approx(-surrogate, abs=1e-6)
    loss.backward()
    # d loss / d logp_k = -A rho for each token when unclipped, 0 when the clipped branch is taken
    expected_grad = 0.0 if clipped else -advantage * rho
    assert torch.allclose(logp.grad, torch.full((2,), expected_grad), atol=1e-6)
    assert info["ratio_mean"] == pytest.approx(rho, rel=1e-6)
    assert info["clip_frac"] == (1.0 if abs(rho - 1) > 0.2 else 0.0)


def test_ratio_spans_all_rounds_of_the_agent():
    # agent 1 spoke in two rounds: rho multiplies the per-round ratios (1.25 * 0.8 = 1)
    behavior = [[[-1.0], [-1.0]], [[-2.0, -3.0], [-1.5]]]
    b = batch([behavior], [[0.0, 0.0]])
    logp = [leaf([-2.0 + LN(1.25), -3.0, -1.5 + LN(0.8)])]
    _, info = udpo(eta=(0.0, 0.0)).loss(b, 1, logp, b.behavior(1), None, torch.tensor([1.0]))
    assert info["ratio_mean"] == pytest.approx(1.0, abs=1e-6)


def test_token_level_ratio_option():
    # per-token log-ratios ln 1.5, 0, ln 0.5 with A = 1: per-token surrogates 1.2, 1.0, 0.5, mean 0.9
    b = batch([[[[-1.0, -1.0, -1.0]]]], [[0.0]])
    logp = leaf([-1.0 + LN(1.5), -1.0, -1.0 + LN(0.5)])
    loss, info = udpo(ratio_level="token").loss(b, 0, [logp], b.behavior(0), None, torch.tensor([1.0]))
    assert loss.item() == pytest.approx(-0.9, abs=1e-6)
    assert info["clip_frac"] == pytest.approx(2 / 3)
    assert (info["ratio_min"], info["ratio_max"]) == (pytest.approx(0.5), pytest.approx(1.5))
    loss.backward()  # only the unclipped tokens (ratio 1.0 and 0.5) get -A rho / n_tokens
    assert torch.allclose(logp.grad, torch.tensor([0.0, -1.0 / 3, -0.5 / 3]), atol=1e-6)
    # the same tokens at trajectory level: rho = 1.5 * 1 * 0.5 = 0.75, inside the clip range
    loss, _ = udpo().loss(b, 0, [logp.detach()], b.behavior(0), None, torch.tensor([1.0]))
    assert loss.item() == pytest.approx(-0.75, abs=1e-6)


def test_huge_log_ratio_stays_finite():
    b = batch([[[[-50.0] * 4]]], [[0.0]])
    for advantage in (1.0, -1.0):
        logp = leaf([0.0] * 4)  # log-ratio 200
        loss, _ = udpo(ratio_level="trajectory").loss(
            b, 0, [logp], b.behavior(0), None, torch.tensor([advantage])
        )
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()


# KL anchor and eta_i -----------------------------------------------------------------------------------
def test_kl_estimator_hand_values():
    logp = torch.tensor([-1.0, -1.0, -1.0])
    ref = logp + torch.tensor([0.0, LN(2), -LN(2)])  # r = logp_ref - logp_theta
    expected = torch.tensor([0.0, 2 - LN(2) - 1, 0.5 + LN(2) - 1])
    assert torch.allclose(kl_estimate(logp, ref), expected, atol=1e-6)
    assert kl_estimate(logp, logp).abs().max().item() == 0.0  # r = 0 gives 0


def test_anchor_is_summed_over_the_trajectory_beside_a_trajectory_ratio():
    # debate 0: r = ln 2, -ln 2 -> per-token KL 2 - ln 2 - 1 and 1/2 + ln 2 - 1, summed 0.5; debate 1: 0.
    # Trajectory ratio (default): KL of the trajectory distributions = the sum, batch mean 0.25.
    # Token ratio: per-token mean (0.25 and 0), batch mean 0.125. A = 0 so only the anchor counts.
    b = batch([[[[-1.0, -1.0]]], [[[-1.0]]]], [[0.0], [0.0]])
    logp = [torch.tensor([-1.0, -1.0]), torch.tensor([-1.0])]
    ref = [torch.tensor([-1.0 + LN(2), -1.0 - LN(2)]), torch.tensor([-1.0])]
    loss, info = udpo(eta=(0.5,)).loss(b, 0, logp, b.behavior(0), ref, torch.zeros(2))
    assert info["kl"] == pytest.approx(0.25, abs=1e-6)
    assert loss.item() == pytest.approx(0.5 * 0.25, abs=1e-6)
    loss, info = udpo(eta=(0.5,), ratio_level="token").loss(b, 0, logp, b.behavior(0), ref, torch.zeros(2))
    assert info["kl"] == pytest.approx(0.125, abs=1e-6)
    assert loss.item() == pytest.approx(0.5 * 0.125, abs=1e-6)


def test_anchor_scales_with_the_trajectory_like_the_ratio():
    # the same per-token drift over 1 token and over 100 tokens: the trajectory ratio's log grows 100x,
    # and so must the anchor beside it (a per-token mean would stay flat and let eta fade to nothing)
    for n in (1, 100):
        b = batch([[[[-1.0] * n]]], [[0.0]])
        logp = [torch.full((n,), -1.0)]
        ref = [torch.full((n,), -1.0 + LN(2))]
        _, info = udpo(eta=(1.0,)).loss(b, 0, logp, b.behavior(0), ref, torch.zeros(1))
        assert info["kl"] == pytest.approx(n * (2 - LN(2) - 1), rel=1e-5)


def test_eta_weights_each_agents_anchor():
    behavior = [[[-1.0, -1.0]]] * 3
    b = batch([behavior], [[0.0, 0.0, 0.0]])
    algo = udpo(eta=(0.0, 0.1, 1.0))
    logp = [torch.tensor([-1.0, -1.0])]
    ref = [torch.tensor([-1.0 + LN(2), -1.0 - LN(2)])]  # trajectory KL 0.5
    losses = [algo.loss(b, i, logp, b.behavior(i), ref, torch.zeros(1))[0].item() for i in range(3)]
    assert losses == [pytest.approx(0.0), pytest.approx(0.05), pytest.approx(0.5)]
    assert [algo.needs_reference(i) for i in range(3)] == [False, True, True]
    with pytest.raises(ValueError, match="reference log-probs"):
        algo.loss(b, 2, logp, b.behavior(2), None, torch.zeros(1))


# dual clipping -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("rho", "advantage", "dual_clip", "surrogate", "grad_flows"),
    [
        (5.0, -1.0, 3.0, -3.0, False),  # A < 0, rho > c: held at c A, no gradient
        (5.0, -1.0, 0.0, -5.0, True),  # dual clip off: rho A, gradient -A rho = 5 per token
        (2.0, -1.0, 3.0, -2.0, True),  # 1 + eps < rho < c: rho A as without dual clipping
        (5.0, 1.0, 3.0, 1.2, False),  # A > 0: untouched, (1 + eps) A
    ],
)
def test_dual_clip_cases(rho, advantage, dual_clip, surrogate, grad_flows):
    b = batch([[[BEHAVIOR]]], [[0.0]])
    logp = leaf([BEHAVIOR[0] + LN(rho), BEHAVIOR[1]])
    loss, info = udpo(dual_clip=dual_clip).loss(b, 0, [logp], b.behavior(0), None, torch.tensor([advantage]))
    assert loss.item() == pytest.approx(-surrogate, abs=1e-6)
    loss.backward()
    expected = -advantage * rho if grad_flows else 0.0
    assert torch.allclose(logp.grad, torch.full((2,), expected), atol=1e-6)
    assert info["dual_clip_frac"] == (1.0 if dual_clip and advantage < 0 and rho > dual_clip else 0.0)


def test_dual_clip_bounds_a_stale_samples_gradient():
    # a replayed debate whose trajectory ratio drifted to e^10: without dual clipping a negative advantage
    # multiplies the gradient by rho ~ 22026; with c = 3 the objective is flat (c A) there
    b = batch([[[BEHAVIOR]]], [[0.0]])
    for c, bounded in ((0.0, False), (3.0, True)):
        logp = leaf([BEHAVIOR[0] + 10.0, BEHAVIOR[1]])
        loss, _ = udpo(dual_clip=c).loss(b, 0, [logp], b.behavior(0), None, torch.tensor([-1.0]))
        loss.backward()
        assert (logp.grad.abs().max().item() == 0.0) == bounded
    with pytest.raises(ValueError, match="dual_clip must be 0 \\(off\\) or a finite number > 1"):
        udpo(dual_clip=0.5)  # checked as the config checks it


# baseline and replay weights ---------------------------------------------------------------------------
REWARDS = [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5], [1.0, 1.0]]


def test_batch_mean_baseline():
    b = batch([[[[-1.0]], [[-1.0]]]] * 4, REWARDS, group_ids=["a", "a", "b", "b"])
    adv = udpo(eta=(0.0, 0.0)).advantages(b).values
    # column means 0.625 and 0.625
    assert torch.allclose(adv, torch.tensor(REWARDS) - 0.625)


def test_group_mean_baseline():
    b = batch([[[[-1.0]], [[-1.0]]]] * 4, REWARDS, group_ids=["a", "a", "b", "c"])
    adv = udpo(eta=(0.0, 0.0), baseline="group").advantages(b).values
    # group a: means (0.5, 0.5); b and c are alone: advantage 0
    assert torch.allclose(adv, torch.tensor([[0.5, -0.5], [-0.5, 0.5], [0.0, 0.0], [0.0, 0.0]]))
    assert torch.allclose(
        group_mean(torch.tensor([1.0, 3.0, 5.0]), ["x", "y", "x"]), torch.tensor([3.0, 3.0, 3.0])
    )


def test_replay_weights_multiply_the_surrogate():
    b = batch([[[[-1.0]]], [[[-1.0]]]], [[0.0], [0.0]], weights=[1.0, 0.5])
    logp = [leaf([-1.0]), leaf([-1.0])]  # rho = 1
    loss, _ = udpo().loss(b, 0, logp, b.behavior(0), None, torch.tensor([1.0, -1.0]))
    assert loss.item() == pytest.approx(-(1.0 * 1.0 + 0.5 * -1.0) / 2)
    loss.backward()
    assert logp[0].grad.item() == pytest.approx(-0.5) and logp[1].grad.item() == pytest.approx(0.25)


def test_loss_checks_token_counts():
    b = batch([[[[-1.0, -1.0]]]], [[0.0]])
    with pytest.raises(ValueError, match="debate 0: 3 log-probs for agent 0's 2 generated tokens"):
        udpo().loss(b, 0, [torch.zeros(3)], b.behavior(0), None, torch.zeros(1))


def test_missing_behavior_logprobs_are_reported():
    t = trajectory("q", [[[-1.0, -1.0]]])
    t.turns[0][0].logprobs = []
    b = RolloutBatch.from_trajectories([t], torch.zeros(1, 1), {})
    with pytest.raises(ValueError, match="fill_behavior_logprobs"):
        b.behavior(0)


# rewards (eq. 4) and ablations ---------------------------------------------------------------------------
# agent 0: 1 1 1, agent 1: 2 1 1, agent 2: 2 2 1 (N = 3, T = 2), gold "1"
# r_intra = 1 - 2 flips / 6 = 2/3; C_t = 2/3, 2/3, 0 so r_inter = 1 - 4/9 = 5/9; unanimous end: r_sys = 1
ANSWERS = [["1", "1", "1"], ["2", "1", "1"], ["2", "2", "1"]]
TERMS = {"r_intra": 2 / 3, "r_inter": 5 / 9, "r_sys": 1.0, "r_task": 1.0}
COEF = Coefficients(
    alpha=[1, 2, 3], beta=[0.5, 0.5, 1], gamma=[0.25, 1, 2], lambda_=[1, 0.5, 0], eta=[0, 0, 0]
)


def answer_trajectory(correct=True) -> Trajectory:
    return trajectory("q", [[[-1.0]] * 3] * 3, answers=ANSWERS, correct=correct)


def hand_reward(c: Coefficients, i: int, r_task: float = 1.0) -> float:
    t = TERMS
    return (
        c.alpha[i] * t["r_intra"] + c.beta[i] * t["r_inter"] + c.gamma[i] * t["r_sys"] + c.lambda_[i] * r_task
    )


def test_compute_rewards_matches_hand_values():
    rewards, terms = compute_rewards([answer_trajectory(), answer_trajectory(correct=False)], COEF)
    assert rewards.shape == (2, 3)
    for name, value in TERMS.items():
        assert terms[name][0].item() == pytest.approx(value)
    assert terms["r_task"].tolist() == [1.0, 0.0]  # the trajectory's own verdict
    for i in range(3):
        assert rewards[0, i].item() == pytest.approx(hand_reward(COEF, i))
        assert rewards[1, i].item() == pytest.approx(hand_reward(COEF, i, r_task=0.0))


@pytest.mark.parametrize(
    ("ablation", "coef", "term"),
    [("intra", "alpha", "r_intra"), ("inter", "beta", "r_inter"), ("sys", "gamma", "r_sys")],
)
def test_ablation_zeroes_exactly_its_term(ablation, coef, term):
    full, _ = compute_rewards([answer_trajectory()], COEF)
    ablated_coef = COEF.without(ablation)
    assert getattr(ablated_coef, coef) == (0.0, 0.0, 0.0)
    ablated, _ = compute_rewards([answer_trajectory()], ablated_coef)
    for i in range(3):
        assert (full - ablated)[0, i].item() == pytest.approx(getattr(COEF, coef)[i] * TERMS[term])
    with pytest.raises(ValueError, match="unknown ablation"):
        COEF.without("task")


def test_agent_scope_rewards():
    # per agent: r_intra_i = 1 - flips_i / T = 1, 1/2, 1/2; r_inter_i = 1/2, 2/3, 1/2; r_sys_i = 1 (L_i = 0)
    rewards, terms = compute_rewards(
        [answer_trajectory()], Coefficients.uniform(3, 1, 1, 1, 0, 0), scope="agent"
    )
    assert torch.allclose(terms["r_intra"][0], torch.tensor([1.0, 0.5, 0.5]))
    assert torch.allclose(terms["r_inter"][0], torch.tensor([0.5, 2 / 3, 0.5]))
    assert torch.allclose(rewards[0], torch.tensor([1 + 0.5 + 1, 0.5 + 2 / 3 + 1, 0.5 + 0.5 + 1]))


def test_coefficients_from_calibration_and_dict():
    from udpo.rewards import calibrate

    cal = calibrate([ANSWERS, ANSWERS], ["1", "2"], base_weights=(0.5, 0.3, 0.2))
    c = Coefficients.from_calibration(cal)
    assert c.alpha == pytest.approx(tuple(cal.alpha)) and c.eta == pytest.approx(tuple(cal.eta))
    assert Coefficients.from_dict(cal.to_dict()) == c
    assert Coefficients.from_dict(c.to_dict()) == c
    with pytest.raises(ValueError, match="one value per agent"):
        Coefficients([1, 1], [1], [1], [1], [1])
    with pytest.raises(ValueError, match="finite and >= 0"):
        Coefficients([-1], [1], [1], [1], [1])


def test_batch_metrics_report_terms_and_advantages():
    rewards, terms = compute_rewards([answer_trajectory(), answer_trajectory(correct=False)], COEF)
    b = RolloutBatch.from_trajectories([answer_trajectory(), answer_trajectory(False)], rewards, terms)
    algo = UDPO(COEF)
    metrics = algo.batch_metrics(b, algo.advantages(b))
    assert metrics["reward/r_task"] == pytest.approx(0.5)
    assert metrics["reward/r_intra"] == pytest.approx(2 / 3)
    assert metrics["advantage/mean"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["reward/agent_0"] == pytest.approx((hand_reward(COEF, 0) + hand_reward(COEF, 0, 0.0)) / 2)
