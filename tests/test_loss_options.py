"""The loss options every algorithm shares (issue 24; docs/algorithms.md, "Options every algorithm shares"):
the KL loss's true gradient, advantage normalisation per batch or per agent, one length normalisation, the
sampler/trainer importance weights, the group baseline of the actor-critic baselines, the critic's explained
variance, RMAAC's swap rate and the learning-rate warm-up whose first step moves."""

from __future__ import annotations

import math

import pytest
import torch
from test_actor_critic import TableCritic, batch_of, debate, mappo_settings
from test_objective import batch, leaf, udpo

from udpo.algorithms.actor_critic import explained_variance
from udpo.algorithms.base import correction_weights, kl_estimate, normalize_advantages
from udpo.algorithms.mappo import MAPPO
from udpo.algorithms.rmaac import RMAAC
from udpo.config import AlgorithmArgs
from udpo.env.protocols.adversary import critic_state
from udpo.training.update import lr_factor, mismatch_stats


# --- item 7: the KL loss's gradient -----------------------------------------------------------------------
def kl(p_log: torch.Tensor, q_log: torch.Tensor) -> torch.Tensor:
    """KL(p || q) of two categorical distributions given as log-probabilities."""
    return (p_log.exp() * (p_log - q_log)).sum()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k3_has_the_gradient_of_kl_ref_theta_and_k2_of_kl_theta_ref(seed):
    """On a 6-way categorical: the expected gradient of the loss over samples y ~ pi_theta (the sampling
    distribution held fixed, as when a loss is differentiated on drawn tokens) equals the exact gradient
    of KL(ref || theta) for k3 and of KL(theta || ref) for k2; k3's is not KL(theta || ref)'s."""
    g = torch.Generator().manual_seed(seed)
    theta = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
    ref = torch.randn(6, generator=g, dtype=torch.float64).log_softmax(0)

    def expected_loss_grad(kind: str) -> torch.Tensor:
        logp = theta.log_softmax(0)
        pi = logp.exp().detach()  # E_{y ~ pi_theta}: weights of the samples, not differentiated
        (grad,) = torch.autograd.grad((pi * kl_estimate(logp, ref, kind)).sum(), theta)
        return grad

    (forward,) = torch.autograd.grad(kl(ref, theta.log_softmax(0)), theta)  # KL(ref || theta)
    (reverse,) = torch.autograd.grad(kl(theta.log_softmax(0), ref), theta)  # KL(theta || ref)
    assert torch.allclose(expected_loss_grad("k3"), forward, atol=1e-12)
    assert torch.allclose(expected_loss_grad("k2"), reverse, atol=1e-12)
    assert not torch.allclose(expected_loss_grad("k3"), reverse, atol=1e-3)
    # the value of k3 still estimates KL(theta || ref) without bias
    logp = theta.detach().log_softmax(0)
    assert (logp.exp() * kl_estimate(logp, ref, "k3")).sum().item() == pytest.approx(kl(logp, ref).item())


