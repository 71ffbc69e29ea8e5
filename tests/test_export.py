"""``udpo export``: PEFT adapters + team manifest (and merged models) from a checkpoint folder."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from tiny_models import build_tiny_llama, perturb_adapters

from udpo.cli import main
from udpo.export import export_team, find_checkpoint
from udpo.policy import LoraSettings, MultiAgentPolicy
from udpo.team import TeamManifest, save_team

IDS = torch.tensor([[1, 9690, 198, 2683, 314, 253, 19, 30, 31]])


@pytest.fixture(scope="module")
def tiny_path(model_path, tmp_path_factory) -> str:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny"), model_path)


@pytest.fixture(scope="module")
def checkpoint(tiny_path, tmp_path_factory):
    """A trained-looking 2-agent team (random adapters) saved as a checkpoint; returns (folder, policy)."""
    policy = MultiAgentPolicy(tiny_path, n_agents=2, lora=LoraSettings(r=4, alpha=8))
    perturb_adapters(policy)
    folder = tmp_path_factory.mktemp("run") / "checkpoints" / "iter_000010"
    save_team(policy, folder, task="arithmetic", profiles=["calm", "sceptic"], iteration=10)
    (folder / "optimizer.json").write_text("{}")  # trainer state, not exported
    return folder, policy


def policy_logits(policy, agent):
    model = policy.model_of(agent)
    model.set_adapter(policy.adapter_names[agent])
    with torch.no_grad():
        return model(input_ids=IDS).logits


def test_export_writes_peft_adapters_and_manifest(checkpoint, tiny_path, tmp_path, capsys):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    folder, policy = checkpoint
    out = tmp_path / "team"
    assert main(["export", str(folder), "--out", str(out)]) == 0
    assert "agent_1: " in capsys.readouterr().out
    team = TeamManifest.load(out)
    assert [a.profile for a in team.agents] == ["calm", "sceptic"]
    assert (team.base_model, team.iteration, team.task) == (tiny_path, 10, "arithmetic")
    assert sorted(p.name for p in (out / "adapters" / "agent_1").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert not (out / "optimizer.json").exists()
    for agent in range(2):
        base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
        loaded = PeftModel.from_pretrained(base, str(out / "adapters" / f"agent_{agent}"))
        with torch.no_grad():
            logits = loaded(input_ids=IDS).logits
        assert torch.allclose(logits, policy_logits(policy, agent), atol=1e-5)


def test_merge_gives_the_logits_of_base_plus_adapter(checkpoint, tmp_path):
    from transformers import AutoModelForCausalLM

    folder, policy = checkpoint
    out = tmp_path / "merged_team"
    assert main(["export", str(folder), "--out", str(out), "--merge"]) == 0  # tiny base is fp32: auto = fp32
    team = TeamManifest.load(out)
    assert [a.merged for a in team.agents] == ["merged/agent_0", "merged/agent_1"]
    for agent in range(2):
        merged_dir = out / "merged" / f"agent_{agent}"
        assert (merged_dir / "model.safetensors").exists() and (merged_dir / "tokenizer.json").exists()
        merged = AutoModelForCausalLM.from_pretrained(str(merged_dir))
        assert merged.dtype == torch.float32
        with torch.no_grad():
            logits = merged(input_ids=IDS).logits
        assert torch.allclose(logits, policy_logits(policy, agent), atol=1e-4)
    # bf16 output: the same model up to bf16 rounding
    export_team(folder, tmp_path / "bf16", merge=True, dtype="bf16")
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "bf16" / "merged" / "agent_1"))
    assert merged.dtype == torch.bfloat16
    with torch.no_grad():
        logits = merged.float()(input_ids=IDS).logits
    assert (logits - policy_logits(policy, 1)).abs().max() < 0.05


def test_run_directory_resolves_to_latest_checkpoint_and_out_is_protected(checkpoint, tmp_path, capsys):
    folder, _ = checkpoint
    run = tmp_path / "run"
    shutil.copytree(folder, run / "checkpoints" / "iter_000002")
    shutil.copytree(folder, run / "checkpoints" / "iter_000010")
    manifest = json.loads((run / "checkpoints" / "iter_000002" / "team.json").read_text())
    manifest["iteration"] = 2
    (run / "checkpoints" / "iter_000002" / "team.json").write_text(json.dumps(manifest))
    assert find_checkpoint(run).name == "iter_000010"
    out = tmp_path / "out"
    assert main(["export", str(run), "--out", str(out)]) == 0
    assert TeamManifest.load(out).iteration == 10
    # an existing export is kept unless --overwrite; nothing is written on error
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    assert main(["export", str(run / "checkpoints" / "iter_000002"), "--out", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert main(["export", str(run / "checkpoints" / "iter_000002"), "--out", str(out), "--overwrite"]) == 0
    assert TeamManifest.load(out).iteration == 2
    assert main(["export", str(tmp_path / "nothing"), "--out", str(tmp_path / "x")]) == 2
    assert "no team.json" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_shared_adapter_exports_one_adapter(tiny_path, tmp_path):
    policy = MultiAgentPolicy(tiny_path, n_agents=3, lora=LoraSettings(r=4, alpha=8), shared_adapter=True)
    save_team(policy, tmp_path / "ckpt")
    team = export_team(tmp_path / "ckpt", tmp_path / "out")
    assert team.shared_adapter and [a.adapter for a in team.agents] == ["adapters/shared"] * 3
    assert [p.name for p in (tmp_path / "out" / "adapters").iterdir()] == ["shared"]


@pytest.mark.slow
@pytest.mark.vllm
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
