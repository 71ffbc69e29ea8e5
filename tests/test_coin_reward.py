"""The negative control's reward (udpo.rewards.coin): a fixed coin per (seed, question, draw) that ignores
every answer, so a learning check can show that the trainer's gains come from correctness."""

from __future__ import annotations

import numpy as np
import pytest
from train_helpers import EXPLICIT, TINY

from udpo.algorithms import build_algorithm
from udpo.algorithms.udpo import UDPO, Coefficients, compute_rewards, group_mean
from udpo.config import ConfigError, TrainConfig
from udpo.env.trajectory import Trajectory
from udpo.rewards import coin, coin_rewards

TASK_ONLY = {"alpha": [0.0], "beta": [0.0], "gamma": [0.0], "lambda_": [1.0], "eta": [0.01]}


def debate(question_id: str, answer: str | None, gold: str = "4") -> Trajectory:
    return Trajectory(question_id, "What is 2 + 2?", gold, [[answer]], answer, answer == gold)


def test_the_coin_is_a_fixed_fair_hash_of_seed_question_and_draw():
    assert coin(0, "q1", 0) == coin(0, "q1", 0) and coin(0, "q1", 0) in (0.0, 1.0)
    flips = np.array([coin(3, f"q{k}", 0) for k in range(2000)])
    assert 0.45 < flips.mean() < 0.55
    # the seed and the draw each change it: about half the coins differ
    assert 0.4 < np.mean([coin(3, f"q{k}", 0) != coin(4, f"q{k}", 0) for k in range(2000)]) < 0.6
    assert 0.4 < np.mean([coin(3, f"q{k}", 0) != coin(3, f"q{k}", 1) for k in range(2000)]) < 0.6
    # debates of one question are its draws 0, 1, ... in batch order, whatever comes between them
    ids = ["a", "b", "a", "a", "b"]
    expected = [coin(7, "a", 0), coin(7, "b", 0), coin(7, "a", 1), coin(7, "a", 2), coin(7, "b", 1)]
    assert coin_rewards(ids, seed=7).tolist() == expected


def test_the_coin_reward_ignores_every_answer():
    coefficients = Coefficients.uniform(1, alpha=0, beta=0, gamma=0, lambda_=1, eta=0.01)
    ids = [f"q{k // 4}" for k in range(40)]  # 10 questions x 4 draws
    right = [debate(q, "4") for q in ids]
    wrong = [debate(q, "5") for q in ids]
    silent = [debate(q, None) for q in ids]
    rewards = [
        compute_rewards(b, coefficients, task_reward="coin", seed=2)[0] for b in (right, wrong, silent)
    ]
    assert all(np.array_equal(rewards[0].numpy(), r.numpy()) for r in rewards)
    assert rewards[0][:, 0].tolist() == coin_rewards(ids, seed=2).tolist()
    assert compute_rewards(right, coefficients)[0].sum() == 40  # the default r_task: correctness
    # draws of one question differ, so the group baseline leaves advantages to learn from
    advantages = rewards[0] - group_mean(rewards[0], ids)
    assert advantages.abs().sum() > 0


def test_a_run_with_task_reward_coin_trains_udpo_on_the_coin(tmp_path):
    """A single agent with no debate round (the proof run's team) is a valid UDPO config: the RMAAC adversary's
    budget is checked for rmaac only."""
    config = TrainConfig(
        **{**TINY, **EXPLICIT, **TASK_ONLY, "n_agents": 1, "rounds": 0, "task_reward": "coin", "seed": 5},
        output_dir=str(tmp_path),
    )
    algorithm = build_algorithm(
        config, config, {"coefficients": Coefficients.uniform(1).to_dict()}, seed=config.seed
    )
    assert isinstance(algorithm, UDPO) and (algorithm.task_reward, algorithm.seed) == ("coin", 5)
    rewards, terms = algorithm.rewards([debate("x", "4"), debate("x", "5")])
    assert terms["r_task"].tolist() == [coin(5, "x", 0), coin(5, "x", 1)]
    with pytest.raises(ConfigError, match="task_reward: coin"):
        TrainConfig(**TINY, algorithm="mappo", task_reward="coin")
    with pytest.raises(ConfigError, match="task_reward"):
        TrainConfig(**TINY, task_reward="dice")
