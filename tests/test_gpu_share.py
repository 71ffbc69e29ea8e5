"""Several runs on one GPU (issue 42; udpo.gpu_share): ``udpo study PLAN --workers K`` hands each worker
its share of the card (``UDPO_GPU_MEMORY_SHARE``, 1/K by default), the trainer caps its allocator at it and
sizes its update within it, and a share outside (0, 1] is an error wherever it is given. No GPU here: the
CUDA calls are replaced by fakes that record what they were asked."""

from __future__ import annotations

import math

import pytest
import torch

from udpo import gpu_share
from udpo.cli import build_parser
from udpo.cli.study import study_command
from udpo.config import TrainConfig
from udpo.study.workers import Worker, plan_workers
from udpo.training import autosize
from udpo.training.autosize import ModelShape, Workload, plan_update
from udpo.training.rollouts import COLOCATED_GPU_SHARE, colocated_engine_options

GIB = 2**30


def test_a_share_outside_zero_to_one_is_an_error_naming_where_it_came_from():
    for bad in (0, -0.5, 1.5, math.inf, math.nan, "half", ""):
        with pytest.raises(ValueError, match=r"UDPO_GPU_MEMORY_SHARE must be"):
            gpu_share.check_share(bad)
    assert gpu_share.check_share("0.25") == 0.25 and gpu_share.check_share(1) == 1.0
    with pytest.raises(ValueError, match=r"UDPO_GPU_MEMORY_SHARE must be in \(0, 1\].*'2'"):
        gpu_share.from_environment({gpu_share.ENV: "2"})
    # the trainer reads it on every device: a bad value fails on a CPU too, before any work
    with pytest.raises(ValueError, match="UDPO_GPU_MEMORY_SHARE"):
        gpu_share.apply("cpu", {gpu_share.ENV: "0"})
    with pytest.raises(ValueError, match="--gpu-memory-share must be in"):
        gpu_share.worker_share(2, 1.5)
    with pytest.raises(ValueError, match="--workers must be >= 1"):
        plan_workers(0)


def test_the_command_line_refuses_a_bad_share_before_anything_loads(capsys):
    parse = build_parser().parse_args
    for command in (["study", "plan.yaml"], ["compare", "--config", "plan.yaml"]):
        assert parse(command).gpu_memory_share is None
        assert parse([*command, "--gpu-memory-share", "0.25"]).gpu_memory_share == 0.25
        for bad in ("0", "1.01", "nan", "x"):
            with pytest.raises(SystemExit):
                parse([*command, "--gpu-memory-share", bad])
            assert "argument --gpu-memory-share" in capsys.readouterr().err


def test_each_worker_carries_its_share_in_its_environment(monkeypatch):
    monkeypatch.delenv(gpu_share.ENV, raising=False)
    # K workers: 1/K each, unless the flag or the launcher's own UDPO_GPU_MEMORY_SHARE says otherwise
    assert gpu_share.worker_share(4, environ={}) == 0.25
    assert gpu_share.worker_share(1, environ={}) is None  # one run: the whole card, no cap
    assert gpu_share.worker_share(4, environ={gpu_share.ENV: "0.2"}) == 0.2
    assert gpu_share.worker_share(4, 0.3, environ={gpu_share.ENV: "0.2"}) == 0.3
    workers = plan_workers(3, threads=1, cores=[0, 1, 2], environ={})
    assert workers == [Worker(k, 1, (k,), 1 / 3) for k in range(3)]
    env = workers[1].environment()
    assert gpu_share.check_share(env[gpu_share.ENV]) == 1 / 3
    assert (env["UDPO_NUM_THREADS"], env["OMP_NUM_THREADS"]) == ("1", "1")
    assert gpu_share.from_environment(env) == 1 / 3  # what the worker's trainer reads back
    shared = plan_workers(2, threads=1, cores=[0, 1], share=0.4, environ={})
    assert [w.environment()[gpu_share.ENV] for w in shared] == ["0.4", "0.4"]
    assert gpu_share.ENV not in Worker(0, 1).environment()  # no share: the whole card
    # the worker's command is the study itself: the share travels by environment alone
    assert study_command("plan.yaml")[-3:] == ["study", "plan.yaml", "--no-progress"]


@pytest.fixture
def cuda_runtime(monkeypatch):
    """torch.cuda's Python layer as it is, on a machine without CUDA: only the lowest-level calls are
    replaced (the lazy init, the current device: 1, the allocator's cap: recorded), so the argument
    checks of ``set_per_process_memory_fraction`` (``_get_device_index``) run for real."""
    calls = []
    monkeypatch.setattr(torch.cuda, "_lazy_init", lambda: None)
    monkeypatch.setattr(torch.cuda.memory, "_lazy_init", lambda: None)
    monkeypatch.setattr(torch._C, "_cuda_getDevice", lambda: 1, raising=False)
    monkeypatch.setattr(
        torch._C, "_cuda_setMemoryFraction", lambda share, index: calls.append((share, index)), raising=False
    )
    return calls


