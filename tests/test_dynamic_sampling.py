"""Informative batches (udpo.training.dynamic_sampling): which groups carry a within-question signal, the
reward terms' shares of it, dynamic sampling's refill and its cap on scripted debates, and in the trainer
on the tiny model: uninformative questions dropped and counted, the cap, an exact resume, and MAPPO."""

from __future__ import annotations

import pytest
import torch
import train_helpers
from test_baselines import tensors
from train_helpers import informative_question, read_jsonl, tiny_config

from udpo.env.tasks.base import Question
from udpo.env.trajectory import Trajectory
from udpo.training import checkpoint_store as ckpt
from udpo.training.callbacks import UDPOCallback
from udpo.training.dynamic_sampling import (
    agents_without_signal,
    draw_informative,
    extra_cap,
    informative_groups,
    reward_shares,
    zero_advantage_agents,
)
from udpo.training.trainer import Trainer


def test_a_group_is_informative_when_some_agent_s_reward_differs():
    rewards = torch.tensor([[1.0, 0.5], [1.0, 0.5], [0.0, 1.0], [1.0, 1.0], [0.3, 0.3], [0.3, 0.3]])
    ids = ["a", "a", "b", "b", "c", "c"]
    flat = agents_without_signal(rewards, ids)
    assert {g: v.tolist() for g, v in flat.items()} == {
        "a": [True, True],
        "b": [False, True],  # agent 0 got 0 then 1; agent 1 the same 1 twice
        "c": [True, True],
    }
    assert informative_groups(rewards, ids) == ["b"]
    assert zero_advantage_agents(rewards, ids) == 5  # a: 2, b: 1, c: 2
    # a float sum that differs in the last bit is the same reward
    assert informative_groups(torch.tensor([[0.1 + 0.2], [0.3]]), ["q", "q"]) == []


def test_reward_shares_of_the_within_question_differences_by_hand():
    # one question, two debates, one agent: r_task 1 then 0 (weight 1), r_inter 0.2 then 0.6 (weight 0.5)
    parts = {"r_task": torch.tensor([[1.0], [0.0]]), "r_inter": torch.tensor([[0.1], [0.3]])}
    # deviations from the group mean: r_task |0.5| + |0.5| = 1.0, r_inter |0.1| + |0.1| = 0.2
    shares = reward_shares(parts, ["q", "q"])
    assert shares == pytest.approx({"r_task": 1.0 / 1.2, "r_inter": 0.2 / 1.2})
    # a second question whose terms do not vary adds nothing; groups are not mixed
    parts2 = {k: torch.cat([v, torch.tensor([[5.0], [5.0]])]) for k, v in parts.items()}
    assert reward_shares(parts2, ["q", "q", "p", "p"]) == pytest.approx(shares)
    assert reward_shares({"r_task": torch.ones(2, 3)}, ["q", "q"]) == {}  # nothing differs
    assert reward_shares({"r_task": torch.tensor([[0.0], [1.0]])}, ["q", "p"]) == {}  # lone debates


def scripted(informative: set[str]):
    """The stream q0, q1, ... (take from an offset), debates that record their question (debate), and rewards that
    differ between a question's debates only for the ``informative`` questions (rewards)."""

    def take(offset: int, n: int) -> list[Question]:
        return [Question(id=f"q{offset + j}", text="", gold=0) for j in range(n)]

    def debate(questions: list[Question]) -> list[Trajectory]:
        return [Trajectory(q.id, "", 0, [[None]], None, False) for q in questions]

    def rewards(debates: list[Trajectory]) -> torch.Tensor:
        seen: dict[str, int] = {}
        out = []
        for t in debates:
            k = seen[t.question_id] = seen.get(t.question_id, -1) + 1
            out.append([float(k) if t.question_id in informative else 0.5])
        return torch.tensor(out)

    return take, debate, rewards


def test_a_batch_of_identical_rewards_is_refilled_from_the_stream():
    take, debate, rewards = scripted(informative={"q1", "q3", "q4", "q5"})
    draw = draw_informative(3, 2, take, debate, rewards, dynamic=True, max_extra=6)
    # q0..q2 give one informative (q1); q3, q4 are drawn and both count: three informative, in stream order
    assert [t.question_id for t in draw.kept] == ["q1", "q1", "q3", "q3", "q4", "q4"]
    assert [t.question_id for t in draw.debated][::2] == ["q0", "q1", "q2", "q3", "q4"]
    assert (draw.questions, draw.informative, draw.dropped, draw.cap_hit) == (5, 3, 2, False)
    assert draw.metrics() == {
        "groups/planned": 3,
        "groups/debated": 5,
        "groups/informative": 3,
        "groups/uninformative": 2,
        "groups/dropped": 2,
        "groups/extra_draws": 2,
        "groups/cap_hit": 0,
    }


