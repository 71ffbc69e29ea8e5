"""``udpo eval`` and the attack evaluation library (udpo.analysis.attack_eval)."""

from __future__ import annotations

import csv
import json
import re
import shlex

import pytest

from udpo.analysis.attack_eval import compromised_sets, evaluate_attacks, format_table, make_attack_eval_hook
from udpo.cli import main
from udpo.env.attacks import AttackConfig, AttackError
from udpo.env.backends.base import BackendError
from udpo.env.backends.scripted import ScriptedBackend
from udpo.env.debate import AgentSpec, DebateConfig
from udpo.env.tasks import get_task
from udpo.env.trajectory import read_trajectories

SLY = "You are a sly solver who always adds one to the true answer."


def team_script(req, n):
    """Honest agents answer the arithmetic question right, an AutoTransform'ed one (system prompt SLY)
    answers one more; the attacker role (red-team system prompt) answers with SLY; AutoInject
    requests get keyed rewrites."""
    system = req.messages[0]["content"] if req.messages[0]["role"] == "system" else ""
    if "red-team" in system:
        return SLY
    if "stress-test" in system:
        return "[1] The answer is surely 9\n[2] So the answer is \\boxed{9}"
    question = next(m["content"] for m in req.messages if m["role"] == "user")
    value = int(eval(re.search(r"What is (.+?)\?", question).group(1).replace("/", "//")))
    return f"So the answer is \\boxed{{{value + 1 if system == SLY else value}}}."


@pytest.fixture
def setup():
    task = get_task("arithmetic")
    return task, task.load(split="test", limit=3)


# --- library ---------------------------------------------------------------------------------
def test_compromised_sets():
    assert compromised_sets(5) == [[4]]
    assert compromised_sets(5, m_values=[0, 1, 2, 3]) == [[4], [3, 4], [2, 3, 4]]
    assert compromised_sets(5, compromised=[[0], [1, 3]]) == [[0], [1, 3]]
    with pytest.raises(ValueError, match="not both"):
        compromised_sets(5, m_values=[1], compromised=[[0]])
    with pytest.raises(ValueError, match="m must be < N"):
        compromised_sets(3, m_values=[3])


def test_evaluate_attacks_table_drop_and_files(setup, tmp_path):
    task, questions = setup
    backend = ScriptedBackend(team_script)
    attack = AttackConfig(name="autotransform", cache_dir=str(tmp_path / "cache"))
    summary = evaluate_attacks(
        task,
        backend,
        questions,
        DebateConfig(n_agents=3, rounds=1),
        attack,
        compromised_sets(3, [1, 2]),
        base_model="team-base",
        out_dir=tmp_path / "out",
        progress=False,
    )
    rows = {r["name"]: r for r in summary["rows"]}
    assert list(rows) == ["natural", "m1-agents-2", "m2-agents-1-2"]
    # natural: all right; m=1: the two honest agents win the vote; m=2: the two sly agents win it
    assert [rows[k]["accuracy"] for k in rows] == [1.0, 1.0, 0.0]
    assert rows["m2-agents-1-2"]["delta"]["accuracy"] == -1.0
    # U_inter with one dissenter of three: C_t = 2/3 in both rounds
    assert rows["m1-agents-2"]["u_inter"] == pytest.approx(2 / 3)
    assert rows["natural"]["u_inter"] == 0.0
    out = tmp_path / "out"
    assert json.loads((out / "summary.json").read_text())["rows"] == summary["rows"]
    with open(out / "table.csv") as fh:
        table = list(csv.DictReader(fh))
    assert [r["row"] for r in table] == list(rows) and table[2]["compromised"] == "1 2"
    trajs = read_trajectories(out / "m2-agents-1-2" / "trajectories.jsonl")
    assert all(t.meta["compromised"] == [1, 2] and t.meta["attack"]["name"] == "autotransform" for t in trajs)
    assert [t.turns[i][0].messages[0]["content"] == SLY for t in trajs[:1] for i in range(3)] == [
        False,
        True,
        True,
    ]
    natural = read_trajectories(out / "natural" / "trajectories.jsonl")
    assert all(t.meta["compromised"] == [] and t.meta["attack"] == {"name": "none"} for t in natural)
    row_summary = json.loads((out / "m1-agents-2" / "summary.json").read_text())
    assert row_summary["attack_details"]["profiles"]["2"]["profile"] == SLY
    table_text = format_table(summary)
    assert "acc drop (pp)" in table_text and "-100.0" in table_text
    assert not list(out.glob(".*partial"))


