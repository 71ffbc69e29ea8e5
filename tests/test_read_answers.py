"""scripts/read_answers.py: what a study's committed answers say, counted from its run records, against
hand-counted records."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

from udpo.env.trajectory import Trajectory, Turn
from udpo.study.record import EVALS, METRICS, RUN, compact

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "read_answers.py"


def load_script():
    spec = importlib.util.spec_from_file_location("read_answers", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_states_gold_by_hand():
    states_gold = load_script().states_gold
    assert (
        states_gold("6 + 4 = 10", "10")
        and states_gold("10", "10")
        and states_gold("The answer is: $10.", "10")
    )
    assert states_gold("4 * 5 equals 20, done", "20") and states_gold("so it is 7.", "7")
    # a number read from an explanation, a longer number, a decimal: not stated
    assert not states_gold("To find 4 * 5, multiply 4 by 5, which results in 20.", "20")
    assert not states_gold("6 + 4 = 100", "10") and not states_gold("x = 10.5", "10")
    assert not states_gold("When asked to add 6 and 0, add them", "6")


def debate(gold: str, texts: list[tuple[str, str | None, str]]) -> Trajectory:
    """One debate of one round per agent: (text, parsed answer, form) per agent."""
    turns = [[Turn(i, 0, [], text, answer, form=form)] for i, (text, answer, form) in enumerate(texts)]
    answers = [[t[0].answer] for t in turns]
    return Trajectory("q", "What is it?", gold, answers, gold, True, turns)


def write_record(
    folder: Path, method: str, seed: int, evals: dict[int, list[Trajectory]], metrics: list[dict]
):
    folder.mkdir(parents=True)
    lines = [json.dumps(compact(d, it)) for it, debates in evals.items() for d in debates]
    (folder / EVALS).write_bytes(gzip.compress("\n".join(lines).encode() + b"\n"))
    (folder / METRICS).write_bytes(gzip.compress("".join(json.dumps(m) + "\n" for m in metrics).encode()))
    body = {"method": method, "seed": seed, "evaluations": sorted(evals), "budget": {}}
    (folder / RUN).write_text(json.dumps(body))


def test_counts_per_arm_by_hand(tmp_path, capsys):
    runs = tmp_path / "runs"
    before = debate("10", [("6 + 4 = 10", "10", "stated"), ("add them: ten, so 10", "10", "stated")])
    after = debate("10", [("6 + 4 = 10", "10", "stated"), ("6 + 4", None, "restatement")])
    metrics = [
        {"iteration": 0, "time": 0.0},
        {"iteration": 1, "time": 60.0, "reward_share/r_task": 0.25, "groups/dropped": 1, "groups/debated": 3},
        {
            "iteration": 2,
            "time": 120.0,
            "reward_share/r_task": 0.75,
            "groups/dropped": 0,
            "groups/debated": 2,
        },
    ]
    write_record(runs / "task_only_seed0", "task_only", 0, {0: [before], 2: [after]}, metrics)
    write_record(runs / "udpo_seed0", "udpo", 0, {0: [before], 2: [after, after]}, metrics)
    assert load_script().main([str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    # the untrained team once a seed (not once a record): 2 answers, both credited, the second's 10 not
    # after "=", "is", "equals" or ":"; both stated and right
    assert out[0] == (
        "untrained: 2 answers; credited 2, not stating the gold 1 (50.0%); stated form 100.0%, right when stated 100.0%"
    )
    assert out[1].startswith(
        "task_only: 2 answers; credited 1, not stating the gold 0 (0.0%); stated form 50.0%"
    )
    assert out[2].startswith("udpo: 4 answers; credited 2,")
    assert out[3] == (
        "task_only: reward shares r_task 50.0%; groups dropped 1 of 5; minutes a run [2] (median 2)"
    )
