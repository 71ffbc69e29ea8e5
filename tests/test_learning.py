"""End-to-end learning check: the real trainer must raise a trivially learnable reward within minutes.

The only reward is the length penalty ``udpo.algorithms.reward_functions:concise`` (the uncertainty and task terms
and the KL anchor are switched off), so every optimizer step should shorten the agents' responses. If
the gradient path breaks anywhere (log-probs, ratios, advantages, the optimizer, adapter switching), the
reward stays flat and this test fails.
"""

from __future__ import annotations

import numpy as np
import pytest
from train_helpers import read_jsonl, tiny_config

from udpo.training.trainer import Trainer

TERM = "reward/udpo.algorithms.reward_functions:concise"


@pytest.mark.slow
def test_the_trainer_raises_a_learnable_reward(model_path, tmp_path):
    config = tiny_config(
        model_path,
        tmp_path / "run",
        max_tokens=48,
        questions_per_iteration=4,
        max_iterations=12,
        learning_rate=2e-3,
        warmup_fraction=0.0,
        alpha=[0.0],
        beta=[0.0],
        gamma=[0.0],
        lambda_=[0.0],
        eta=[0.0],
        reward_functions=["udpo.algorithms.reward_functions:concise"],
        eval_questions=0,
        save_steps=100,
    )
    trainer = Trainer(config)
    try:
        trainer.train()
    finally:
        trainer.close()
    train = [r for r in read_jsonl(trainer.run_dir / "metrics.jsonl") if r["kind"] == "train"]
    reward = np.array([r[TERM] for r in train])  # minus mean response length / 100 tokens
    first, last = reward[:3].mean(), reward[-3:].mean()
    # responses at least 25% shorter: e.g. 40 -> 30 tokens (the untrained team mostly runs to 48)
    assert last > 0.75 * first, reward.round(3).tolist()
    assert all(r["update/loss"] == r["update/loss"] for r in train)  # never NaN
