"""Reward functions of TRL's form, used as they are (issue 51): told apart from the per-trajectory form by
the signature, called once per batch of debates and agent with TRL's keywords and every field of the
records, and giving the numbers of the per-trajectory form of the same reward."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest

from udpo.algorithms.reward_functions import load_reward_functions
from udpo.algorithms.trl_rewards import takes_batches
from udpo.env.backends.scripted import ScriptedBackend
from udpo.env.debate import DebateConfig, DebateEnv
from udpo.env.tasks.custom import DatasetTask

RECORDS = [
    {"question": "What is 2 + 3?", "answer": 5, "ground_truth": "5", "prompt": "unused"},
    {"question": "What is 4 + 3?", "answer": 7, "ground_truth": "7", "prompt": "unused"},
    {"question": "What is 1 + 1?", "answer": 2, "ground_truth": "2", "prompt": "unused"},
]


def reply(request, k: int) -> str:
    """Replies of five kinds in turn, around the right sum of the question asked."""
    a, b = map(int, re.findall(r"(\d+) \+ (\d+)", request.messages[1]["content"])[0])
    return [
        f"<think>{a} and {b} make {a + b}.</think><answer>\\boxed{{{a + b}}}</answer>",
        f"The sum is \\boxed{{{a + b}}}.",
        "<think>hmm</think> \\boxed{3}",
        f"I think it is \\boxed{{{a + b + 1}}}",
        f"<think>{a + b}</think><answer>{a + b}</answer>",
    ][k % 5]


@pytest.fixture(scope="module")
def debates():
    """Three real debates (2 agents, 2 rounds) on records with a ground_truth field, scripted replies."""
    task = DatasetTask(train=RECORDS, question_field="question")
    env = DebateEnv(task, ScriptedBackend(reply), DebateConfig(n_agents=2, rounds=1))
    return env.run(task.load("train"), progress=False)


# --- reward functions as TRL's GRPOTrainer documentation writes them ("Using a custom reward function") ---
def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    completion_contents = [completion[0]["content"] for completion in completions]
    matches = [re.match(pattern, content) for content in completion_contents]
    return [1.0 if match else 0.0 for match in matches]


def length_reward_func(completions, **kwargs):
    """Reward function that assigns higher scores to longer completions (in terms of character count)."""
    return [float(len(completion)) for completion in completions]


def ground_truth_reward_func(completions, ground_truth, **kwargs):
    # Regular expression to capture content inside \boxed{}
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]  # noqa: B905


# --- the same rewards in the per-trajectory form -----------------------------------------------------------
def last_reply(trajectory, agent: int) -> str:
    return trajectory.turns[agent][-1].text


def well_formed(trajectory, agent: int) -> float:
    return float(
        re.match(r"^<think>.*?</think><answer>.*?</answer>$", last_reply(trajectory, agent)) is not None
    )


def characters(trajectory, agent: int) -> float:
    return float(len(last_reply(trajectory, agent)))


def boxed_ground_truth(trajectory, agent: int) -> float:
    boxed = re.search(r"\\boxed\{(.*?)\}", last_reply(trajectory, agent))
    return float(boxed is not None and boxed.group(1) == trajectory.meta["columns"]["ground_truth"])


def thinks_first(trajectory, agent: int) -> float:
    """trl.rewards.think_format_reward's rule: one <think>...</think> block that opens the reply."""
    text = last_reply(trajectory, agent)
    return float(text.startswith("<think>") and text.count("<think>") == 1 and "</think>" in text)


def overlong(trajectory, agent: int) -> float:
    """DAPO's soft overlong punishment (L_max 40, cache 10) on the reply's token count."""
    n = len(trajectory.turns[agent][-1].completion_ids)
    return 0.0 if n <= 30 else -1.0 if n > 40 else (30 - n) / 10


def scores(fn, trajectories, reward_format="conversational"):
    (loaded,) = load_reward_functions([fn], reward_format=reward_format)
    return loaded.scores(trajectories, 2)


def test_the_two_forms_are_told_apart_by_the_signature():
    class Scorer:
        def __call__(self, prompts, completions, **kwargs):
            return [0.0] * len(prompts)

    assert all(
        takes_batches(f)
        for f in (
            format_reward_func,
            ground_truth_reward_func,
            Scorer(),
            lambda completion_ids: [],
            lambda **kw: [],
        )
    )
    assert not any(takes_batches(f) for f in (well_formed, lambda t, i: 0.0, len))
    assert [f.batched for f in load_reward_functions([format_reward_func, well_formed])] == [True, False]


def test_trl_documentation_examples_give_the_per_trajectory_numbers(debates):
    for trl_form, ours, reward_format in (
        (format_reward_func, well_formed, "conversational"),
        (length_reward_func, characters, "standard"),
        (ground_truth_reward_func, boxed_ground_truth, "standard"),
    ):
        got = scores(trl_form, debates, reward_format)
        np.testing.assert_array_equal(got, scores(ours, debates), err_msg=trl_form.__name__)
        assert len(np.unique(got)) > 1, trl_form.__name__  # the batch tells good replies from bad ones


