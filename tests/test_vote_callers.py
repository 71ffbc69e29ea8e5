"""Every place that votes keys the vote by the debate's question id (SPEC section 1, "Majority vote"): the
debate's prediction, the trainers' rewards, the replay priorities, run summaries, the study tables'
per-question metrics, ``udpo report`` and ``udpo diagnose``. The cases: a 2-1 split (12, 12, 7), whose
leave-one-out votes tie 12 against 7, so L is 0 where 12 wins the tie and 2/3 where 7 does, and a 1-1
split, whose vote is the tie's winner whoever gave it."""

from __future__ import annotations

import hashlib
import json

import pytest
from test_debate import BoxedTask

from udpo.algorithms.actor_critic import team_rewards
from udpo.algorithms.udpo import Coefficients, compute_rewards
from udpo.analysis.diagnose_run import load_run
from udpo.analysis.report.load import load_set
from udpo.analysis.results import question_metrics
from udpo.env.backends.scripted import ScriptedBackend
from udpo.env.debate import DebateConfig, DebateEnv
from udpo.env.summary import summarize
from udpo.env.tasks.base import Question
from udpo.env.trajectory import Trajectory
from udpo.rewards import uncertainty
from udpo.training.replay import ReplayBuffer

#: 12 wins the tie under WINS_12, 7 under WINS_7 (checked below with hashlib)
WINS_12, WINS_7 = "q10", "q0"
SPLIT = [["12"], ["12"], ["7"]]


def digest(key: str, answer: str) -> str:
    return hashlib.sha256(f"{key}\n{answer}".encode()).hexdigest()


def test_the_keys_of_these_cases():
    assert digest(WINS_12, "12") < digest(WINS_12, "7")
    assert digest(WINS_7, "7") < digest(WINS_7, "12")
    # L: without a 12-agent the tie goes to 12 (stable) or to 7 (both 12-agents pivotal)
    assert uncertainty(SPLIT, key=WINS_12).loo_instability == 0.0
    assert uncertainty(SPLIT, key=WINS_7).loo_instability == pytest.approx(2 / 3)


def trajectories() -> list[Trajectory]:
    return [
        Trajectory(question_id=qid, question="?", gold="12", answers=SPLIT, prediction="12", correct=True)
        for qid in (WINS_12, WINS_7)
    ]


def expected_u_sys() -> list[float]:
    return [uncertainty(SPLIT, key=qid).u_sys for qid in (WINS_12, WINS_7)]


def test_trainers_and_replay_read_l_under_the_question_id():
    stable, split = (1 - u for u in expected_u_sys())
    coefficients = Coefficients.from_dict(
        dict.fromkeys(("alpha", "beta", "gamma", "lambda_", "eta"), [1.0] * 3)
    )
    _, terms = compute_rewards(trajectories(), coefficients)
    assert terms["r_sys"].tolist() == pytest.approx([stable, split])
    _, terms = team_rewards(trajectories(), 0.0)
    assert terms["r_sys"].tolist() == pytest.approx([stable, split])
    buffer = ReplayBuffer()
    buffer.add(trajectories())
    assert [r_sys for _, _, r_sys in buffer._terms] == pytest.approx([stable, split])


def test_summaries_and_study_tables_read_l_under_the_question_id():
    expected = expected_u_sys()
    assert expected[0] != pytest.approx(expected[1])
    per_question = question_metrics(trajectories())
    assert [per_question[q]["u_sys"] for q in (WINS_12, WINS_7)] == pytest.approx(expected)
    assert summarize(trajectories())["u_sys"] == pytest.approx(sum(expected) / 2)


def test_report_and_diagnose_read_l_under_the_question_id(tmp_path):
    path = tmp_path / "trajectories.jsonl"
    path.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in trajectories()))
    expected = expected_u_sys()
    assert load_set(path, "run").stats["u_sys"] == pytest.approx(sum(expected) / 2)
    assert load_run(tmp_path).metrics.u_sys.tolist() == pytest.approx(expected)


@pytest.mark.parametrize("seats", [("12", "7"), ("7", "12")])
def test_the_debate_prediction_is_the_keyed_vote_whoever_speaks_first(seats):
    task = BoxedTask(n=0)
    task.questions = [Question(id=q, text=f"question {q}", gold="12") for q in (WINS_12, WINS_7)]
    backend = ScriptedBackend(lambda req, k: f"\\boxed{{{seats[k % 2]}}}")
    out = DebateEnv(task, backend, DebateConfig(n_agents=2, rounds=0)).run(task.load(), progress=False)
    assert [t.answers for t in out] == [[[seats[0]], [seats[1]]]] * 2
    assert [(t.question_id, t.prediction, t.correct) for t in out] == [
        (WINS_12, "12", True),
        (WINS_7, "7", False),
    ]
