"""A committed debate graded again by today's grader and vote (``udpo study PLAN --tables-only --grader
current``).

A record keeps every turn's text (:mod:`udpo.study.record`), so its grading can be redone: each turn's answer
is read again from its text by the run's task (:meth:`udpo.env.tasks.base.Task.read`, against the debate's
question), the answers of agents that did not speak in a round are carried forward as the debate carried
them, the team's prediction is the vote of the final round (:func:`udpo.rewards.majority_vote`, keyed by the
question id) and ``correct`` is the task's :meth:`~udpo.env.tasks.base.Task.is_correct` of it.
:func:`regrade` is the one function that does this; every table of a re-graded study reads its debates.

:data:`GRADERS`: ``recorded`` reads the answers, votes and ``correct`` as the run recorded them (the grader
and vote of its day); ``current`` re-grades them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from udpo.env.answer_forms import debate_question
from udpo.env.tasks.base import Task
from udpo.env.trajectory import Trajectory
from udpo.rewards import majority_vote

#: how a study's tables grade its records: as recorded, or again by today's grader and vote
GRADERS = ("recorded", "current")


def regrade(trajectory: Trajectory, task: Task) -> Trajectory:
    """``trajectory`` with each turn's answer and form read again from its text by ``task``, the answer
    matrix rebuilt from them (an agent without a turn in a round keeps its previous answer), the final
    round voted again and ``correct`` judged again; everything else as recorded."""
    if not trajectory.turns or any(not row for row in trajectory.turns):
        raise ValueError(
            f"debate {trajectory.question_id!r} keeps no turns (or an agent without any): nothing to re-grade"
        )
    question = debate_question(trajectory)
    turns = []
    answers: list[list[Any]] = []
    for i, row in enumerate(trajectory.turns):
        read = []
        for turn in row:
            reading = task.read(turn.text, question)
            read.append(replace(turn, answer=reading.answer, form=reading.form))
        by_round = {turn.round: turn.answer for turn in read}
        if 0 not in by_round:
            raise ValueError(f"debate {trajectory.question_id!r}: agent {i} has no turn in round 0")
        column: list[Any] = []
        for t in range(len(trajectory.answers[i])):
            column.append(by_round[t] if t in by_round else column[-1])
        turns.append(read)
        answers.append(column)
    prediction = majority_vote([row[-1] for row in answers], trajectory.question_id)
    return replace(
        trajectory,
        answers=answers,
        turns=turns,
        prediction=prediction,
        correct=task.is_correct(prediction, question),
    )


def check_grader(grader: str) -> str:
    """``grader`` if it is one of :data:`GRADERS`, else a ValueError naming them."""
    if grader not in GRADERS:
        raise ValueError(f"unknown grader {grader!r}; choose one of {', '.join(GRADERS)}")
    return grader