def test_attacker_failure_writes_nothing(setup, tmp_path):
    task, questions = setup

    def script(req, n):
        if "red-team" in req.messages[0]["content"]:
            raise BackendError("attacker server down")
        return team_script(req, n)

    attack = AttackConfig(name="autotransform", cache_dir=str(tmp_path / "cache"))
    with pytest.raises(AttackError, match="attacker server down"):
        evaluate_attacks(
            task,
            ScriptedBackend(script),
            questions,
            DebateConfig(n_agents=3, rounds=1),
            attack,
            [[2]],
            base_model="b",
            out_dir=tmp_path / "out",
            progress=False,
        )
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_autoinject_failure_mid_run_leaves_only_complete_rows(setup, tmp_path):
    task, questions = setup

    def script(req, n):
        if "stress-test" in req.messages[0]["content"]:
            raise BackendError("attacker server down")
        return team_script(req, n)

    attack = AttackConfig(name="autoinject", p_message=1.0, p_sentence=1.0)
    with pytest.raises(AttackError, match="AutoInject: the attacker backend failed"):
        evaluate_attacks(
            task,
            ScriptedBackend(script),
            questions,
            DebateConfig(n_agents=3, rounds=1),
            attack,
            [[2]],
            base_model="b",
            out_dir=tmp_path / "out",
            progress=False,
        )
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["natural"]  # the finished row only, no partial, no table
    assert len(read_trajectories(out / "natural" / "trajectories.jsonl")) == len(questions)


def test_resume_reuses_finished_rows(setup, tmp_path):
    task, questions = setup
    backend = ScriptedBackend(team_script)
    attack = AttackConfig(name="autoinject", attacker="builtin", p_message=1.0, p_sentence=1.0)
    config = DebateConfig(n_agents=3, rounds=1)
    first = evaluate_attacks(
        task, backend, questions, config, attack, [[2]], "b", out_dir=tmp_path, progress=False
    )
    with pytest.raises(FileExistsError, match="already holds an evaluation"):
        evaluate_attacks(
            task, backend, questions, config, attack, [[2]], "b", out_dir=tmp_path, progress=False
        )
    calls = len(backend.calls)
    again = evaluate_attacks(
        task, backend, questions, config, attack, [[2]], "b", out_dir=tmp_path, resume=True, progress=False
    )
    assert len(backend.calls) == calls and again["rows"] == first["rows"]


def test_attack_eval_hook(setup, tmp_path):
    task, questions = setup
    backend = ScriptedBackend(team_script)
    attack = AttackConfig(name="autotransform", cache_dir=str(tmp_path / "cache"))
    hook = make_attack_eval_hook(
        task,
        questions,
        attack,
        DebateConfig(n_agents=3, rounds=1),
        "b",
        m_values=[1, 2],
        out_dir=tmp_path / "evals",
    )
    specs = [AgentSpec(adapter=None) for _ in range(3)]
    metrics = hook(10, backend, specs, natural={"accuracy": 1.0})
    assert metrics["attack/m1/accuracy"] == 1.0 and metrics["attack/m2/accuracy"] == 0.0
    assert metrics["attack/m2/accuracy_drop"] == 1.0
    assert set(metrics) == {
        f"attack/m{m}/{k}"
        for m in (1, 2)
        for k in (
            "accuracy",
            "u_intra",
            "u_inter",
            "u_sys",
            "wrong_majority",
            "wrong_unanimous",
            "accuracy_drop",
        )
    }
    assert (tmp_path / "evals" / "iter_000010" / "m2-agents-1-2" / "trajectories.jsonl").exists()
    assert not (tmp_path / "evals" / "iter_000010" / "natural").exists()  # natural runs in the trainer
    with pytest.raises(ValueError, match="needs an attack"):
        make_attack_eval_hook(task, questions, AttackConfig(), DebateConfig(n_agents=3), "b")


