"""``udpo export``: PEFT adapters + team manifest (and merged models) from a checkpoint folder."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from rounding import logit_bound, max_abs
from tiny_models import build_tiny_llama, perturb_adapters

from udpo.cli import main
from udpo.training.export import export_team, find_checkpoint
from udpo.training.policy import LoraSettings, MultiAgentPolicy
from udpo.training.team import TeamManifest, save_team

pytestmark = pytest.mark.numeric

IDS = torch.tensor([[1, 9690, 198, 2683, 314, 253, 19, 30, 31]])


@pytest.fixture(scope="module")
def tiny_path(tokenizer_path, tmp_path_factory) -> str:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny"), tokenizer_path)


@pytest.fixture(scope="module")
def checkpoint(tiny_path, tmp_path_factory):
    """A trained-looking 2-agent team (random adapters) saved as a checkpoint; returns (folder, policy).
    fp32: the exported adapters are compared with the policy's logits to 1e-5."""
    policy = MultiAgentPolicy(tiny_path, n_agents=2, lora=LoraSettings(r=4, alpha=8), dtype="fp32")
    perturb_adapters(policy)
    folder = tmp_path_factory.mktemp("run") / "checkpoints" / "iter_000010"
    save_team(
        policy,
        folder,
        task="arithmetic",
        profiles=["calm", "sceptic"],
        iteration=10,
        debate={"rounds": 1, "max_tokens": 40, "temperature": 0.7, "top_p": 1.0},
    )
    (folder / "optimizer.json").write_text("{}")  # trainer state, not exported
    return folder, policy


def policy_logits(policy, agent):
    model = policy.model_of(agent)
    model.set_adapter(policy.adapter_names[agent])
    with torch.no_grad():
        return model(input_ids=IDS).logits


def assert_logits_close(got, expected, config, dtype=torch.float32) -> None:
    """Within the rounding bound of ``dtype`` (:func:`rounding.logit_bound`): the adapter's terms summed in
    another order (merged into the weights), or the weights rounded to ``dtype``."""
    assert (got - expected).abs().max().item() <= logit_bound(config, dtype, max_abs(expected), IDS.shape[1])


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
    assert team.debate == {
        "rounds": 1,
        "max_tokens": 40,
        "temperature": 0.7,
        "top_p": 1.0,
    }  # how it was trained
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
        assert_logits_close(logits, policy_logits(policy, agent), loaded.config)


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
        assert_logits_close(logits, policy_logits(policy, agent), merged.config)
    # bf16 output: the same model up to bf16 rounding
    export_team(folder, tmp_path / "bf16", merge=True, dtype="bf16")
    merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "bf16" / "merged" / "agent_1"))
    assert merged.dtype == torch.bfloat16
    with torch.no_grad():
        logits = merged.float()(input_ids=IDS).logits
    assert_logits_close(logits, policy_logits(policy, 1), merged.config, torch.bfloat16)


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


def listing(folder):
    return sorted(
        (str(p.relative_to(folder)), p.read_bytes() if p.is_file() else None) for p in folder.rglob("*")
    )


