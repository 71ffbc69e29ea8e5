"""How the trainer sets up its vLLM engine (dtype, LoRA slots). That the update reaches the engine is
tested against the real engine in tests/test_vllm_sync.py (test_updated_adapters_reach_vllm)."""

from __future__ import annotations

import pytest
import torch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_trainings_vllm_engine_samples_in_the_trainers_dtype(dtype, tmp_path, monkeypatch):
    """``dtype: auto`` resolves per machine for the trainer; vLLM's own "auto" would take the checkpoint's
    (bf16 here) and sample in another precision than the trainer recomputes the log-probs in. The LoRA
    slots are as wide as the trainer's rank."""
    from types import SimpleNamespace

    import udpo.env.backends as backends
    from udpo.config import TrainConfig
    from udpo.config.groups import DebateArgs, ModelArgs, RunArgs
    from udpo.training.rollouts import Rollouts

    built = {}
    monkeypatch.setattr(backends, "backend_from_settings", lambda name, **kw: built.update(name=name, **kw))
    monkeypatch.setattr("udpo.env.models.resolve_model", lambda name: f"/models/{name}")
    config = TrainConfig(backend="vllm", output_dir=str(tmp_path / "run"))
    policy = SimpleNamespace(dtype=dtype, adapter_names=["agent_0", "agent_1", "agent_2"])
    parts = {"model": ModelArgs, "debate_settings": DebateArgs, "run": RunArgs}
    Rollouts._make_backend(
        SimpleNamespace(
            **{name: config.group(g) for name, g in parts.items()},
            policy=policy,
            rank=0,
            world=1,
            card_share=None,
        )
    )
    assert built["name"] == "vllm"
    assert built["dtype"] == {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
    assert built["max_loras"] == 3
    assert built["max_lora_rank"] == 8  # the trainer's r; wider slots pad every adapter (0.55x on CPU)


def test_lora_rank_slots_are_the_smallest_vllm_accepts():
    from udpo.env.backends.vllm import lora_rank_slot

    assert [lora_rank_slot(r) for r in (1, 2, 8, 9, 16, 33, 300, 512)] == [1, 8, 8, 16, 16, 64, 320, 512]
    with pytest.raises(ValueError, match="largest vLLM serves"):
        lora_rank_slot(513)