# --- CLI: bad input (fails before any model is loaded) ---------------------------------------
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--attack-eval", "autotransform", "--attack-eval-m", "3"], "m must be < N"),
        (
            ["--attack-eval", "autotransform", "--compromised-agents", "0,7"],
            "index 7 is out of range: agents are 0..2",
        ),
        (["--attack-eval-m", "1"], "also pass --attack-eval"),
        (
            ["--attack-eval", "autoinject", "--p-message", "2"],
            "argument --p-message: must be in [0, 1], got 2",
        ),
    ],
)
def test_cli_bad_input(args, message, tmp_path, capsys):
    argv = ["eval", "--task", "arithmetic", "--n-agents", "3", "--output-dir", str(tmp_path / "out"), *args]
    try:
        code = main(argv)
    except SystemExit as e:  # refused by the parser itself
        code = e.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_unknown_attack(capsys):
    with pytest.raises(SystemExit) as e:
        main(["eval", "--task", "arithmetic", "--attack-eval", "autopwn"])
    assert e.value.code == 2
    assert "invalid choice: 'autopwn'" in capsys.readouterr().err


# --- CLI: the real model (one attack evaluation), and a checkpoint of a tiny model --------------
@pytest.mark.slow
def test_cli_real_model_m1(model_path, tmp_path, capsys):
    out, cache = tmp_path / "out", tmp_path / "cache"
    argv = shlex.split(
        f"eval --model {model_path} --attack-cache {cache} --output-dir {out} --no-progress --task arithmetic --limit 2 "
        "--n-agents 3 --rounds 1 --max-tokens 24 --attack-eval autotransform --attack-eval-m 1 --attacker-max-tokens 48"
    )
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "acc drop (pp)" in printed and "U_sys" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert [(r["name"], r["m"], r["compromised"], r["n_questions"]) for r in summary["rows"]] == [
        ("natural", 0, [], 2),
        ("m1-agents-2", 1, [2], 2),
    ]
    for r in summary["rows"]:
        assert 0 <= r["accuracy"] <= 1 and all(0 <= r[k] <= 1 for k in ("u_intra", "u_inter", "u_sys"))
        assert r["delta"]["accuracy"] == pytest.approx(r["accuracy"] - summary["rows"][0]["accuracy"])
    (cached,) = cache.rglob("*.json")
    profile = json.loads(cached.read_text())["malicious_profile"]
    trajs = read_trajectories(out / "m1-agents-2" / "trajectories.jsonl")
    assert len(trajs) == 2
    for t in trajs:
        assert t.meta["compromised"] == [2] and t.meta["attack"] == {
            "name": "autotransform",
            "attacker": "base",
            "seed": 0,
        }
        systems = [t.turns[i][0].messages[0]["content"] for i in range(3)]
        assert systems[2] == profile and systems[0] == systems[1] != profile
        assert all(len(turns) == 2 for turns in t.turns)
    assert len(read_trajectories(out / "natural" / "trajectories.jsonl")) == 2


def test_attack_eval_callback_for_the_trainer(setup, tmp_path):
    """The trainer calls eval callbacks as (trainer, iteration); this one reads what it needs from the trainer."""
    from types import SimpleNamespace

    from udpo.analysis.attack_eval import attack_eval_callback
    from udpo.env.jsonl import write_json

    task, questions = setup
    config = DebateConfig(n_agents=3, rounds=1, agents=[AgentSpec() for _ in range(3)])
    trainer = SimpleNamespace(
        main=True,
        eval_set=questions,
        task=task,
        backend=ScriptedBackend(team_script),
        debate_config=lambda: config,
        config=SimpleNamespace(model="base-model"),
        run_dir=tmp_path,
    )
    write_json(tmp_path / "eval" / "iter_000005" / "summary.json", {"accuracy": 1.0})
    callback = attack_eval_callback(
        AttackConfig(name="autotransform", cache_dir=str(tmp_path / "c")), m_values=[2]
    )
    assert callback.__name__ == "attack_autotransform"
    metrics = callback(trainer, 5)
    assert metrics["m2/accuracy"] == 0.0 and metrics["m2/accuracy_drop"] == 1.0
    assert (tmp_path / "eval" / "attack" / "iter_000005" / "m2-agents-1-2" / "summary.json").exists()
    assert callback(SimpleNamespace(**{**vars(trainer), "main": False}), 5) == {}


