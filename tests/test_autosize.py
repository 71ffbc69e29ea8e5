"""The update's auto sizes (udpo.training.autosize) against numbers worked out by hand.

The shape below keeps 73,728 bytes per position and layer ((20 x 1024 + 4 x 4096) x 2), 589,824 per
position through its 8 layers (16,384 with checkpointing: 8 x 1024 x 2) and 10,000 per scored token's
logits (1000 x (2 + 8)); a debate of 1000 positions and 200 scored tokens so keeps 591,824,000 bytes
(18,384,000 with checkpointing).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from udpo.config import ConfigError, TrainConfig
from udpo.training import autosize
from udpo.training.autosize import ModelShape, UpdatePlan, Workload, plan_update

SHAPE = ModelShape(hidden=1024, layers=8, vocab=1000, dtype_bytes=2, intermediate=4096)
WORK = Workload(debates=8, splits=8, tokens=1000, completions=200)


def test_the_estimate_per_position_and_per_scored_token():
    assert SHAPE.layer_bytes() == 73_728
    assert SHAPE.token_bytes(checkpointing=False) == 589_824
    assert SHAPE.token_bytes(checkpointing=True) == 16_384
    assert SHAPE.logit_bytes() == 10_000
    assert autosize.micro_batch_bytes(SHAPE, WORK, 1, False, 4096) == 8 * 591_824_000
    # 3 micro-batches of 8 debates: the largest holds 3; checkpointing adds one layer over a pass
    assert autosize.micro_batch_bytes(SHAPE, WORK, 3, False, 4096) == 3 * 591_824_000
    assert autosize.micro_batch_bytes(SHAPE, WORK, 1, True, 1024) == 8 * 18_384_000 + 1024 * 73_728
    assert ModelShape(hidden=10, layers=1, vocab=1, dtype_bytes=4).layer_bytes() == (200 + 160) * 4


def test_more_micro_batches_before_gradient_checkpointing():
    # 2e9 bytes free, 1.4e9 usable: a pass of 1.4e9 / 4 / 83,728 = 4180 positions -> 4096; 1, 2 and 3
    # micro-batches hold 8, 4 and 3 debates (4.73e9, 2.37e9, 1.78e9 bytes); 4 hold 2 (1.18e9): they fit
    plan = plan_update(SHAPE, WORK, free_bytes=2_000_000_000)
    assert plan == UpdatePlan(4096, 4, False, 2 * 591_824_000, 2_000_000_000)
    # 5e8 free, 3.5e8 usable: one debate alone (5.9e8) does not fit; with checkpointing all 8 do
    # (8 x 18,384,000 + 1024 x 73,728 = 222,569,472) in passes of 1024 positions (87.5e6 / 83,728 = 1045)
    plan = plan_update(SHAPE, WORK, free_bytes=500_000_000)
    assert plan == UpdatePlan(1024, 1, True, 222_569_472, 500_000_000)


def test_the_token_budget_stays_within_its_range():
    assert plan_update(SHAPE, WORK, free_bytes=10**12).logprob_token_budget == 65536
    assert plan_update(SHAPE, WORK, free_bytes=10**6).logprob_token_budget == 512


def test_a_recipe_value_is_kept_and_the_rest_chosen_around_it():
    # 2 micro-batches (4 debates: 2.37e9 bytes) do not fit 1.4e9 without checkpointing; with it they do
    plan = plan_update(SHAPE, WORK, 2_000_000_000, {"gradient_accumulation_steps": 2})
    assert (plan.gradient_accumulation_steps, plan.gradient_checkpointing) == (2, True)
    # checkpointing off by the recipe and nothing fits: the smallest micro-batches, still without it
    plan = plan_update(SHAPE, WORK, 500_000_000, {"gradient_checkpointing": False})
    assert (plan.gradient_accumulation_steps, plan.gradient_checkpointing) == (8, False)
    # every value given: the plan is the recipe's, whatever the memory
    given = {"logprob_token_budget": 300, "gradient_accumulation_steps": 1, "gradient_checkpointing": False}
    plan = plan_update(SHAPE, WORK, 1000, given)
    assert (plan.logprob_token_budget, plan.gradient_accumulation_steps, plan.gradient_checkpointing) == (
        300,
        1,
        False,
    )


def test_the_workload_bound_of_a_config():
    config = TrainConfig(questions_per_iteration=32, n_agents=3, rounds=2, max_tokens=64)
    # rows: 256 + 6 messages x 16 + (3 own + 2 x 2 peers') x 64 = 800 positions; 3 x 64 scored tokens
    assert Workload.bound(config, world=1) == Workload(debates=32, splits=32, tokens=800, completions=192)
    # replay adds round(32 x 0.25 / 0.75) = 11 debates to size for, but no micro-batch to split into
    replay = TrainConfig(questions_per_iteration=32, n_agents=3, rounds=2, max_tokens=64, replay=True)
    assert Workload.bound(replay, world=2) == Workload(debates=22, splits=16, tokens=800, completions=192)


def test_auto_keeps_the_fixed_defaults_on_a_cpu():
    config = TrainConfig()
    assert config.logprob_token_budget is None and config.gradient_accumulation_steps is None
    resolved, plan = autosize.resolve(config, [], world=1, device="cpu")
    assert (resolved.logprob_token_budget, resolved.gradient_accumulation_steps) == (4096, 1)
    assert resolved.gradient_checkpointing is False and config.logprob_token_budget is None
    assert plan.describe(["logprob_token_budget"]) == (
        "update sizes: logprob_token_budget=4096 (auto), gradient_accumulation_steps=1, "
        "gradient_checkpointing=false"
    )
    given, _ = autosize.resolve(TrainConfig(logprob_token_budget=512), [], world=1, device="cpu")
    assert given.logprob_token_budget == 512


def test_on_a_gpu_the_free_memory_sizes_the_update(monkeypatch):
    model = SimpleNamespace(
        config=SimpleNamespace(
            hidden_size=1024, num_hidden_layers=8, vocab_size=1000, intermediate_size=4096
        ),
        parameters=lambda: iter([torch.zeros(1, dtype=torch.bfloat16)]),
    )
    assert ModelShape.of(model) == SHAPE
    # 4 GiB of the free memory go to the hf backend's graph decode buffers (2 x kv_cache_gib 2), 5e8 left
    free = 500_000_000 + 4 * 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * 2**30))
    config = TrainConfig(questions_per_iteration=8, n_agents=3, rounds=2, max_tokens=64)
    resolved, plan = autosize.resolve(config, [model], world=1, device="cuda:0")
    # 8 debates of 800 positions and 192 scored tokens: 8 x (800 x 16,384 + 1,920,000) + 1024 x 73,728
    # = 195,713,024 bytes with checkpointing fit 3.5e8; one debate without (473,779,200) does not
    assert (resolved.gradient_checkpointing, resolved.gradient_accumulation_steps) == (True, 1)
    assert resolved.logprob_token_budget == 1024 and plan.peak_bytes == 195_715_072
    assert plan.kept_bytes == 4 * 2**30
    assert "0.2 GiB of 4.5 GiB free, 4.0 GiB of it kept for the decode buffers" in plan.describe([])


def test_the_decode_buffers_the_rollouts_keep_are_set_aside_before_sizing():
    """2e9 bytes free, 5e8 of them kept by the decoder: 1.05e9 usable, passes of 1.05e9 / 4 / 83,728 =
    3135 positions -> 2048; 4 to 7 micro-batches hold 2 debates (1.18e9 bytes: too many), 8 hold one
    (5.9e8): they fit. Without the decoder's share, 4 micro-batches would have been planned."""
    plan = plan_update(SHAPE, WORK, free_bytes=2_000_000_000, kept_bytes=500_000_000)
    assert plan == UpdatePlan(2048, 8, False, 591_824_000, 2_000_000_000, kept_bytes=500_000_000)
    assert plan_update(SHAPE, WORK, free_bytes=2_000_000_000).gradient_accumulation_steps == 4
    # what each engine keeps per base model: the hf backend's stacked paths 2 x kv_cache_gib (2 GiB)
    gib = 2**30
    hf = TrainConfig()
    assert autosize.decode_kept_bytes(hf, "cuda:0") == 4 * gib  # auto: the CUDA graph
    assert autosize.decode_kept_bytes(hf, "cpu") == 0  # auto: the eager loop, which keeps none
    assert autosize.decode_kept_bytes(TrainConfig(hf_decode="stacked"), "cpu") == 4 * gib
    assert autosize.decode_kept_bytes(TrainConfig(hf_decode="eager"), "cuda:0") == 0
    assert autosize.decode_kept_bytes(TrainConfig(backend="vllm"), "cuda:0") == 0


