"""The update's auto sizes (udpo.training.autosize) against numbers worked out by hand.

The shape below (bf16, LoRA on q/k/v/o) keeps 49,152 bytes per position and layer: both norms' fp32
inputs (2 x 4 x 1024), queries, keys, values and the attention's output (2 x 4 x 1024), gate, activation
and up (2 x 3 x 4096) and the four adapters' input copies (2 x 4 x 1024); 397,312 per position through
its 8 layers and the final norm (8 x 49,152 + 4 x 1024; 20,480 with checkpointing: 8 x 1024 x 2 + 4096),
and 4000 per scored token's fp32 logits (1000 x 4). A debate of 1000 positions and 200 scored tokens so
keeps 398,112,000 bytes (21,280,000 with checkpointing). At the backward's peak come on top either the
busiest pass's log-softmax temporaries (12 bytes x 1000 x 200 scored tokens per debate in it, up to 8
debates) or a layer's backward over the largest pass: 24,576 bytes per position (3 x 4096 x 2), with
checkpointing also the layer recomputed (73,728 in all); here always the layer's.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from udpo.config import ConfigError, TrainConfig
from udpo.training import autosize
from udpo.training.autosize import ModelShape, UpdatePlan, Workload, plan_update

SHAPE = ModelShape(hidden=1024, layers=8, vocab=1000, dtype_bytes=2, intermediate=4096)
WORK = Workload(debates=8, splits=8, tokens=1000, completions=200)


def test_the_estimate_per_position_and_per_scored_token():
    assert SHAPE.layer_bytes() == 49_152
    assert SHAPE.token_bytes(checkpointing=False) == 397_312
    assert SHAPE.token_bytes(checkpointing=True) == 20_480
    assert SHAPE.logit_bytes() == 4000
    assert SHAPE.backward_bytes() == 24_576
    # the largest pass: 8 rows of 1000 positions, cut to the budget of 4096 (its log-softmax: 19,200,000)
    assert autosize.micro_batch_bytes(SHAPE, WORK, 1, False, 4096) == 8 * 398_112_000 + 4096 * 24_576
    # 3 micro-batches of 8 debates: the largest holds 3, its passes 3 rows
    assert autosize.micro_batch_bytes(SHAPE, WORK, 3, False, 4096) == 3 * 398_112_000 + 3000 * 24_576
    assert autosize.micro_batch_bytes(SHAPE, WORK, 1, True, 1024) == 8 * 21_280_000 + 1024 * 73_728
    # a large vocabulary: the log-softmax's temporaries are the larger (12 x 100,000 x 200 x 8 bytes)
    wide = ModelShape(hidden=1024, layers=8, vocab=100_000, dtype_bytes=2, intermediate=4096)
    assert (
        autosize.micro_batch_bytes(wide, WORK, 1, False, 4096)
        == 8 * (1000 * 397_312 + 200 * 400_000) + 8 * 200 * 1_200_000
    )


def test_the_adapters_inputs_by_precision():
    """fp32: q/k/v read the input norm's output (kept once), o the attention's output (kept anyway), gate/up
    the second norm's output, down the MLP's product; bf16: each adapted module keeps a copy of its own."""
    fp32 = ModelShape(hidden=10, layers=1, vocab=1, dtype_bytes=4)
    # norms 2 x 4 x 10, attention 4 x (2 x 10 + 2 x 10), MLP 3 x 4 x 40, adapters 4 x 10
    assert fp32.layer_bytes() == 80 + 160 + 480 + 40
    every = tuple(autosize.LORA_INPUTS)
    assert ModelShape(hidden=10, layers=1, vocab=1, dtype_bytes=4, adapted=every).lora_bytes() == 4 * (
        10 + 10 + 40
    )
    assert ModelShape(hidden=10, layers=1, vocab=1, dtype_bytes=2, adapted=every).lora_bytes() == 2 * (
        6 * 10 + 40
    )
    # grouped-query attention: 2 key/value heads of 8 for a 64-wide model
    gqa = ModelShape(hidden=64, layers=1, vocab=1, dtype_bytes=2, intermediate=128, kv=16)
    assert gqa.layer_bytes() == 8 * 64 + 2 * (2 * 64 + 2 * 16) + 2 * 3 * 128 + 2 * 4 * 64


def test_more_micro_batches_before_gradient_checkpointing():
    # 2e9 bytes free, 1.4e9 usable: a pass of 1.4e9 / 4 / 53,152 = 6584 positions -> 4096; 1 and 2
    # micro-batches hold 8 and 4 debates (3.29e9, 1.69e9 bytes); 3 hold 3 (1.27e9): they fit
    plan = plan_update(SHAPE, WORK, free_bytes=2_000_000_000)
    assert plan == UpdatePlan(4096, 3, False, 1_268_064_000, 2_000_000_000)
    # 5e8 free, 3.5e8 usable: one debate alone (4.2e8) does not fit; with checkpointing all 8 do
    # (8 x 21,280,000 + 1024 x 73,728 = 245,737,472) in passes of 1024 positions (87.5e6 / 53,152 = 1646)
    plan = plan_update(SHAPE, WORK, free_bytes=500_000_000)
    assert plan == UpdatePlan(1024, 1, True, 245_737_472, 500_000_000)


def test_the_token_budget_stays_within_its_range():
    assert plan_update(SHAPE, WORK, free_bytes=10**12).logprob_token_budget == 65536
    assert plan_update(SHAPE, WORK, free_bytes=10**6).logprob_token_budget == 512


def test_a_recipe_value_is_kept_and_the_rest_chosen_around_it():
    # 2 micro-batches (4 debates: 1.69e9 bytes) do not fit 1.4e9 without checkpointing; with it they do
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
    config = TrainConfig(
        questions_per_iteration=32, debates_per_question=1, n_agents=3, rounds=2, max_tokens=64
    )
    # a row per round: 256 + 64 = 320 positions; 256 + 288 + (1 own + 2 peers' + 1) x 64 = 800;
    # 256 + 2 x 288 + (2 own + 4 peers' + 1) x 64 = 1280; 3 x 64 scored tokens; passes of 8 rows at most
    assert autosize.row_widths(3, 3, 64) == [320, 800, 1280]
    bound = Workload(debates=32, splits=32, tokens=2400, completions=192, width=1280, pass_rows=8)
    assert Workload.bound(config, world=1) == bound
    # replay adds round(32 x 0.25 / 0.75) = 11 debates to size for, but no micro-batch to split into
    replay = TrainConfig(
        questions_per_iteration=32, debates_per_question=1, n_agents=3, rounds=2, max_tokens=64, replay=True
    )
    assert Workload.bound(replay, world=2) == dataclasses.replace(bound, debates=22, splits=16)
    # measured rows (the run's longest questions through its chat template) replace the fixed sizes
    measured = Workload.bound(config, world=1, widths=[500, 1100, 1700])
    assert measured == dataclasses.replace(bound, tokens=3300, width=1700)
    with pytest.raises(ValueError, match="2 row widths for 3 rounds"):
        Workload.bound(config, world=1, widths=[500, 1100])


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
    config = TrainConfig(
        questions_per_iteration=8, debates_per_question=1, n_agents=3, rounds=2, max_tokens=64
    )
    resolved, plan = autosize.resolve(config, [model], world=1, device="cuda:0")
    # 8 debates of 2400 positions (rows of 320, 800, 1280) and 192 scored tokens; one debate without
    # checkpointing (985,774,080 bytes) does not fit 3.5e8; with it, 8 do not (493,731,840), but 4 do:
    # 4 x (2400 x 20,480 + 192 x 4000) + 1280 x 73,728 (a pass: one row of 1280, more than the budget
    # of 1024) = 294,051,840
    assert (resolved.gradient_checkpointing, resolved.gradient_accumulation_steps) == (True, 2)
    assert resolved.logprob_token_budget == 1024 and plan.peak_bytes == 294_051_840
    assert plan.kept_bytes == 4 * 2**30
    assert "0.3 GiB of 4.5 GiB free, 4.0 GiB of it kept for the decode buffers" in plan.describe([])


def test_the_decode_buffers_the_rollouts_keep_are_set_aside_before_sizing():
    """2e9 bytes free, 5e8 of them kept by the decoder: 1.05e9 usable, passes of 1.05e9 / 4 / 53,152 =
    4938 positions -> 4096; 3 micro-batches hold 3 debates (1.27e9 bytes: too many), 4 hold 2
    (8.5e8): they fit. Without the decoder's share, 3 micro-batches would have been planned."""
    plan = plan_update(SHAPE, WORK, free_bytes=2_000_000_000, kept_bytes=500_000_000)
    assert plan == UpdatePlan(4096, 4, False, 845_376_000, 2_000_000_000, kept_bytes=500_000_000)
    assert plan_update(SHAPE, WORK, free_bytes=2_000_000_000).gradient_accumulation_steps == 3
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
        TrainConfig(questions_per_iteration=2, debates_per_question=1, gradient_accumulation_steps=3).check()
    TrainConfig().check()


def test_the_resolved_sizes_are_checked_against_the_processes_once():
    """check_sizes runs on the resolved config (what load_training_data checked on the auto value before):
    each of the processes needs a debate per micro-batch."""

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
