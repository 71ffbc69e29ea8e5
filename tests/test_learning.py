"""End-to-end learning check: the real trainer must raise a trivially learnable reward within a minute.

The only reward is the length penalty ``udpo.algorithms.reward_functions:concise`` (the uncertainty and task terms
and the KL anchor are switched off), so every optimizer step should shorten the agents' responses. If
the gradient path breaks anywhere (log-probs, ratios, advantages, the optimizer, adapter switching), the
reward stays flat and this test fails.

The team is the tiny random model of tests/tiny_models.py with its end-of-turn token favoured
(``favour={"<|im_end|>": 6}``): untrained, its replies end at random, about 30 of 48 tokens on average, and
LoRA can learn to end them sooner. Measured over seeds 0, 1 and 2: the last three iterations' responses
are 67-83% shorter than the first three's; with a learning rate of 1e-9 (no learning), 8% shorter.
"""

from __future__ import annotations

import numpy as np
import pytest
from tiny_models import build_tiny_llama
from train_helpers import read_jsonl, tiny_config

from udpo.training.trainer import Trainer

TERM = "reward/udpo.algorithms.reward_functions:concise"


@pytest.fixture(scope="module")
def stopping_model(tokenizer_path, tmp_path_factory) -> str:
    """The tiny model whose replies end at random, now and then before max_tokens."""
    folder = tmp_path_factory.mktemp("stopping_model")
    return build_tiny_llama(folder, tokenizer_path, initializer_range=0.3, favour={"<|im_end|>": 6.0})


@pytest.mark.slow
def test_the_trainer_raises_a_learnable_reward(stopping_model, tmp_path):
    config = tiny_config(
        stopping_model,
        tmp_path / "run",
        max_tokens=48,
        questions_per_iteration=4,
        max_iterations=8,
        learning_rate=5e-3,
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
    assert first < -0.15, reward.round(3).tolist()  # the untrained team's replies are long enough to shorten
    # responses at least 50% shorter: e.g. 30 -> 15 tokens
    assert last > 0.5 * first, reward.round(3).tolist()
    assert all(r["update/loss"] == r["update/loss"] for r in train)  # never NaN
