"""User reward functions (``reward_functions`` / ``reward_weights``): loading, hand-computed rewards, errors."""

from __future__ import annotations

import math

import pytest
import torch

from udpo.algorithms.reward_functions import boxed_answer, concise, load_reward_functions, parsed_answer
from udpo.algorithms.udpo import Coefficients, compute_rewards
from udpo.env.trajectory import Trajectory, Turn

THIS = __name__  # the functions below are imported by name, as a recipe would


def agent_index(trajectory: Trajectory, agent: int) -> float:
    return float(agent)


def long_question(trajectory: Trajectory, agent: int) -> float:
    return len(trajectory.question) / 10


def not_a_number(trajectory: Trajectory, agent: int):
    return "high"


def nan_reward(trajectory: Trajectory, agent: int) -> float:
    return math.nan


NOT_CALLABLE = 3


def debate(texts: list[list[str]], answers: list[list], question: str = "What is 1+1?") -> Trajectory:
    turns = [
        [Turn(agent=i, round=t, messages=[], text=text, answer=answers[i][t]) for t, text in enumerate(row)]
        for i, row in enumerate(texts)
    ]
    return Trajectory("q1", question, "2", answers, "2", True, turns=turns)


UNANIMOUS = debate([["\\boxed{2}", "\\boxed{2}"], ["2", "\\boxed{2}"]], [["2", "2"], ["2", "2"]])


def test_weighted_functions_add_to_every_agents_reward():
    # N = 2, T = 1, unanimous and stable: r_intra = r_inter = r_sys = r_task = 1, so eq. 4 gives 1 + 1 + 1 + 1
    coef = Coefficients.uniform(2, 1.0, 1.0, 1.0, 1.0, 0.0)
    plain, _ = compute_rewards([UNANIMOUS], coef)
    assert plain.tolist() == [[4.0, 4.0]]
    functions = load_reward_functions([f"{THIS}:agent_index", f"{THIS}:long_question"], [0.5, 2.0])
    rewards, terms = compute_rewards([UNANIMOUS], coef, functions=functions)
    # agent i gets 0.5 * i + 2 * len("What is 1+1?") / 10 = 0.5 i + 2.4
    assert rewards[0].tolist() == pytest.approx([4.0 + 2.4, 4.0 + 0.5 + 2.4])
    assert terms[f"{THIS}:agent_index"].tolist() == [[0.0, 1.0]]  # logged unweighted
    assert isinstance(terms[f"{THIS}:long_question"], torch.Tensor)


def test_weights_default_to_one():
    (f,) = load_reward_functions([f"{THIS}:agent_index"])
    assert f.weight == 1.0 and f.name == f"{THIS}:agent_index"


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("no_such_module_xyz:f", "cannot import 'no_such_module_xyz:f'"),
        (f"{THIS}:missing", f"cannot import '{THIS}:missing'"),
        (f"{THIS}:NOT_CALLABLE", "is a int, not a function"),
    ],
)
def test_bad_specs_are_named(spec, match):
    with pytest.raises(ValueError, match=match):
        load_reward_functions([spec])


@pytest.mark.parametrize(
    ("name", "match"),
    [("not_a_number", "returned str 'high' for question q1, agent 0"), ("nan_reward", "returned nan")],
)
def test_bad_values_stop_with_the_function_question_and_agent(name, match):
    functions = load_reward_functions([f"{THIS}:{name}"])
    with pytest.raises(ValueError, match=match):
        compute_rewards([UNANIMOUS], Coefficients.uniform(2), functions=functions)


def test_example_functions_on_a_hand_made_debate():
    # agent 0 boxed both answers, agent 1 only the second; agent 1's first answer did not parse
    t = debate([["\\boxed{2}", "\\boxed{2}"], ["two", "\\boxed{2}"]], [["2", "2"], [None, "2"]])
    assert [boxed_answer(t, i) for i in range(2)] == [1.0, 0.5]
    assert [parsed_answer(t, i) for i in range(2)] == [1.0, 0.5]


def test_concise_is_minus_the_mean_response_length_in_hundreds_of_tokens():
    t = debate([["a", "b"], ["c", "d"]], [["2", "2"], ["2", "2"]])
    t.turns[0][0].completion_ids, t.turns[0][1].completion_ids = [1] * 30, [1] * 10  # mean 20 tokens
    t.turns[1][0].completion_ids, t.turns[1][1].completion_ids = [1] * 100, [1] * 300  # mean 200
    assert [concise(t, i) for i in range(2)] == pytest.approx([-0.2, -2.0])


def test_the_dae_reward_loads_through_the_hook():
    (fn,) = load_reward_functions(["udpo.rewards.diverse_agent_entropy:dae_certainty_reward"])
    # both agents keep "2" in both rounds: one answer, no spread, normalized DAE 0, reward 1
    assert [fn.fn(UNANIMOUS, i) for i in range(2)] == pytest.approx([1.0, 1.0])
