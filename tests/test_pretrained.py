"""``udpo.Team``: a team trained through the API (a tiny random model), saved with ``save_pretrained`` and
loaded with ``from_pretrained`` from a run folder, a checkpoint folder and an export folder; each debates
and evaluates, and greedy debates of the saved team are those of the trained one."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
import torch

import udpo
from udpo import Team
from udpo.env.tasks import Question
from udpo.env.tasks.arithmetic import Arithmetic
from udpo.pretrained import DebateResult
from udpo.training.export import export_team
from udpo.training.team import TeamManifest

ROOT = Path(__file__).resolve().parents[1]
ROWS = [
    {"question": f"Which colour do you get by mixing {x} and {y} paint?", "answer": gold}
    for x, y, gold in [
        ("blue", "yellow", "green"),
        ("red", "yellow", "orange"),
        ("red", "blue", "purple"),
        ("red", "white", "pink"),
        ("black", "white", "grey"),
        ("red", "green", "brown"),
    ]
]
GREEDY = {"temperature": 0.0, "max_tokens": 6, "progress": False}


@pytest.fixture(scope="module")
def trained(tiny_model, tmp_path_factory):
    """A 2-agent team trained one iteration on text answers: (run folder, export of trainer.team, the
    trainer's greedy debate of ROWS, its adapter weights)."""
    from peft import LoraConfig

    root = tmp_path_factory.mktemp("team")
    args = udpo.UDPOConfig(
        output_dir=str(root / "run"),
        n_agents=2,
        rounds=1,
        max_tokens=6,
        questions_per_iteration=2,
        max_iterations=1,
        debates_per_question=1,
        eval_questions=2,
        save_steps=1,
        learning_rate=1e-2,
        dtype="fp32",
        progress=False,
        **{k: [0.5, 0.5] for k in ("alpha", "beta", "gamma", "lambda_", "eta")},  # no calibration
    )
    peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    with udpo.UDPOTrainer(
        model=tiny_model, args=args, train_dataset=ROWS[:4], eval_dataset=ROWS[4:], peft_config=peft
    ) as trainer:
        trainer.train()
        team = trainer.team
        assert team.task is trainer.task and team.manifest.iteration == 1 and team.n_agents == 2
        assert team.manifest.debate == {"rounds": 1, "max_tokens": 6, "temperature": 0.7, "top_p": 1.0}
        debated = team.debate(ROWS, **GREEDY)
        team.save_pretrained(root / "export")
        weights = [p.detach().clone() for p in trainer.policy.trainable_parameters()]
    return root / "run", root / "export", debated, weights


@pytest.mark.slow
def test_a_saved_team_loads_from_each_folder_kind_and_debates_as_trained(trained, tmp_path):
    run, export, debated, weights = trained
    assert sorted(p.name for p in export.iterdir()) == ["adapters", "team.json"]
    cli = export_team(run, tmp_path / "cli")  # what `udpo export RUN` writes from the last checkpoint
    assert TeamManifest.load(export).to_dict() == cli.to_dict()
    texts = [[turn.text for row in t.turns for turn in row] for t in debated.trajectories]
    checkpoint = run / "checkpoints" / "iter_000001"
    for folder in (run, checkpoint, export):
        team = Team.from_pretrained(folder, dtype="fp32")
        assert (team.n_agents, team.manifest.iteration, team.task.name) == (2, 1, "dataset")
        for loaded, saved in zip(team.policy.trainable_parameters(), weights, strict=True):
            assert torch.equal(loaded, saved)
        again = team.debate(ROWS, **GREEDY)
        assert [[turn.text for row in t.turns for turn in row] for t in again.trajectories] == texts


def test_debate_gives_answers_votes_and_correctness(trained):
    _, export, debated, _ = trained
    assert isinstance(debated, DebateResult) and len(debated) == len(ROWS)
    assert len(debated.votes) == len(ROWS) and all(len(v) == 2 for v in debated.votes)
    assert debated.answers == [t.prediction for t in debated.trajectories]
    assert all(isinstance(c, bool) for c in debated.correct)
    assert debated.accuracy == sum(debated.correct) / len(ROWS)
    team = Team.from_pretrained(export, dtype="fp32", task=Arithmetic())
    free = team.debate(["What is 2 + 3?", "What is 4 + 4?"], seed=1, max_tokens=4, progress=False)
    assert free.correct == [None, None] and free.accuracy is None
    assert len(team.debate("What is 2 + 3?", max_tokens=2, progress=False)) == 1  # one question
    assert free.trajectories[0].meta["task"] == "arithmetic" and free.trajectories[0].n_rounds == 1
    summary = free.summary()
    assert summary["wrong_majority"] is None and 0 <= summary["u_sys"] <= 1 and summary["n_questions"] == 2


def test_evaluate_reads_a_task_or_questions_with_answers(trained):
    _, export, _, _ = trained
    team = Team.from_pretrained(export, dtype="fp32")
    keys = {"accuracy", "u_intra", "u_inter", "u_sys", "unparsed_rate", "wrong_majority", "wrong_unanimous"}
    on_rows = team.evaluate(ROWS[:2], **GREEDY)
    assert keys <= set(on_rows) and on_rows["n_questions"] == 2
    on_task = team.evaluate(max_tokens=4, progress=False)  # the team's task (registered by the trainer)
    assert on_task["n_questions"] == 2 and 0 <= on_task["accuracy"] <= 1
    arithmetic = team.evaluate("arithmetic", split="test", limit=2, max_tokens=4, progress=False)
    assert arithmetic["n_questions"] == 2


def test_wrong_inputs_are_refused_with_what_to_do(trained, tmp_path):
    run, export, _, _ = trained
    team = Team.from_pretrained(export, dtype="fp32")
    with pytest.raises(ValueError, match="needs gold answers"):
        team.evaluate(["What is 2 + 3?"])
    with pytest.raises(ValueError, match="no questions"):
        team.debate([])
    with pytest.raises(TypeError, match="one kind per call"):
        team.debate(["What is 2 + 3?", {"question": "q", "answer": 1}])
    with pytest.raises(TypeError, match="read by a DatasetTask"):
        team.debate(ROWS, task=Arithmetic())
    with pytest.raises(ValueError, match="give the task once"):
        team.evaluate("arithmetic", task=Arithmetic())
    team.task = None  # as in a process where the run's task is not registered
    with pytest.raises(ValueError, match="pass task="):
        team.debate([Question(id="q", text="What is 2 + 3?", gold="5")])
    with pytest.raises(ValueError, match="holds a run"):
        team.save_pretrained(run / "team")
    with pytest.raises(ValueError, match="not empty"):
        team.save_pretrained(export)
    assert team.save_pretrained(export, overwrite=True) == export
    with pytest.raises(FileNotFoundError, match="no team.json"):
        Team.from_pretrained(tmp_path)


def test_example_loads_a_team_and_debates(trained, monkeypatch, capsys, tmp_path):
    """examples/load_team.py, run on the exported team (in this process: its imports are loaded)."""
    _, export, _, _ = trained
    script = ROOT / "examples" / "load_team.py"
    monkeypatch.setattr(
        sys, "argv", [str(script), str(export), "--max-tokens", "4", "--save", str(tmp_path / "copy")]
    )
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    assert "2 agents on" in out and "team:" in out and "u_sys" in out
    assert TeamManifest.load(tmp_path / "copy").n_agents == 2