def test_the_trainer_caps_its_allocator_on_cuda_only(cuda_runtime):
    calls = cuda_runtime
    # what the code passed before: torch refuses a CUDA device without an index (issue 50)
    with pytest.raises(ValueError, match="Expected a torch.device with a specified index"):
        torch.cuda.set_per_process_memory_fraction(0.5, torch.device("cuda"))
    assert gpu_share.apply("cpu", {gpu_share.ENV: "0.5"}) == 0.5 and calls == []
    assert gpu_share.apply("cuda:0", {}) is None and calls == []
    # accelerate's device of a single process is "cuda": the current device's index is filled in
    assert gpu_share.indexed("cuda") == "cuda:1" and gpu_share.indexed("cuda:0") == "cuda:0"
    assert gpu_share.indexed("cpu") == "cpu"
    assert gpu_share.apply("cuda", {gpu_share.ENV: "0.5"}) == 0.5
    assert gpu_share.apply("cuda:0", {gpu_share.ENV: "0.25"}) == 0.25
    assert calls == [(0.5, 1), (0.25, 0)]
    assert gpu_share.describe(0.5, "cuda:0").startswith(
        "GPU memory share: 0.5 of cuda:0 (UDPO_GPU_MEMORY_SHARE"
    )
    assert gpu_share.describe(0.5, "cpu") is None and gpu_share.describe(None, "cuda:0") is None


def test_the_usable_memory_is_what_is_left_of_the_share():
    total = 80 * GIB
    assert gpu_share.usable_bytes(70 * GIB, total, 3 * GIB, None) == 70 * GIB  # alone: all that is free
    # a quarter of 80 GiB, 3 GiB of it already held (model, adapters): 17 GiB left, less than the 70 free
    assert gpu_share.usable_bytes(70 * GIB, total, 3 * GIB, 0.25) == 17 * GIB
    # the other workers took most of the card: what is free is the bound
    assert gpu_share.usable_bytes(5 * GIB, total, 3 * GIB, 0.25) == 5 * GIB
    assert gpu_share.usable_bytes(70 * GIB, total, 30 * GIB, 0.25) == 0  # over its share already


#: a 1B-like shape and a 32-debate update (test_autosize.py works such estimates out by hand)
SHAPE = ModelShape(hidden=2048, layers=16, vocab=4096, dtype_bytes=2, intermediate=8192)
WORK = Workload(debates=32, splits=32, tokens=800, completions=192)


def test_a_share_of_the_card_gives_a_proportionally_smaller_plan():
    total, held = 80 * GIB, 0
    alone = plan_update(SHAPE, WORK, gpu_share.usable_bytes(total, total, held, None))
    plans = {
        k: plan_update(SHAPE, WORK, gpu_share.usable_bytes(total, total, held, 1 / k)) for k in (2, 4, 8)
    }
    assert [plans[k].free_bytes for k in (2, 4, 8)] == [total // 2, total // 4, total // 8]
    # each worker's estimated activations fit its share, and the plans shrink as the share does
    for k, plan in plans.items():
        assert plan.peak_bytes <= autosize.MEMORY_SHARE * total / k
    peaks = [alone.peak_bytes, *(plans[k].peak_bytes for k in (2, 4, 8))]
    assert peaks == sorted(peaks, reverse=True) and peaks[-1] < peaks[0]
    splits = [alone.gradient_accumulation_steps, *(plans[k].gradient_accumulation_steps for k in (2, 4, 8))]
    assert splits == sorted(splits) and splits[-1] > splits[0]
    budgets = [alone.logprob_token_budget, *(plans[k].logprob_token_budget for k in (2, 4, 8))]
    assert budgets == sorted(budgets, reverse=True) and budgets[-1] < budgets[0]


def test_resolve_sizes_from_the_share_not_from_all_that_is_free(monkeypatch):
    from types import SimpleNamespace

    model = SimpleNamespace(
        config=SimpleNamespace(
            hidden_size=2048, num_hidden_layers=16, vocab_size=4096, intermediate_size=8192
        ),
        parameters=lambda: iter([torch.zeros(1, dtype=torch.bfloat16)]),
    )
    # the card is 80 GiB, 76 GiB of it free (the other workers have not loaded yet); this process holds 4
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (76 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 4 * GIB)
    config = TrainConfig(
        questions_per_iteration=32, debates_per_question=1, n_agents=3, rounds=2, max_tokens=64
    )
    _, alone = autosize.resolve(config, [model], world=1, device="cuda:0")
    _, shared = autosize.resolve(config, [model], world=1, device="cuda:0", share=0.25)
    assert (alone.free_bytes, alone.share) == (76 * GIB, None)
    assert (shared.free_bytes, shared.share) == (16 * GIB, 0.25)  # 20 GiB share less the 4 it holds
    assert shared.peak_bytes < alone.peak_bytes
    assert shared.gradient_accumulation_steps >= alone.gradient_accumulation_steps
    assert "16.0 GiB free within this process's GPU memory share 0.25" in shared.describe([])
    assert "share" not in alone.describe([])


def test_a_colocated_vllm_engine_takes_its_share_of_the_workers_share(tmp_path):
    config = TrainConfig(backend="vllm", output_dir=str(tmp_path / "run"))
    options = colocated_engine_options(config, world=1, cuda=True, card_share=0.5)
    assert options["gpu_memory_utilization"] == pytest.approx(COLOCATED_GPU_SHARE * 0.5)
    assert (
        colocated_engine_options(config, world=1, cuda=True)["gpu_memory_utilization"] == COLOCATED_GPU_SHARE
    )
    explicit = TrainConfig(backend="vllm", output_dir=str(tmp_path / "run"), vllm_gpu_memory_utilization=0.2)
    assert (
        colocated_engine_options(explicit, world=1, cuda=True, card_share=0.5)["gpu_memory_utilization"]
        == 0.2
    )
