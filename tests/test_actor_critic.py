"""The MAPPO / RMAAC math (docs/algorithms.md, "The baselines: MAPPO and RMAAC") on hand-computed cases: GAE
over rounds, the team reward, the per-token surrogate with round advantages, the critic loss, and the
adversary's choice within its budget."""

from __future__ import annotations

import math

import pytest
import torch

from udpo.algorithms.actor_critic import gae, per_token, team_rewards
from udpo.algorithms.base import RolloutBatch
from udpo.algorithms.mappo import MAPPO
from udpo.algorithms.rmaac import RMAAC
from udpo.config import AlgorithmArgs
from udpo.env.debate import AgentSpec
from udpo.env.protocols.adversary import (
    RMAACAdversary,
    answer_statement,
    candidate_answers,
    critic_state,
    observed_answers,
)
from udpo.env.protocols.base import DebateState, Message
from udpo.env.tasks import get_task
from udpo.env.tasks.base import Question
from udpo.env.trajectory import Trajectory, Turn


class TableCritic:
    """A critic whose values are a table (missing states: 0) and whose loss gradient reaches ``self.p``."""

    def __init__(self, table: dict[str, float] | None = None):
        self.table = table or {}
        self.p = torch.zeros((), requires_grad=True)
        self.asked: list[list[str]] = []

    def values(self, states, grad=False):
        self.asked.append(list(states))
        return torch.tensor([self.table.get(s, 0.0) for s in states]) + (self.p if grad else 0.0)


def debate(answers, correct=True, tokens=(2, 1), details=None) -> Trajectory:
    """N agents x len(tokens) rounds; agent i's round-r turn has tokens[r] tokens with behavior log-prob -1."""
    n = len(answers)
    turns = [
        [
            Turn(
                agent=i,
                round=r,
                messages=[],
                text="",
                answer=answers[i][r],
                prompt_ids=[1, 2],
                completion_ids=[5] * k,
                logprobs=[-1.0] * k,
                details=(details or {}).get((i, r), {}),
            )
            for r, k in enumerate(tokens)
        ]
        for i in range(n)
    ]
    return Trajectory("q1", "2+2?", "4", [list(a) for a in answers], answers[0][-1], correct, turns=turns)


# --- GAE -------------------------------------------------------------------------------------------------
def test_gae_hand_case():
    # deltas: r2 = 1 + 0 - 0.1 = 0.9, r1 = 0 + 0.1 - 0.5 = -0.4, r0 = 0 + 0.5 - 0.2 = 0.3
    # A2 = 0.9, A1 = -0.4 + 0.5 * 0.9 = 0.05, A0 = 0.3 + 0.5 * 0.05 = 0.325; G = A + V
    a, g = gae(torch.tensor([0.2, 0.5, 0.1]), torch.tensor(1.0), gamma=1.0, lam=0.5)
    assert a.tolist() == pytest.approx([0.325, 0.05, 0.9])
    assert g.tolist() == pytest.approx([0.525, 0.55, 1.0])


def test_gae_with_discount():
    # gamma 0.9, lam 1: A_r = gamma^(K-1-r) R - V(s_r)
    a, g = gae(torch.tensor([[0.3, 0.6]]), torch.tensor([2.0]), gamma=0.9, lam=1.0)
    assert a[0].tolist() == pytest.approx([0.9 * 2.0 - 0.3, 2.0 - 0.6])
    assert g[0].tolist() == pytest.approx([1.8, 2.0])


def test_gae_lambda_zero_is_one_step_td():
    a, _ = gae(torch.tensor([0.2, 0.5, 0.1]), torch.tensor(1.0), gamma=1.0, lam=0.0)
    assert a.tolist() == pytest.approx([0.3, -0.4, 0.9])


def test_per_token_repeats_each_rounds_advantage():
    assert per_token(torch.tensor([1.0, -2.0, 9.0]), [2, 3]).tolist() == [1.0, 1.0, -2.0, -2.0, -2.0]