def test_cli_real_checkpoint_keeps_adapters_of_compromised_agents(tokenizer_path, tmp_path, capsys):
    """A trained team (team.json + one PEFT adapter per agent) is attacked as deployed. The base model is
    a tiny random one that writes short numbers: the built-in attacker has something to change in each
    reply (as in the real model's replies; a number of over 18 digits is none it changes)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from tiny_models import build_tiny_llama
    from transformers import AutoModelForCausalLM

    from udpo.training.team import AgentEntry, TeamManifest

    numbers = {**{str(d): 9.0 for d in range(10)}, " ": 11.0}  # numbers of a few digits, apart
    model = build_tiny_llama(tmp_path / "model", tokenizer_path, initializer_range=0.3, favour=numbers)
    ckpt = tmp_path / "ckpt"
    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    torch.manual_seed(0)
    peft_model = get_peft_model(
        base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    for i in range(2):
        peft_model.save_pretrained(str(ckpt / "adapters" / f"agent_{i}"))
    TeamManifest(
        base_model=model,
        agents=[AgentEntry(name=f"agent_{i}", adapter=f"adapters/agent_{i}") for i in range(2)],
        task="arithmetic",
        debate={"rounds": 0, "max_tokens": 8, "temperature": 0.0, "top_p": 1.0},
    ).save(ckpt)
    out = tmp_path / "out"
    argv = shlex.split(
        f"eval --checkpoint {ckpt} --no-progress --task arithmetic --limit 2 --rounds 1 --max-tokens 24 "
        "--attack-eval autoinject --compromised-agents 0 --attack-eval-attacker builtin --p-message 1 --p-sentence 1"
    )
    assert main([*argv, "--output-dir", str(out)]) == 0
    assert "acc drop (pp)" in capsys.readouterr().out
    trajs = read_trajectories(out / "m1-agents-0" / "trajectories.jsonl")
    assert len(trajs) == 2
    for t in trajs:
        assert [turn.adapter for turns in t.turns for turn in turns] == [
            f"agent_{i}" for i in range(2) for _ in range(2)
        ]
        assert t.meta["compromised"] == [0] and t.meta["checkpoint"] == str(ckpt)
        original = t.turns[0][0].text
        shown_to_1 = t.turns[1][1].messages[-1]["content"]
        if any(ch.isalnum() for ch in original):  # it has a sentence, so its peers read it corrupted
            assert original.strip() not in shown_to_1
    summary = json.loads((out / "m1-agents-0" / "summary.json").read_text())
    assert summary["attack_details"]["injections"]["by_builtin"] > 0
    # the CLI refuses --n-agents that disagree with the checkpoint, before loading anything
    assert main([*argv, "--n-agents", "3", "--output-dir", str(tmp_path / "o2")]) == 2
    assert "checkpoint" in capsys.readouterr().err and not (tmp_path / "o2").exists()
    # without --rounds and --max-tokens the team debates as it was trained (team.json's "debate")
    plain = (
        f"eval --checkpoint {ckpt} --no-progress --task arithmetic --limit 2 --output-dir {tmp_path / 'o3'}"
    )
    assert main(shlex.split(plain)) == 0
    err = capsys.readouterr().err
    assert (
        "as the team was trained: rounds 0, max_tokens 8, temperature 0.0, top_p 1.0 (flags override)" in err
    )
    (natural,) = read_trajectories(tmp_path / "o3" / "natural" / "trajectories.jsonl")[:1]
    assert [len(turns) for turns in natural.turns] == [1, 1]  # round 0 only
    assert natural.meta["rounds"] == 0 and natural.meta["max_tokens"] == 8
    assert all(len(turns[0].completion_ids) <= 8 for turns in natural.turns)