def test_auto_sizes_are_null_in_a_recipe_and_explicit_ones_still_checked():
    with pytest.raises(ConfigError, match="logprob_token_budget must be >= 1"):
        TrainConfig(logprob_token_budget=0).check()
    with pytest.raises(ConfigError, match="gradient_accumulation_steps=3 splits an update of 2"):
        TrainConfig(questions_per_iteration=2, gradient_accumulation_steps=3).check()
    TrainConfig().check()


def test_the_resolved_sizes_are_checked_against_the_processes_once():
    """check_sizes runs on the resolved config (what load_training_data checked on the auto value before):
    each of the processes needs a debate per micro-batch."""
    import dataclasses

    config = TrainConfig(questions_per_iteration=2, debates_per_question=1)
    resolved, _ = autosize.resolve(config, [], world=2, device="cpu")  # 2 debates, 1 each, 1 micro-batch
    with pytest.raises(
        ValueError, match="2 debates cannot be shared by 3 processes with gradient_accumulation_steps=1 "
    ):
        autosize.resolve(config, [], world=3, device="cpu")
    halves = dataclasses.replace(resolved, gradient_accumulation_steps=2)
    autosize.check_sizes(halves, world=1)  # one process, its 2 debates in 2 micro-batches
    with pytest.raises(
        ValueError, match="by 2 processes with gradient_accumulation_steps=2 micro-batches each"
    ):
        autosize.check_sizes(halves, world=2)