# --- team reward ------------------------------------------------------------------------------------------
def test_team_reward_is_task_plus_weighted_final_consensus():
    # final answers 4, 4, 5: pairwise conflict C_T = 2/3 (pairs (1,3), (2,3) differ)
    t = debate([["4", "4"], ["3", "4"], ["4", "5"]], correct=True)
    r, terms = team_rewards([t], w_consensus=0.5)
    assert r.tolist() == pytest.approx([1.0 + 0.5 * (1 - 2 / 3)])
    assert terms["consensus"].tolist() == pytest.approx([1 / 3])
    assert terms["r_task"].tolist() == [1.0]


def test_every_agent_gets_the_team_reward():
    t = debate([["4", "4"], ["4", "4"]], correct=False)
    rewards, _ = MAPPO(TableCritic(), mappo_settings(w_consensus=0.25)).rewards([t])
    assert rewards.tolist() == [[0.25, 0.25]]


# --- advantages, actor loss, critic loss ------------------------------------------------------------------
def mappo_settings(**settings) -> AlgorithmArgs:
    """A run's algorithm settings for mappo (the config's defaults but ``settings``)."""
    return AlgorithmArgs(algorithm="mappo", **settings)


def batch_of(algorithm, trajectories) -> RolloutBatch:
    rewards, terms = algorithm.rewards(trajectories)
    return RolloutBatch.from_trajectories(trajectories, rewards, terms)


def test_mappo_advantages_use_the_centralized_state_before_each_round():
    t = debate([["4", "4"], ["5", "4"]], correct=True)
    s0 = critic_state("2+2?", None)
    s1 = critic_state("2+2?", ["4", "5"])
    critic = TableCritic({s0: 0.5, s1: 0.8})
    algo = MAPPO(
        critic, mappo_settings(w_consensus=0.0, gae_gamma=1.0, gae_lambda=1.0, advantage_norm="none")
    )
    out = algo.advantages(batch_of(algo, [t]))
    adv = out.values
    # R = 1; lam = 1: A_r = R - V(s_r)
    assert adv.shape == (1, 2, 2)
    assert adv[0, 0].tolist() == pytest.approx([0.5, 0.2])
    assert adv[0, 1].tolist() == pytest.approx([0.5, 0.2])
    # one target per distinct state: G = A + V = R for both, returned with the advantages
    assert out.critic_targets == [[(s0, pytest.approx(1.0)), (s1, pytest.approx(1.0))]]


def test_normalized_advantages_have_mean_zero_and_unit_std():
    ts = [debate([["4", "4"], ["5", "4"]], True), debate([["1", "2"], ["3", "3"]], False)]
    algo = MAPPO(TableCritic())  # advantage_norm auto: over the batch, as MAPPO does
    adv = algo.advantages(batch_of(algo, ts)).values
    assert adv.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert adv.flatten().std().item() == pytest.approx(1.0, abs=1e-5)


def test_actor_loss_at_ratio_one_is_minus_the_token_mean_advantage():
    # agent 0 spoke 2 tokens in round 0 (A = 1) and 1 token in round 1 (A = -2): token mean = 0
    # agent 0, debate 2: 2 tokens at A = 3, 1 token at A = 0: mean 2; loss = -(0 + 2) / 2
    ts = [debate([["4", "4"], ["4", "4"]]), debate([["4", "4"], ["4", "4"]])]
    algo = MAPPO(TableCritic(), eta=0.0)
    b = batch_of(algo, ts)
    logp = [torch.full((3,), -1.0, requires_grad=True) for _ in ts]
    loss, info = algo.loss(b, 0, logp, b.behavior(0), None, torch.tensor([[1.0, -2.0], [3.0, 0.0]]))
    assert loss.item() == pytest.approx(-1.0)
    assert info["clip_frac"] == 0.0
    loss.backward()
    # d loss / d logp_token = -A_token / (tokens in the debate) / debates
    assert logp[0].grad.tolist() == pytest.approx([-1 / 6, -1 / 6, 2 / 6])


