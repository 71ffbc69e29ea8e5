"""The trainer's updates reach a real vLLM engine (offline, the real SmolLM2-135M-Instruct, vLLM's CPU
build), and an adapter exported from a trained team serves there. The engine's batches and adapters:
tests/test_vllm_backend.py (its own engine: the two files run side by side under ``-n 2``).
"""

from __future__ import annotations

import pytest
import torch
from tiny_models import perturb_adapters
from train_helpers import EXPLICIT, read_jsonl, tiny_config
from vllm_helpers import mean_abs_diff

from udpo.training.export import export_team
from udpo.training.policy import MultiAgentPolicy
from udpo.training.team import save_team
from udpo.training.trainer import Trainer

pytestmark = [pytest.mark.slow, pytest.mark.vllm]


# the update reaches the engine ----------------------------------------------------------------------------
SYNC_QUESTION = [{"role": "user", "content": "What is 4 + 5? Give the answer in \\boxed{}."}]
SYNC_ANSWER = "4 plus 5 makes 9, so the answer is \\boxed{9}."


def opposite_advantages(self, batch):
    """+1 for even debates, -1 for odd ones, every agent: an update that always moves the adapters."""
    from udpo.algorithms.base import Advantages

    signs = torch.tensor([1.0 if m % 2 == 0 else -1.0 for m in range(len(batch))])
    return Advantages(signs[:, None] * torch.ones_like(batch.rewards))


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
        tokenizer.apply_chat_template(
            SYNC_QUESTION, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )
    completion = tokenizer.encode(SYNC_ANSWER, add_special_tokens=False)

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


def test_vllm_serves_an_exported_adapter(model_path, vllm_backend, tmp_path):
    """An adapter trained in MultiAgentPolicy and exported loads in vLLM as a LoRARequest and gives the
    policy's log-probs (vLLM runs the bf16 checkpoint, the policy fp32: agreement within bf16 rounding)."""
    from udpo.env.backends.base import ChatRequest, SamplingParams

    policy = MultiAgentPolicy(model_path, n_agents=1, dtype="fp32")
    perturb_adapters(policy, std=0.02)
    save_team(policy, tmp_path / "ckpt")
    team = export_team(tmp_path / "ckpt", tmp_path / "out")
    names = team.register(vllm_backend)
    assert names == ["agent_0"]
    messages = [{"role": "user", "content": "What is 12 + 30?"}]
    (c,) = vllm_backend.generate(
        [ChatRequest(messages, SamplingParams(0.0, max_tokens=16), adapter="agent_0")]
    )
    assert len(c.completion_ids) > 3
    ours = policy.token_logprobs(0, [c.prompt_ids], [c.completion_ids])[0].detach()
    base = torch.tensor(vllm_backend.completion_logprobs(c.prompt_ids, c.completion_ids))
    assert (ours - torch.tensor(c.logprobs)).abs().mean() < 0.1
    assert (base - torch.tensor(c.logprobs)).abs().mean() > 0.01  # the adapter really is applied