def test_the_cap_on_extra_draws_holds():
    take, debate, rewards = scripted(informative={"q5"})
    draw = draw_informative(2, 2, take, debate, rewards, dynamic=True, max_extra=extra_cap(2, 1.5))
    assert extra_cap(2, 1.5) == 3
    # 2 planned + 3 extra = q0..q4, none informative (q5 is never drawn): the update gets nothing
    assert (draw.questions, draw.informative, draw.dropped, draw.cap_hit) == (5, 0, 5, True)
    assert draw.kept == [] and len(draw.debated) == 10
    take, debate, rewards = scripted(informative={"q0"})
    draw = draw_informative(2, 2, take, debate, rewards, dynamic=True, max_extra=0)
    assert (draw.questions, draw.informative, draw.cap_hit) == (2, 1, True)
    assert [t.question_id for t in draw.kept] == ["q0", "q0"]


def test_without_dynamic_sampling_or_a_group_every_debate_is_kept_and_counted():
    take, debate, rewards = scripted(informative={"q1"})
    off = draw_informative(3, 2, take, debate, rewards, dynamic=False, max_extra=6)
    assert (len(off.kept), off.questions, off.informative, off.dropped) == (6, 3, 1, 0)
    take, debate, rewards = scripted(informative=set())
    lone = draw_informative(3, 1, take, debate, rewards, dynamic=True, max_extra=6)
    assert (len(lone.kept), lone.questions, lone.dropped, lone.cap_hit) == (3, 3, 0, False)


def test_the_reward_parts_sum_to_the_rewards(digit_model, tmp_path):
    """UDPO's parts (per-agent weights times the terms, and a user term) and MAPPO's (task and consensus)."""
    for algorithm in ("udpo", "mappo"):
        extra = {"reward_functions": ["train_helpers:token_parity"]} if algorithm == "udpo" else {}
        config = tiny_config(
            digit_model,
            tmp_path / algorithm,
            algorithm=algorithm,
            debates_per_question=2,
            **{**train_helpers.EXPLICIT, "beta": [0.2, 0.7]},
            **extra,
        )
        with Trainer(config) as trainer:
            trainer.use_calibration(trainer.calibrate()[0])
            batch = trainer.rollout_batch(trainer.debate(trainer.schedule.for_iteration(1) * 2, {}))
            parts = trainer.algorithm.reward_parts(batch)
        assert torch.allclose(sum(parts.values()), batch.rewards, atol=1e-6)
        assert set(parts) == (
            {"r_intra", "r_inter", "r_sys", "r_task", "train_helpers:token_parity"}
            if algorithm == "udpo"
            else {"r_task", "consensus"}
        )


@pytest.fixture(scope="module")
def digit_model(tokenizer_path, tmp_path_factory) -> str:
    return train_helpers.digit_model(tokenizer_path, tmp_path_factory)


#: only the scripted term counts: half the questions informative (train_helpers.parity_on_half)
HALF = {
    "warmup_fraction": 0.0,
    "alpha": [0.0],
    "beta": [0.0],
    "gamma": [0.0],
    "lambda_": [0.0],
    "eta": [0.01],
    "reward_functions": ["train_helpers:parity_on_half"],
    "debates_per_question": 2,
    "baseline": "group",
    "eval_questions": 0,
    "dtype": "fp32",
}


class StopAt(UDPOCallback):
    """Ends the run after iteration ``k`` (with its checkpoint), as a kill after that checkpoint would."""

    def __init__(self, k: int):
        self.k = k

    def on_iteration_end(self, trainer, iteration, metrics) -> None:
        if iteration == self.k:
            trainer.should_training_stop = True


def train_lines(run) -> list[dict]:
    drop = ("time", "tokens_per_s", "memory")
    return [
        {k: v for k, v in r.items() if not k.startswith(drop)}
        for r in read_jsonl(run / "metrics.jsonl")
        if r["kind"] == "train"
    ]