def test_actor_loss_clips_per_token():
    ts = [debate([["4", "4"]], tokens=(1, 1))]
    algo = MAPPO(TableCritic(), mappo_settings(clip_eps=0.2), eta=0.0)
    b = batch_of(algo, ts)
    logp = [torch.tensor([-1.0 + math.log(2.0), -1.0])]  # rho = 2 then 1
    loss, info = algo.loss(b, 0, logp, b.behavior(0), None, torch.tensor([[1.0, 1.0]]))
    assert loss.item() == pytest.approx(-(1.2 + 1.0) / 2)
    assert info["clip_frac"] == pytest.approx(0.5)


def test_actor_loss_adds_the_per_token_kl_anchor():
    ts = [debate([["4", "4"]], tokens=(1, 1))]
    algo = MAPPO(TableCritic(), eta=0.5)
    b = batch_of(algo, ts)
    logp = [torch.tensor([-1.0, -1.0])]
    ref = [torch.tensor([-1.0 + math.log(2.0), -1.0])]  # r = ln 2, 0: k3 = 2 - ln 2 - 1, 0
    loss, info = algo.loss(b, 0, logp, b.behavior(0), ref, torch.zeros(1, 2))
    assert info["kl"] == pytest.approx((1 - math.log(2.0)) / 2)
    assert loss.item() == pytest.approx(0.5 * (1 - math.log(2.0)) / 2)


def test_critic_loss_is_the_mean_squared_error_to_the_targets():
    t = debate([["4", "4"], ["5", "4"]], correct=True)
    s0, s1 = critic_state("2+2?", None), critic_state("2+2?", ["4", "5"])
    critic = TableCritic({s0: 0.5, s1: 0.8})
    algo = MAPPO(critic, mappo_settings(w_consensus=0.0, gae_lambda=1.0, advantage_norm="none"))
    targets = algo.advantages(batch_of(algo, [t])).targets_of([0])
    loss, info = algo.critic_loss(targets)
    assert loss.item() == pytest.approx(((0.5 - 1) ** 2 + (0.8 - 1) ** 2) / 2)
    loss.backward()
    assert critic.p.grad.item() == pytest.approx(2 * ((0.5 - 1) + (0.8 - 1)) / 2)
    with pytest.raises(ValueError, match="no value targets"):
        MAPPO(critic).critic_loss([])


# --- RMAAC: the adversary ---------------------------------------------------------------------------------
def state_after_round0(task, question, answers):
    agents = [AgentSpec() for _ in answers]
    s = DebateState(question, 0, agents)
    for i, a in enumerate(answers):
        s.turns[i].append(Turn(agent=i, round=0, messages=[], text=f"I say {a}", answer=a))
        s.answers[i].append(a)
        s.sent[(i, 0)] = f"I say {a}"
    s.reads = [
        [Message(j, 0, f"I say {answers[j]}") for j in range(len(answers)) if j != i]
        for i in range(len(answers))
    ]
    return s


def test_adversary_picks_the_value_minimizing_swap_within_budget():
    task = get_task("arithmetic")
    q = Question("q1", "What is 2+2?", "4")
    s = state_after_round0(task, q, ["4", "4", "7"])
    # agent 0 reads agents 1 and 2; the critic values "agent 2 says 7" lowest
    target = critic_state(q.text, ["4", "7", "7"])
    adversary = RMAACAdversary(task, lambda texts: [-5.0 if t == target else 0.0 for t in texts], budget=1)
    adversary.select([s], 1)
    assert s.details[0]["adversary"] == {"peer": [1], "answer": ["7"], "value": -5.0, "clean_value": 0.0}
    assert task.parse(s.reads[0][0].text, q) == "7" and s.reads[0][1].text == "I say 7"
    # agent 2 (who says 7) sees the same state when agent 1 is swapped to 7; agent 1 cannot reach it
    assert s.details[2]["adversary"]["peer"] == [1] and "adversary" not in s.details[1]
    assert observed_answers(["4", "4", "7"], s.details[0]["adversary"]) == ["4", "7", "7"]