def test_trl_own_reward_functions_give_the_per_trajectory_numbers(debates):
    rewards = pytest.importorskip("trl.rewards")
    got = scores(rewards.think_format_reward, debates)
    np.testing.assert_array_equal(got, scores(thinks_first, debates))
    assert got.min() == 0 and got.max() == 1
    punish = rewards.get_soft_overlong_punishment(max_completion_len=40, soft_punish_cache=10)
    got = scores(punish, debates)
    np.testing.assert_allclose(got, scores(overlong, debates))
    assert got.min() < got.max()


def test_what_a_trl_function_receives(debates):
    calls = []

    def recorder(prompts, completions, **kwargs):
        calls.append({"prompts": prompts, "completions": completions, **kwargs})
        return [0.5] * len(prompts)

    conversational = scores(recorder, debates)
    assert conversational.tolist() == [[0.5, 0.5]] * 3 and len(calls) == 2  # once per agent, all debates
    first, second = calls
    assert first["agent"] == 0 and second["agent"] == 1 and first["trajectories"] == debates
    assert first["round"] == [1, 1, 1]
    for m, t in enumerate(debates):
        last = t.turns[1][-1]
        assert second["prompts"][m] == last.messages and second["prompts"][m][-1]["role"] == "user"
        assert second["completions"][m] == [{"role": "assistant", "content": last.text}]
        assert second["completion_ids"][m] == last.completion_ids
    for field in ("question", "answer", "ground_truth"):
        assert first[field] == [r[field] for r in RECORDS]
    assert "prompt" not in first  # as TRL: the prompt column is what `prompts` holds
    calls.clear()
    scores(recorder, debates, "standard")
    assert calls[0]["completions"] == [t.turns[0][-1].text for t in debates]
    assert calls[0]["prompts"] == [t.turns[0][-1].messages[-1]["content"] for t in debates]


def test_a_function_without_kwargs_gets_what_it_names(debates):
    def exact(completions, answer):
        return [float(f"\\boxed{{{a}}}" in c[0]["content"]) for c, a in zip(completions, answer, strict=True)]

    assert scores(exact, debates).sum() > 0

    def wants(completions, solution):
        return [0.0] * len(completions)

    with pytest.raises(
        ValueError,
        match=r"needs 'solution': neither a keyword .* nor a field of the records \(question, answer, ground_truth\)",
    ):
        scores(wants, debates)


def test_bad_returns_and_clashing_fields_are_named(debates):
    def short(completions, **kwargs):
        return [1.0]

    with pytest.raises(
        ValueError, match=r"short returned 1 values for 3 completions.*one value per completion"
    ):
        scores(short, debates)
    with pytest.raises(ValueError, match="returned float 1.0 for 3 completions"):
        scores(lambda completions, **kw: 1.0, debates)
    with pytest.raises(ValueError, match="returned str 'x' for question"):
        scores(lambda completions, **kw: ["x"] * len(completions), debates)
    with pytest.raises(ValueError, match="returned nan for question"):
        scores(lambda completions, **kw: [float("nan")] * len(completions), debates)
    as_array = scores(lambda completions, **kw: np.arange(len(completions)) / 2, debates)
    assert as_array.tolist() == [[0.0, 0.0], [0.5, 0.5], [1.0, 1.0]]
    not_for_all = scores(lambda completions, **kw: [None, 1.0, None], debates)  # TRL's "does not apply"
    assert not_for_all.tolist() == [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]

    async def remote(completions, **kwargs):
        await asyncio.sleep(0)
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match="is async"):
        load_reward_functions([remote])
    task = DatasetTask(train=[{"question": "q", "answer": 1, "round": 3}])
    clashing = DebateEnv(task, ScriptedBackend(["\\boxed{1}"]), DebateConfig(n_agents=2, rounds=0)).run(
        task.load("train"), progress=False
    )
    with pytest.raises(ValueError, match="field named 'round', a keyword UDPO passes"):
        scores(format_reward_func, clashing)
    assert scores(well_formed, clashing).shape == (1, 2)  # the per-trajectory form does not mind


@pytest.mark.slow
def test_udpo_needs_no_trl(tmp_path):
    """trl is optional (udpo[trl]): with it unimportable, the package, the API and the command line's
    config parser load, and a recipe parses."""
    import subprocess
    import sys

    recipe = tmp_path / "r.yaml"
    recipe.write_text("rounds: 3\n")
    code = (
        "import sys; sys.modules['trl'] = None\n"
        "import udpo, udpo.api, udpo.training.trainer\n"
        "from udpo.config import parse_config\n"
        f"c = parse_config(['--config', {str(recipe)!r}, '--n_agents', '2', '--output_dir', {str(tmp_path)!r}])\n"
        "print(c.rounds, c.n_agents, 'trl' in sys.modules and sys.modules['trl'] is not None)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["3", "2", "False"]
