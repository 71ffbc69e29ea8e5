"""The update reaches the rollout engine: after a training iteration with vLLM rollouts, vLLM scores a
fixed completion under the agent's new adapter as the trainer does, and differently from before."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from train_helpers import EXPLICIT, read_jsonl, tiny_config

from udpo.training.trainer import Trainer

QUESTION = [{"role": "user", "content": "What is 4 + 5? Give the answer in \\boxed{}."}]
ANSWER = "4 plus 5 makes 9, so the answer is \\boxed{9}."


def mean_abs_diff(x, y) -> float:
    return float(np.mean(np.abs(np.asarray(x, dtype=float) - np.asarray(y, dtype=float))))


def opposite_advantages(self, batch) -> torch.Tensor:
    """+1 for even debates, -1 for odd ones, every agent: an update that always moves the adapters."""
    signs = torch.tensor([1.0 if m % 2 == 0 else -1.0 for m in range(len(batch))])
    return signs[:, None] * torch.ones_like(batch.rewards)


@pytest.mark.slow
@pytest.mark.vllm
def test_updated_adapters_reach_vllm(vllm_backend, model_path, tmp_path, monkeypatch):
    from udpo.algorithms.udpo import UDPO

    # the sync is under test, not the reward: vLLM samples the debates, and when an agent earns the same
    # reward in both, its advantages are 0, its gradient is 0 (the anchor too, at step one) and it stays put
    monkeypatch.setattr(UDPO, "advantages", opposite_advantages)
    config = tiny_config(
        model_path, tmp_path / "run", backend="vllm", eval_questions=0, max_iterations=1, learning_rate=2e-2,
        **EXPLICIT,
    )  # fmt: skip
    trainer = Trainer(config, backend=vllm_backend)  # the session's engine: the trainer must not start one
    tokenizer = trainer.policy.tokenizer
    prompt = list(
        tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=True, return_dict=False)
    )
    completion = tokenizer.encode(ANSWER, add_special_tokens=False)

    def scores(agent: int) -> tuple[list[float], list[float]]:
        name = trainer.policy.adapter_names[agent]
        engine = vllm_backend.completion_logprobs(prompt, completion, adapter=name)
        ours = trainer.policy.token_logprobs(agent, [prompt], [completion])[0].detach().tolist()
        return engine, ours

    trainer.rollouts.sync_adapters(0)
    ids_before = [vllm_backend.lora_id(n) for n in trainer.policy.adapter_names]
    before = [scores(i) for i in range(2)]
    trainer.train()  # rollouts through vLLM, one update, adapters synced as files with new LoRA ids
    ids_after = [vllm_backend.lora_id(n) for n in trainer.policy.adapter_names]
    after = [scores(i) for i in range(2)]
    trainer.close()

    assert all(a > b for a, b in zip(ids_after, ids_before, strict=True))
    for agent in range(2):
        (engine_0, ours_0), (engine_1, ours_1) = before[agent], after[agent]
        # vLLM runs the bf16 checkpoint, the trainer fp32: agreement within bf16 rounding
        assert mean_abs_diff(engine_0, ours_0) < 0.1
        assert mean_abs_diff(engine_1, ours_1) < 0.1
        moved = mean_abs_diff(ours_1, ours_0)
        assert moved > 3 * mean_abs_diff(engine_1, ours_1), (agent, moved)
        assert mean_abs_diff(engine_1, engine_0) > 0.5 * moved  # the engine sees the update too
    debates = read_jsonl(tmp_path / "run" / "trajectories" / "train.jsonl")
    assert len(debates) == 2 and all(t["adapter"] for d in debates for row in d["turns"] for t in row)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_trainings_vllm_engine_samples_in_the_trainers_dtype(dtype, tmp_path, monkeypatch):
    """``dtype: auto`` resolves per machine for the trainer; vLLM's own "auto" would take the checkpoint's
    (bf16 here) and sample in another precision than the trainer recomputes the log-probs in. The LoRA
    slots are as wide as the trainer's rank."""
    from types import SimpleNamespace

    import udpo.env.backends as backends
    from udpo.config import TrainConfig
    from udpo.training.rollouts import Rollouts

    built = {}
    monkeypatch.setattr(backends, "backend_from_settings", lambda name, **kw: built.update(name=name, **kw))
    monkeypatch.setattr("udpo.env.models.resolve_model", lambda name: f"/models/{name}")
    config = TrainConfig(backend="vllm", output_dir=str(tmp_path / "run"))
    policy = SimpleNamespace(dtype=dtype, adapter_names=["agent_0", "agent_1", "agent_2"])
    Rollouts._make_backend(SimpleNamespace(config=config, policy=policy, rank=0, world=1))
    assert built["name"] == "vllm"
    assert built["dtype"] == {torch.float32: "float32", torch.bfloat16: "bfloat16"}[dtype]
    assert built["max_loras"] == 3
    assert built["max_lora_rank"] == 8  # the trainer's r; wider slots pad every adapter (0.55x on CPU)


def test_lora_rank_slots_are_the_smallest_vllm_accepts():
    from udpo.env.backends.vllm import lora_rank_slot

    assert [lora_rank_slot(r) for r in (1, 2, 8, 9, 16, 33, 300, 512)] == [1, 8, 8, 16, 16, 64, 320, 512]
    with pytest.raises(ValueError, match="largest vLLM serves"):
        lora_rank_slot(513)