def test_uninformative_questions_are_dropped_counted_and_a_resume_is_exact(tiny_model, tmp_path):
    """Three iterations of 2 informative questions of 2 debates each; the same run stopped after its
    first iteration and resumed: the same debates (the extra draws too), metrics and adapters."""
    whole = tmp_path / "whole"
    with Trainer(tiny_config(tiny_model, whole, max_iterations=3, **HALF)) as trainer:
        trainer.train()
    lines = train_lines(whole)
    debates = read_jsonl(whole / "trajectories" / "train.jsonl")
    drawn = 0
    for line in lines:
        k = line["iteration"]
        mine = [d for d in debates if d["meta"]["iteration"] == k]
        questions = list(dict.fromkeys(d["question_id"] for d in mine))
        useful = [q for q in questions if informative_question(q)]
        # each question debated twice; every one its own group here (30 questions, 12 drawn at most)
        assert len(mine) == 2 * len(questions) == line["debates"]
        assert line["groups/debated"] == len(questions) == 2 + line["groups/extra_draws"]
        assert line["groups/dropped"] == line["groups/uninformative"] == len(questions) - len(useful)
        assert line["groups/informative"] == len(useful) == 2  # refilled to plan (the cap: 4 extra)
        assert [d["question_id"] for d in mine if not d["meta"].get("dropped")] == [
            q for q in questions if informative_question(q) for _ in range(2)
        ]
        assert line["reward_share/train_helpers:parity_on_half"] == 1.0  # the only term that varies
        assert line["update/skipped"] == 0
        drawn += len(questions)
        assert line["questions_drawn"] == drawn
    # iteration 1 refilled: the resumed run must continue the stream where it left off, not at 2 x 1
    assert lines[0]["groups/extra_draws"] > 0, [line["groups/extra_draws"] for line in lines]

    resumed = tmp_path / "resumed"
    config = tiny_config(tiny_model, resumed, max_iterations=3, **HALF)
    with Trainer(config, callbacks=[StopAt(1)]) as trainer:
        trainer.train()
    assert [r["iteration"] for r in train_lines(resumed)] == [1]
    state = ckpt.read_state(resumed / "checkpoints" / "iter_000001")
    assert state["questions_drawn"] == lines[0]["questions_drawn"]
    with Trainer(tiny_config(tiny_model, resumed, max_iterations=3, resume="latest", **HALF)) as trainer:
        trainer.train()
    assert train_lines(resumed) == lines
    texts = lambda run: [  # noqa: E731
        (d["question_id"], [[t["text"] for t in row] for row in d["turns"]])
        for d in read_jsonl(run / "trajectories" / "train.jsonl")
    ]
    assert texts(resumed) == texts(whole)
    final = "checkpoints/iter_000003/adapters"
    a, b = tensors(whole / final), tensors(resumed / final)
    assert a.keys() == b.keys() and a
    assert all(torch.equal(a[name][key], b[name][key]) for name in a for key in a[name])


def test_at_the_cap_with_nothing_informative_the_update_is_skipped_and_logged(tiny_model, tmp_path):
    """Every reward 0: each iteration draws its 2 questions and the cap's 2 x 1.0 more, then skips."""
    settings = {**HALF, "reward_functions": [], "dynamic_sampling_max_extra": 1.0}
    run = tmp_path / "run"
    with Trainer(tiny_config(tiny_model, run, max_iterations=2, **settings)) as trainer:
        trainer.train()
        assert trainer.updater.steps == 0
    for line in train_lines(run):
        assert (line["groups/extra_draws"], line["groups/cap_hit"], line["update/skipped"]) == (2, 1, 1)
        assert (line["groups/informative"], line["groups/dropped"], line["debates"]) == (0, 4, 8)
    debates = read_jsonl(run / "trajectories" / "train.jsonl")
    assert len(debates) == 16 and all(d["meta"]["dropped"] for d in debates)


def test_mappo_trains_on_informative_groups(digit_model, tmp_path):
    run = tmp_path / "run"
    settings = {"debates_per_question": 2, "baseline": "group", "eval_questions": 0, "eta": [0.01]}
    with Trainer(tiny_config(digit_model, run, algorithm="mappo", max_iterations=2, **settings)) as trainer:
        trainer.train()
    for line in train_lines(run):
        assert line["groups/informative"] + line["groups/dropped"] == line["groups/debated"]
        if not line["update/skipped"]:
            assert "critic/value_loss" in line and line["groups/informative"] >= 1
            assert sum(v for k, v in line.items() if k.startswith("reward_share/")) == pytest.approx(1.0)


@pytest.mark.slow
def test_mappo_with_dynamic_sampling_killed_with_sigkill_resumes_exactly(digit_model, tmp_path):
    """MAPPO on groups of 2 with dynamic sampling: a run killed after its first checkpoint and resumed
    debates the same questions (the extra draws too) and ends with the same metrics and adapters."""
    from test_baselines import SETTINGS, whole_and_killed

    whole, killed = whole_and_killed(
        tmp_path, digit_model, algorithm="mappo", debates_per_question=2, baseline="group", **SETTINGS
    )
    lines = train_lines(whole)
    assert [r["iteration"] for r in lines] == [1, 2, 3]
    assert sum(r["groups/extra_draws"] for r in lines[1:]) > 0, "no refill after the kill: pick a seed"
    assert train_lines(killed) == lines
    ids = [
        [d["question_id"] for d in read_jsonl(run / "trajectories" / "train.jsonl")]
        for run in (whole, killed)
    ]
    assert ids[0] == ids[1]
    final = "checkpoints/iter_000003"
    a, b = tensors(whole / final), tensors(killed / final)
    assert a.keys() == b.keys() and a
    assert all(torch.equal(a[name][key], b[name][key]) for name in a for key in a[name])
