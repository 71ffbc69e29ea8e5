"""Debate logic on the scripted backend: batching, synchronous rounds, voting, early stop."""

from __future__ import annotations

import hashlib
import re

import pytest

from udpo.env.backends.base import ChatRequest
from udpo.env.backends.scripted import ScriptedBackend
from udpo.env.debate import AgentSpec, DebateConfig, DebateEnv
from udpo.env.tasks.base import Question, Task


class BoxedTask(Task):
    """A minimal task double: questions given in code, answers in \\boxed{}."""

    name = "boxed"

    def __init__(self, n: int = 2):
        self.questions = [Question(id=f"q{k}", text=f"question {k}", gold=str(k)) for k in range(n)]

    def load(self, split="test", data_path=None, limit=None, seed=0):
        return self.questions[:limit]

    def format_instruction(self, question):
        return "Answer in \\boxed{}."

    def parse(self, text, question):
        m = re.findall(r"\\boxed\{([^}]*)\}", text)
        return m[-1] if m else None


def test_one_backend_call_per_round_with_every_question_and_agent():
    task = BoxedTask(n=3)
    backend = ScriptedBackend(lambda req, k: "\\boxed{0}")
    env = DebateEnv(task, backend, DebateConfig(n_agents=4, rounds=2, debate_batch_size=8))
    trajs = env.run(task.load(), progress=False)
    assert len(backend.calls) == 3  # rounds 0, 1, 2
    assert all(len(call) == 3 * 4 for call in backend.calls)
    assert [t.n_agents for t in trajs] == [4, 4, 4]
    assert all(t.n_rounds == 2 for t in trajs)


def test_batch_size_splits_questions():
    task = BoxedTask(n=5)
    backend = ScriptedBackend(["\\boxed{1}"])
    DebateEnv(task, backend, DebateConfig(n_agents=2, rounds=1, debate_batch_size=2)).run(
        task.load(), progress=False
    )
    assert [len(c) for c in backend.calls] == [4, 4, 4, 4, 2, 2]


def test_rounds_are_synchronous_and_peers_are_shown():
    """Round t shows each agent the round t-1 responses of all its peers, never its own or later ones."""
    task = BoxedTask(n=1)

    def script(req: ChatRequest, k: int) -> str:
        rnd = sum(m["role"] == "assistant" for m in req.messages)
        agent = int(req.adapter[-1])
        return f"agent{agent} round{rnd} \\boxed{{{agent}}}"

    cfg = DebateConfig(n_agents=3, rounds=2, agents=[AgentSpec(adapter=f"a{i}") for i in range(3)])
    backend = ScriptedBackend(script)
    traj = DebateEnv(task, backend, cfg).run(task.load(), progress=False)[0]
    last_user = traj.turns[0][2].messages[-1]["content"]
    assert "agent1 round1" in last_user and "agent2 round1" in last_user
    assert "round0" not in last_user and "agent0 round1" not in last_user
    # own history: system, user, assistant(r0), user, assistant(r1), user
    roles = [m["role"] for m in traj.turns[0][2].messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert [r.adapter for r in backend.calls[0]] == ["a0", "a1", "a2"]


def test_vote_unparsed_and_correctness():
    task = BoxedTask(n=1)  # gold "0"
    outputs = iter(["\\boxed{5}", "no answer", "\\boxed{0}", "\\boxed{0}", "garbled", "\\boxed{5}"])
    backend = ScriptedBackend(lambda req, k: next(outputs))
    traj = DebateEnv(task, backend, DebateConfig(n_agents=3, rounds=1)).run(task.load(), progress=False)[0]
    assert traj.answers == [["5", "0"], [None, None], ["0", "5"]]
    # final round: "0", None, "5": the tie goes to the answer of smaller sha256(question id, answer)
    assert hashlib.sha256(b"q0\n0").hexdigest() < hashlib.sha256(b"q0\n5").hexdigest()
    assert traj.prediction == "0" and traj.correct


def test_all_unparsed_is_wrong():
    task = BoxedTask(n=1)
    traj = DebateEnv(task, ScriptedBackend(["I refuse"]), DebateConfig(n_agents=2, rounds=1)).run(
        task.load(), progress=False
    )[0]
    assert traj.prediction is None and not traj.correct


def test_early_stop_carries_answers_forward_and_skips_requests():
    task = BoxedTask(n=2)

    def script(req, k):  # question 0: unanimous at once; question 1: agents disagree in round 0
        q1 = "question 1" in req.messages[1]["content"]
        return f"\\boxed{{{k % 2 if q1 else 7}}}"

    backend = ScriptedBackend(script)
    trajs = DebateEnv(task, backend, DebateConfig(n_agents=2, rounds=3, early_stop=True)).run(
        task.load(), progress=False
    )
    assert trajs[0].answers == [["7"] * 4, ["7"] * 4]
    assert len(trajs[0].turns[0]) == 1 and trajs[0].meta["rounds_run"] == 0
    assert [len(c) for c in backend.calls][0] == 4
    assert all(len(c) == 2 for c in backend.calls[1:])  # only question 1 continues


def test_bad_config():
    with pytest.raises(ValueError, match="n_agents"):
        DebateConfig(n_agents=0)
    with pytest.raises(ValueError, match="agent specs"):
        DebateConfig(n_agents=2, agents=[AgentSpec()])
    with pytest.raises(ValueError, match="rounds"):
        DebateConfig(rounds=-1)