def test_export_never_deletes_what_it_did_not_write(checkpoint, tmp_path, monkeypatch, capsys):
    folder, _ = checkpoint
    run = tmp_path / "run"
    shutil.copytree(folder, run / "checkpoints" / "iter_000010")
    (run / "metrics.jsonl").write_text('{"iteration": 0, "kind": "eval"}\n')
    work = tmp_path / "work"  # a working directory with the user's own files
    (work / "notes").mkdir(parents=True)
    (work / "notes" / "todo.txt").write_text("keep me")
    (work / "paper.tex").write_text("keep me too")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "data.csv").write_text("a,b\n")
    monkeypatch.chdir(work / "notes")
    team = tmp_path / "team_folder"  # a team folder outside any run
    shutil.copytree(folder, team)
    before = {p: listing(p) for p in (run, work, mine, team)}
    refused = [
        (run, str(run), "holds a run (checkpoints, metrics.jsonl)"),
        (run, str(run / "export"), f"lies inside {run}, which holds a run"),
        (run, str(run / "checkpoints" / "iter_000010" / "adapters"), f"lies inside {run}, which holds a run"),
        (run, ".", "is the working directory or a folder above it"),
        (run, str(work), "is the working directory or a folder above it"),
        (run, str(tmp_path), "is the working directory or a folder above it"),
        (run, str(mine), "--overwrite replaces only an earlier export, and"),
        (run, str(mine / "data.csv"), "is a file"),
        (team, str(team), "holds or lies inside the checkpoint"),
        (team, str(team / "adapters"), "holds or lies inside the checkpoint"),
    ]
    for source, out, needle in refused:
        assert main(["export", str(source), "--out", out, "--overwrite"]) == 2, out
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1, (out, err)
    assert {p: listing(p) for p in (run, work, mine, team)} == before
    assert not [
        p for p in tmp_path.rglob(".*") if p.name.startswith((".export", ".run", ".mine"))
    ]  # no leftovers
    # an earlier export is replaced whole, and nothing else is touched
    assert main(["export", str(run), "--out", str(tmp_path / "team")]) == 0
    (tmp_path / "team" / "adapters" / "agent_0" / "stale.txt").write_text("from the earlier export")
    assert main(["export", str(run), "--out", str(tmp_path / "team"), "--overwrite"]) == 0
    assert not (tmp_path / "team" / "adapters" / "agent_0" / "stale.txt").exists()
    assert TeamManifest.load(tmp_path / "team").iteration == 10


def test_a_malformed_team_file_is_one_line(checkpoint, tmp_path, capsys):
    folder, _ = checkpoint
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    team = json.loads((bad / "team.json").read_text())
    for agent_key, value, needle in [
        ("adapter", 5, "agents[0].adapter must be a non-empty string, got 5"),
        ("adapter", "..", "agents[0].adapter '..' does not name an adapter folder"),
        ("profile", ["a"], "agents[0].profile has the wrong type"),
    ]:
        broken = {**team, "agents": [{**team["agents"][0], agent_key: value}, *team["agents"][1:]]}
        (bad / "team.json").write_text(json.dumps(broken))
        assert main(["export", str(bad), "--out", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert f"{bad / 'team.json'}: {needle}" in err and len(err.strip().splitlines()) == 1, err
    for broken, needle in [
        ({**team, "iteration": "ten"}, "iteration has the wrong type"),
        ({**team, "debate": {"rounds": "2"}}, "debate.rounds has the wrong type (str '2')"),
        ({**team, "debate": {"rounds": True}}, "debate.rounds has the wrong type (bool True)"),
        ({**team, "debate": {"round": 2}}, "debate has unknown key(s) ['round']"),
        ({**team, "debate": [2]}, "debate has the wrong type"),
    ]:
        (bad / "team.json").write_text(json.dumps(broken))
        assert main(["export", str(bad), "--out", str(tmp_path / "out")]) == 2
        assert needle in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_damaged_adapter_is_named_before_a_model_loads(checkpoint, tmp_path, monkeypatch, capsys):
    from transformers import AutoModelForCausalLM

    monkeypatch.setattr(
        AutoModelForCausalLM, "from_pretrained", lambda *a, **k: pytest.fail("a model loaded")
    )
    folder, _ = checkpoint
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    weights = bad / "adapters" / "agent_1" / "adapter_model.safetensors"
    weights.write_bytes(b"\x00" * 100)
    for args in (["export", str(bad), "--out", str(tmp_path / "out")], ["eval", "--task", "arithmetic",
                 "--checkpoint", str(bad), "--limit", "1", "--output-dir", str(tmp_path / "eval")]):  # fmt: skip
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"{weights}: not a safetensors file" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()
