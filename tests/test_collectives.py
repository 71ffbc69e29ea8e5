"""Collectives that are safe on every backend: tensors on the backend's device, decisions every process
makes alike, and the process group a launch asks for (the real multi-process runs are in
test_distributed.py and test_deepspeed.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from udpo.training import distributed as dist
from udpo.training.update import Updater


def test_collectives_use_the_cpu_under_gloo_and_the_current_gpu_under_nccl(monkeypatch):
    assert dist.device() == torch.device("cpu")  # one process
    monkeypatch.setattr(dist, "active", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_backend", lambda: "gloo")
    assert dist.device() == torch.device("cpu")
    # NCCL refuses CPU tensors: every multi-GPU launch used to fail at its first all-reduce
    monkeypatch.setattr(torch.distributed, "get_backend", lambda: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    assert dist.device() == torch.device("cuda", 3)


def test_micro_batches_are_decided_alike_on_every_process():
    def split(local: list[int], total: int, ga: int, world: int) -> list[list[int]]:
        updater = SimpleNamespace(micro_batch_count=ga, world=world)
        return Updater.micro_batches(updater, local, total)

    # 5 debates on 2 processes: 3 and 2; both split theirs in 2 (the same number of backward passes)
    assert split([0, 2, 4], 5, 2, 2) == [[0, 2], [4]]
    assert split([1, 3], 5, 2, 2) == [[1], [3]]
    # 3 debates: the second process has 1, fewer than 2 micro-batches; both processes refuse (before,
    # only that one raised and the other waited for it forever)
    for local in ([0, 2], [1]):
        with pytest.raises(ValueError, match="least busy of 2 process"):
            split(local, 3, 2, 2)


def test_a_deepspeed_launch_on_cpu_forms_a_gloo_group(monkeypatch):
    from udpo.training.run_env import process_group_settings

    if torch.cuda.is_available():
        pytest.skip("the CPU case")
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED", raising=False)
    assert process_group_settings() == {"cpu": True}  # torchrun / DDP over gloo
    # what `accelerate launch --config_file recipes/accelerate/deepspeed_zero2.yaml` sets: with cpu=True
    # accelerate would run plain DDP, and without a backend each process would form a group of its own
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    settings = process_group_settings()
    assert settings["cpu"] is False
    (handler,) = settings["kwargs_handlers"]
    assert handler.backend == "gloo"


def test_gathering_parameters_that_are_not_partitioned_changes_nothing():
    p = torch.nn.Parameter(torch.ones(3))
    with dist.gathered([p], modifier_rank=0), dist.whole_model(None):
        p.data.mul_(2)
    assert p.tolist() == [2.0, 2.0, 2.0] and dist.partitioned([p]) == []


def test_vllm_engines_beside_the_trainer_take_a_share_and_their_own_device(tmp_path):
    from udpo.config import TrainConfig
    from udpo.training.rollouts import COLOCATED_GPU_SHARE, colocated_engine_options

    config = TrainConfig(backend="vllm", output_dir=str(tmp_path / "run"))
    # GPUs, 4 processes: each engine runs in its process, on that process's device, with a share
    gpu = colocated_engine_options(config, world=4, cuda=True)
    assert gpu["gpu_memory_utilization"] == COLOCATED_GPU_SHARE < 0.5
    assert gpu["engine_kwargs"] == {"distributed_executor_backend": "external_launcher"}
    assert "engine_kwargs" not in colocated_engine_options(config, world=1, cuda=True)
    # CPU: the KV cache in GiB as configured (vLLM's own default when none), nothing about devices
    assert colocated_engine_options(config, world=2, cuda=False) == {
        "gpu_memory_utilization": None,
        "kv_cache_gib": None,
    }
    config = TrainConfig(backend="vllm", output_dir=str(tmp_path / "run"), vllm_gpu_memory_utilization=0.5)
    assert colocated_engine_options(config, world=2, cuda=True)["gpu_memory_utilization"] == 0.5