def test_udpo_uses_the_configured_kl_loss():
    b = batch([[[[-1.0, -2.0]]]], [[0.0]])
    logp, ref = leaf([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    _, k3 = udpo(eta=(1.0,), kl_loss="k3").loss(b, 0, [logp], b.behavior(0), [ref], torch.tensor([0.0]))
    _, k2 = udpo(eta=(1.0,), kl_loss="k2").loss(b, 0, [logp], b.behavior(0), [ref], torch.tensor([0.0]))
    r = torch.tensor([-0.5, 1.0])
    assert k3["kl"] == pytest.approx((r.exp() - r - 1).sum().item(), rel=1e-6)
    assert k2["kl"] == pytest.approx((0.5 * r**2).sum().item(), rel=1e-6)


# --- item 1: advantage normalisation ------------------------------------------------------------------------
def test_agent_normalisation_uses_each_agents_own_statistics():
    a = torch.tensor([[1.0, 10.0], [3.0, 30.0], [2.0, 20.0]])
    per_agent = normalize_advantages(a, "agent")
    assert per_agent[:, 0].tolist() == pytest.approx([-1.0, 1.0, 0.0], abs=1e-6)  # mean 2, std 1
    assert per_agent[:, 1].tolist() == pytest.approx([-1.0, 1.0, 0.0], abs=1e-6)  # mean 20, std 10
    whole = normalize_advantages(a, "batch")
    assert whole.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert whole.flatten().std().item() == pytest.approx(1.0, abs=1e-6)
    assert torch.equal(normalize_advantages(a, "none"), a)


def test_masked_normalisation_leaves_missing_rounds_at_zero():
    a = torch.tensor([[[1.0, 5.0]], [[3.0, 7.0]]])  # [M=2, N=1, K=2]
    mask = torch.tensor([[[True, False]], [[True, True]]])
    out = normalize_advantages(a, "agent", mask)
    assert out[0, 0, 1].item() == 0.0
    picked = out[mask]
    assert picked.mean().item() == pytest.approx(0.0, abs=1e-6)


def test_udpo_group_baseline_then_agent_normalisation():
    # two questions, two debates each, two agents: A = r - group mean, then each agent's own scale
    b = batch(
        [[[[-1.0]], [[-1.0]]]] * 4,
        [[1.0, 0.0], [0.0, 2.0], [1.0, 4.0], [1.0, 0.0]],
        group_ids=["a", "a", "b", "b"],
    )
    plain = udpo(eta=(0.0, 0.0), baseline="group").advantages(b).values
    assert plain[:, 0].tolist() == pytest.approx([0.5, -0.5, 0.0, 0.0])
    assert plain[:, 1].tolist() == pytest.approx([-1.0, 1.0, 2.0, -2.0])
    scaled = udpo(eta=(0.0, 0.0), baseline="group", advantage_norm="agent").advantages(b).values
    for i in range(2):
        assert scaled[:, i].std().item() == pytest.approx(1.0, abs=1e-5)


def test_mappo_group_baseline_puts_the_group_mean_reward_in_place_of_the_first_value():
    # one question debated twice: team rewards 1 and 0 (w_consensus 0); the critic says 0.9 for s_0
    right, wrong = debate([["4", "4"], ["4", "4"]], True), debate([["4", "5"], ["5", "5"]], False)
    s0 = critic_state("2+2?", None)
    cfg = {"w_consensus": 0.0, "gae_lambda": 1.0, "advantage_norm": "none"}
    critic = TableCritic({s0: 0.9})
    mappo = MAPPO(critic, mappo_settings(**cfg))
    plain = mappo.advantages(batch_of(mappo, [right, wrong])).values
    group = MAPPO(critic, mappo_settings(**cfg, baseline="group"))
    adv = group.advantages(batch_of(group, [right, wrong])).values
    # lam = 1: A_0 = R - V(s_0), with V(s_0) = 0.5 (the group mean) instead of 0.9
    assert plain[:, 0, 0].tolist() == pytest.approx([0.1, -0.9])
    assert adv[:, 0, 0].tolist() == pytest.approx([0.5, -0.5])
    assert adv[:, 0, 1].tolist() == plain[:, 0, 1].tolist()  # later rounds keep the critic's values


# --- item 4: one length normalisation -------------------------------------------------------------------------
def test_loss_aggregation_sum_and_mean_for_udpo_and_mappo():
    # UDPO, trajectory ratio at rho = 1: sum -> -A, mean -> -A / tokens (3 tokens over two rounds)
    b = batch([[[[-1.0, -1.0], [-1.0]]]], [[0.0]])
    logp = [torch.tensor([-1.0, -1.0, -1.0])]
    loss_sum, _ = udpo(loss_aggregation="sum").loss(b, 0, logp, b.behavior(0), None, torch.tensor([1.5]))
    loss_mean, _ = udpo(loss_aggregation="mean").loss(b, 0, logp, b.behavior(0), None, torch.tensor([1.5]))
    assert (loss_sum.item(), loss_mean.item()) == pytest.approx((-1.5, -0.5))
    assert (
        udpo().settings.resolved_loss_aggregation == "sum"
        and udpo(ratio_level="token").settings.resolved_loss_aggregation == "mean"
    )
    # MAPPO at rho = 1: tokens (2, 1) with round advantages (1, 4): mean -(2 + 4) / 3, sum -(2 + 4)
    t = debate([["4", "4"], ["4", "4"]])
    advantages = torch.tensor([[1.0, 4.0]])
    for how, expected in (("mean", -2.0), ("sum", -6.0)):
        algo = MAPPO(TableCritic(), mappo_settings(loss_aggregation=how), eta=0.0)
        b = batch_of(algo, [t])
        loss, _ = algo.loss(b, 0, [torch.full((3,), -1.0)], b.behavior(0), None, advantages)
        assert loss.item() == pytest.approx(expected)


def test_auto_is_resolved_in_the_config_alone_for_every_algorithm():
    """advantage_norm and loss_aggregation ``auto`` are resolved by the run's algorithm settings, which every
    algorithm is given and reads; an algorithm refuses another algorithm's settings."""
    cases = {
        ("udpo", "trajectory"): ("none", "sum"),
        ("udpo", "token"): ("none", "mean"),
        ("mappo", "trajectory"): ("batch", "mean"),
        ("rmaac", "trajectory"): ("batch", "mean"),
    }
    for (name, level), expected in cases.items():
        settings = AlgorithmArgs(algorithm=name, ratio_level=level)
        assert (settings.resolved_advantage_norm, settings.resolved_loss_aggregation) == expected
    given = AlgorithmArgs(algorithm="mappo", advantage_norm="agent", loss_aggregation="sum")
    assert (given.resolved_advantage_norm, given.resolved_loss_aggregation) == ("agent", "sum")
    assert MAPPO(TableCritic(), given).settings is given
    with pytest.raises(ValueError, match="mappo was given the settings of algorithm 'udpo'"):
        MAPPO(TableCritic(), AlgorithmArgs())


# --- item 8: sampler/trainer importance weights ---------------------------------------------------------------
def test_truncated_importance_weights_per_token_per_debate_and_mask():
    b = batch([[[[-1.0, -1.0]]], [[[-1.0, -1.0]]], [[[-1.0]]]], [[0.0], [0.0], [0.0]])
    engine_logratio = {
        0: torch.tensor([math.log(3.0), math.log(0.5)]),  # trainer/engine ratios 3 and 0.5
        1: torch.tensor([math.log(1.5), math.log(1.2)]),  # debate ratio 1.8
    }  # debate 2 has no engine record: weight 1
    behavior = b.behavior(0, engine_logratio=engine_logratio)
    tok, info = correction_weights(behavior, "tis", 2.0, True, "cpu")
    assert [w.tolist() for w in tok] == [pytest.approx([2.0, 0.5]), pytest.approx([1.5, 1.2]), [1.0]]
    assert info["is_clipped_frac"] == pytest.approx(1 / 5)
    seq, _ = correction_weights(behavior, "tis", 2.0, False, "cpu")
    assert [w.item() for w in seq] == pytest.approx([1.5, 1.8, 1.0])
    masked, info = correction_weights(behavior, "mask", 1.7, False, "cpu")
    assert [w.item() for w in masked] == [1.0, 0.0, 1.0]  # 1.5 inside [1/1.7, 1.7], 1.8 outside
    assert info["is_clipped_frac"] == pytest.approx(1 / 3)
    none, _ = correction_weights(behavior, "none", 2.0, True, "cpu")
    assert all(bool((w == 1).all()) for w in none)


def test_udpo_surrogate_is_weighted_by_the_truncated_ratio():
    b = batch([[[[-1.0, -1.0]]]], [[0.0]])
    behavior = b.behavior(
        0, engine_logratio={0: torch.tensor([math.log(3.0), 0.0])}
    )  # ratio 3, truncated to 2
    logp = [torch.tensor([-1.0, -1.0])]
    plain, _ = udpo().loss(b, 0, logp, behavior, None, torch.tensor([1.0]))
    weighted, info = udpo(is_correction="tis").loss(b, 0, logp, behavior, None, torch.tensor([1.0]))
    assert (plain.item(), weighted.item()) == pytest.approx((-1.0, -2.0))
    assert info["is_weight_mean"] == pytest.approx(2.0)


def test_mismatch_statistics_by_hand():
    d = [torch.tensor([0.1, -0.3]), torch.tensor([0.2])]
    stats = mismatch_stats(d)
    assert stats["mismatch/abs_mean"] == pytest.approx(0.2)
    assert stats["mismatch/abs_max"] == pytest.approx(0.3)
    assert stats["mismatch/engine_minus_trainer"] == pytest.approx(0.0, abs=1e-7)
    x = torch.tensor([0.1, -0.3, 0.2])
    assert stats["mismatch/kl"] == pytest.approx((x.exp() - x - 1).mean().item())
    assert stats["mismatch/tokens"] == 3.0
    assert mismatch_stats([]) == {}


# --- item 4: critic diagnostics ----------------------------------------------------------------------------------
def test_explained_variance_by_hand():
    targets = torch.tensor([1.0, 2.0, 3.0])
    assert explained_variance(targets, targets) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(3), targets) == pytest.approx(0.0)
    # residuals (0.5, 0, -0.5): variance 1/6 against 2/3
    assert explained_variance(torch.tensor([0.5, 2.0, 3.5]), targets) == pytest.approx(0.75)
    assert math.isnan(explained_variance(torch.zeros(2), torch.ones(2)))


def test_mappo_logs_the_explained_variance_and_rmaac_the_swap_rate():
    s0 = critic_state("2+2?", None)
    t = debate([["4", "4"], ["5", "4"]], True)
    algo = MAPPO(TableCritic({s0: 1.0}), mappo_settings(w_consensus=0.0, gae_lambda=1.0))
    b = batch_of(algo, [t])
    metrics = algo.batch_metrics(b, algo.advantages(b))
    # one debate: values (1, 0) for the targets (1, 1), which do not vary: no explained variance
    assert math.isnan(metrics["critic/explained_variance"])
    swap = {"peer": [1], "answer": ["7"], "value": 0.1, "clean_value": 0.2}
    rm = RMAAC(TableCritic())
    swapped = debate([["4", "4"], ["5", "4"]], True, details={(0, 1): {"adversary": swap}})
    rb = batch_of(rm, [swapped])
    # two turns after round 0 (one per agent), one of them read a swapped answer
    assert rm.batch_metrics(rb, rm.advantages(rb))["adversary/swap_rate"] == pytest.approx(0.5)


# --- item 6: the warm-up's first step moves ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["cosine", "linear", "constant"])
def test_the_first_optimizer_step_moves_and_the_warmup_reaches_the_peak(kind):
    p = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([p], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, warmup=3, total=10, kind=kind)
    )
    rates = []
    for _ in range(10):
        rates.append(optimizer.param_groups[0]["lr"])
        p.grad = torch.ones(1)
        optimizer.step()
        scheduler.step()
    assert rates[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])  # (step + 1) / (warmup + 1), then the peak
    assert p.item() == pytest.approx(1 - sum(rates))
    if kind == "cosine":
        assert rates[4] == pytest.approx(0.5 * (1 + math.cos(math.pi / 7)))
    if kind == "linear":
        assert rates[9] == pytest.approx(1 - 6 / 7)
    assert lr_factor(0, warmup=0, total=10, kind=kind) == 1.0
