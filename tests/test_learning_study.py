"""scripts/learning_study.py on run folders written to disk: per-question pairing within each run,
the shared/own-questions choice of the bootstrap, the files it writes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from udpo.env.trajectory import Trajectory, TrajectoryWriter

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "learning_study.py"


@pytest.fixture(scope="module")
def study():
    spec = importlib.util.spec_from_file_location("learning_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def debate(qid: str, answers: list[str | None], gold: str = "4") -> Trajectory:
    """N=len(answers) agents, T=0: one answer each; correct when the majority says gold."""
    votes = [a for a in answers if a is not None]
    prediction = max(set(votes), key=votes.count) if votes else None
    return Trajectory(qid, "2 + 2?", gold, [[a] for a in answers], prediction, prediction == gold)


def write_run(run: Path, evals: dict[int, list[Trajectory]]) -> None:
    for k, trajectories in evals.items():
        with TrajectoryWriter(run / "eval" / f"iter_{k:06d}" / "trajectories.jsonl") as writer:
            writer.write(trajectories)
    records = [
        {"iteration": k, "kind": "train", "reward/mean": 0.1 * k, "update/kl": 0.01 * k} for k in range(1, 6)
    ]
    records += [{"iteration": k, "kind": "eval", "accuracy": 0.5} for k in evals]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_each_run_pairs_its_own_questions(study, tmp_path, capsys):
    # run a: 2 questions, wrong split team -> unanimous right on q0, unchanged q1 (a later eval at 9 that
    # run b lacks is ignored: "after" is the last evaluation every run has)
    a, b = tmp_path / "a", tmp_path / "b"
    write_run(
        a,
        {
            0: [debate("a0", ["4", "5", "5"]), debate("a1", ["4", "4", "4"])],
            5: [debate("a0", ["4", "4", "4"]), debate("a1", ["4", "4", "4"])],
            9: [debate("a0", ["5", "5", "5"]), debate("a1", ["5", "5", "5"])],
        },
    )
    # run b: other questions, listed in another order after training; one answer becomes unparsed
    write_run(
        b,
        {
            0: [debate("b0", ["4", "4", "4"]), debate("b1", ["4", "4", "4"])],
            5: [debate("b1", ["4", "4", None]), debate("b0", ["4", "4", "4"])],
        },
    )
    assert study.main([str(a), str(b), "--out", str(tmp_path / "out")]) == 0
    result = json.loads((tmp_path / "out" / "results.json").read_text())
    assert result["after_iteration"] == 5 and result["shared_questions"] is False
    acc = result["metrics"]["accuracy"]
    # a: 0.5 -> 1.0, b: 1.0 -> 1.0; every resample of a's questions averages +0.5 or +0.25 or 0
    assert (acc["before"], acc["after"], acc["delta"]) == (0.75, 1.0, 0.25)
    assert (acc["n_questions"], acc["n_seeds"]) == (4, 2)
    assert [s["delta"] for s in acc["per_seed"]] == [0.5, 0.0]
    unparsed = result["metrics"]["unparsed_rate"]
    assert [s["delta"] for s in unparsed["per_seed"]] == pytest.approx([0.0, 1 / 6])
    assert (tmp_path / "out" / "learning_curves.png").stat().st_size > 10_000
    table = capsys.readouterr().out
    assert "| accuracy | 0.750 | 1.000 | +0.250 [" in table


def test_runs_on_the_same_questions_share_each_draw(study, tmp_path):
    runs = []
    for name, after in (("s0", ["4", "4", "4"]), ("s1", ["5", "5", "5"])):
        run = tmp_path / name
        write_run(
            run,
            {
                0: [debate("q0", ["4", "5", "5"]), debate("q1", ["4", "4", "5"])],
                5: [debate("q0", after), debate("q1", ["4", "4", "5"])],
            },
        )
        runs.append(run)
    result = study.compare(runs)
    acc = result["metrics"]["accuracy"]
    # on q0 one seed gains 1 and the other 0: the seeds' mean change per question is 0.5 on q0, 0 on q1
    assert result["shared_questions"] is True
    assert (acc["delta"], acc["low"], acc["high"], acc["n_questions"]) == (0.25, 0.0, 0.5, 2)