def test_adversary_respects_the_budget():
    task = get_task("arithmetic")
    q = Question("q1", "What is 2+2?", "4")
    s = state_after_round0(task, q, ["4", "4", "4"])

    # value falls with every peer that says something else: the minimum within budget 1 swaps one peer
    def values(texts):
        return [-float(sum(line.split(": ")[1] != "4" for line in t.splitlines()[1:])) for t in texts]

    one = RMAACAdversary(task, values, budget=1)
    assert all(len(o) <= 1 for o in one.options(s, 0, 1))
    one.select([s], 1)
    assert len(s.details[0]["adversary"]["peer"]) == 1
    s2 = state_after_round0(task, q, ["4", "4", "4"])
    RMAACAdversary(task, values, budget=2).select([s2], 1)
    assert len(s2.details[0]["adversary"]["peer"]) == 2
    s3 = state_after_round0(task, q, ["4", "4", "4"])
    RMAACAdversary(task, values, budget=0).select([s3], 1)
    assert s3.details == [{}, {}, {}]


def test_adversary_options_enumerate_every_swap():
    task = get_task("commonsenseqa")
    q = Question("c1", "Pick one", "B", options=("a", "b", "c"))
    s = state_after_round0(task, q, ["A", "B", "A"])
    options = RMAACAdversary(task, lambda t: [0.0] * len(t), budget=1).options(s, 0, 1)
    # no swap; peer 1 (B) -> A or C; peer 2 (A) -> B or C
    assert options == [[], [(1, "A")], [(1, "C")], [(2, "B")], [(2, "C")]]


def test_answer_statements_parse_back():
    for name, q, value in [
        ("arithmetic", Question("q", "1+1?", "2"), "17"),
        ("commonsenseqa", Question("c", "?", "A", options=("x", "y", "z")), "C"),
    ]:
        task = get_task(name)
        assert task.parse(answer_statement(task, q, value), q) == value


def test_numeric_candidates_include_other_answers_and_a_decoy():
    task = get_task("arithmetic")
    q = Question("q1", "?", "4")
    out = candidate_answers(task, q, "4", ["4", "5", None])
    assert out[0] == "5" and len(out) == 2 and out[1] not in ("4", "5")
    assert out == candidate_answers(task, q, "4", ["4", "5", None])  # the decoy is a function of the question


def test_rmaac_states_are_what_each_agent_observed():
    swap = {"peer": [1], "answer": ["9"], "value": -1.0, "clean_value": 0.0}
    t = debate([["4", "4"], ["5", "4"]], details={(0, 1): {"adversary": swap}})
    algo = RMAAC(TableCritic())
    assert algo.states(t, 0) == [critic_state("2+2?", None), critic_state("2+2?", ["4", "9"])]
    assert algo.states(t, 1) == [critic_state("2+2?", None), critic_state("2+2?", ["4", "5"])]


# --- the critic on a model (the tiny random one of tests/tiny_models.py) ------------------------------------
def test_critic_learns_a_simple_value_function(tiny_model, tmp_path):
    """On a fixed problem (states whose value is 1 when the agents agree on 4, else 0), the critic's loss
    falls; its saved adapter and head load back to the same values."""
    from udpo.algorithms.critic import Critic
    from udpo.training.policy import LoraSettings, MultiAgentPolicy

    torch.manual_seed(0)
    policy = MultiAgentPolicy(model=tiny_model, n_agents=2, lora=LoraSettings(r=8, alpha=16))
    critic = Critic(policy)
    states = [critic_state("What is 2+2?", list(a)) for a in (("4", "4"), ("4", "5"), ("3", "5"), ("5", "4"))]
    targets = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert critic.values(states).tolist() == [0.0] * 4  # the head starts at zero
    opt = torch.optim.AdamW(critic.parameters(), lr=1e-3)
    losses = []
    for _ in range(30):
        loss = ((critic.values(states, grad=True) - targets) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0], losses
    assert all(p.grad is None for p in policy.trainable_parameters())  # the agents' adapters are untouched
    before = critic.values(states)
    critic.save(tmp_path / "critic")
    other = Critic(MultiAgentPolicy(model=tiny_model, n_agents=2, lora=LoraSettings(r=8, alpha=16)))
    other.load(tmp_path / "critic")
    assert torch.allclose(other.values(states), before, atol=1e-5)
