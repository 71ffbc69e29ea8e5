"""The update's memory against autosize's plan (udpo.training.autosize), measured tensor by tensor.

``benchmarks/update_memory.py`` runs one agent's micro-batch of the bound workload (every response
``max_tokens`` long) through the update's own path, a random Llama model with the team's LoRA adapters,
and counts the peak of the tensors alive (``udpo.training.memory.TensorBytes``); here at two small
shapes, one whose peak is the logits of a 32,000-entry vocabulary and one whose peak is its layers, in
bf16 (the GPU's precision, autocast) and fp32.

The bounds: the peak at most 1.1 x the plan (the plan is what the update may fill; the allocator's slack
is the margin) and at least 0.5 x it. The plan must cover either layout of an agent's rounds (a row per
round: more positions; packed in one row: more scored tokens per pass), so it counts the positions of
the one and the log-softmax temporaries of the other; below half the larger peak it would spend twice the
micro-batches or turn on gradient checkpointing where neither was needed.
"""

from __future__ import annotations

import importlib.util
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from udpo.training.memory import TensorBytes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    path = ROOT / "benchmarks" / "update_memory.py"
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def workload(dtype: str, checkpointing: bool = False) -> Namespace:
    """4 questions x 2 agents x 2 rounds (rows of 272 and 592 positions), 16 tokens, 2 micro-batches."""
    return Namespace(
        questions=4,
        agents=2,
        rounds=1,
        max_tokens=16,
        micro_batches=2,
        token_budget=4096,
        dtype=dtype,
        checkpointing=checkpointing,
    )


def test_the_counter_counts_what_a_block_makes_while_it_lives():
    held = torch.zeros(1000)  # made before: neither it nor a view of it counts
    with TensorBytes() as counter:
        view = held[:10]
        a = torch.ones(1000)  # 4000 bytes
        b = a * 2  # 8000 alive
        del a, b
        c = torch.ones(500, dtype=torch.float64)  # 4000 alive, the peak stays 8000
    assert counter.peak == 8000 and counter.now == 4000
    assert view.untyped_storage()._cdata == held.untyped_storage()._cdata
    assert sum(counter.at_peak().values()) == 8000
    del c
    assert counter.now == 0


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("shape", ["small-vocab", "small-layers"])
def test_the_update_peak_is_within_the_plan(bench, shape, dtype):
    r = bench.measure(shape, workload(dtype))
    assert not r["fake"] and r["debates"] == 2
    assert 0.5 <= r["ratio"] <= 1.1, r


def test_with_gradient_checkpointing_too(bench):
    r = bench.measure("small-layers", workload("bf16", checkpointing=True))
    assert 0.5 <= r["ratio"] <= 1.1, r


@pytest.mark.slow
def test_fake_tensors_count_what_real_ones_do(bench):
    """What lets the benchmark measure the 1B and 7B shapes without their memory or compute (slow: two
    more models built, about 4 s)."""
    real = bench.measure("small-layers", workload("bf16"), fake=False)
    fake = bench.measure("small-layers", workload("bf16"), fake=True)
    for layout in ("row per round", "packed"):
        assert fake[layout] == pytest.approx(real[layout], rel=1e-3)
