"""RMAAC's adversary (He et al. 2023, adapted to debate; docs/algorithms.md, "The baselines: MAPPO and
RMAAC"): before each round, it may swap the final answer of at most ``budget`` of the peers an agent reads for
another candidate answer, and picks, among every swap within the budget (and no swap), the one whose resulting
state a critic values lowest.

The state an agent observes in round t >= 1 is the question and the answers after round t - 1: its own
and its peers' (:func:`critic_state` writes it as text, the same text the centralized critic scores in
training). A swapped peer message is replaced by a short statement of the candidate answer
(:func:`answer_statement`), so the agent reads a peer that claims that answer; what the peer wrote stays
in its own history. The choice is recorded in the reader's turn, ``details["adversary"]``
(``{"peer": j, "answer": c, "value": V, "clean_value": V0}``; no entry when no swap was chosen), so
training can rebuild the perturbed state the agent saw.

Candidates (an adaptation the paper leaves open): multiple choice, every other option letter; numeric
tasks, every other answer given in that round plus one decoy, the peer's answer moved by a nonzero
offset drawn from the question id; other tasks, the other answers given in that round.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Hashable, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from ..seeds import derived_seed
from ..tasks.base import Answer, Question, Task
from ..tasks.formats import ChoiceTask, NumericTask
from ..tasks.parsing import canonical_number
from .base import DebateState, Message, Stage

#: value_fn(state texts) -> the critic's value of each state
ValueFn = Callable[[list[str]], list[float]]


def critic_state(question: str, answers: Sequence[Answer] | None) -> str:
    """What the critic sees: the question and, after round 0, every agent's answer of the previous round
    (``answers[i]``, None shown as "no answer"); ``answers=None`` before the first round."""
    lines = [f"Question: {question.strip()}"]
    if answers is None:
        lines.append("No answers yet.")
    else:
        lines += [f"Agent {i + 1}: {'no answer' if a is None else a}" for i, a in enumerate(answers)]
    return "\n".join(lines)


def answer_statement(task: Task, question: Question, answer: Hashable) -> str:
    """A short response stating ``answer`` in the task's format (it parses back to ``answer``)."""
    if isinstance(task, NumericTask):
        return f"I checked my work carefully. The final answer is \\boxed{{{answer}}}."
    if isinstance(task, ChoiceTask):
        return f"Having compared the options, I settle on ({answer}).\nAnswer: ({answer})"
    return f"My final answer: {answer}"


def candidate_answers(
    task: Task, question: Question, peer_answer: Answer, round_answers: Sequence[Answer]
) -> list:
    """The answers the adversary may give a peer whose answer is ``peer_answer`` (see the module docstring)."""
    if isinstance(task, ChoiceTask):
        return [x for x in task.letters(question) if x != peer_answer]
    out = list(dict.fromkeys(a for a in round_answers if a is not None and a != peer_answer))
    if isinstance(task, NumericTask) and peer_answer is not None:
        rng = random.Random(derived_seed("rmaac-decoy", question.id, str(peer_answer)))
        try:
            decoy = canonical_number(Decimal(str(peer_answer)) + rng.choice([d for d in range(-9, 10) if d]))
        except (InvalidOperation, ValueError):
            decoy = None
        if decoy is not None and decoy not in out and decoy != peer_answer:
            out.append(decoy)
    return out


def observed_answers(answers: Sequence[Answer], swap: dict[str, Any] | None) -> list[Answer]:
    """The answers an agent observed: ``answers`` with the adversary's ``swap`` (its ``details`` entry) applied."""
    seen = list(answers)
    for peer, value in _swaps(swap):
        seen[peer] = value
    return seen


def _swaps(swap: dict[str, Any] | None) -> list[tuple[int, Answer]]:
    if not swap:
        return []
    return list(zip(swap["peer"], swap["answer"], strict=True))


class RMAACAdversary(Stage):
    """Swaps the answers of at most ``budget`` peers each agent reads, minimizing ``value_fn`` (the critic).

    Append it after the protocol's selecting stage (it rewrites ``reads`` that stage chose)."""

    name = "rmaac_adversary"

    def __init__(self, task: Task, value_fn: ValueFn, budget: int = 1):
        if budget < 0:
            raise ValueError(f"adversary budget must be >= 0, got {budget}")
        self.task, self.value_fn, self.budget = task, value_fn, budget

    def options(self, state: DebateState, agent: int, rnd: int) -> list[list[tuple[int, Answer]]]:
        """Every perturbation of ``agent``'s reads in round ``rnd`` within the budget, as lists of (peer,
        answer) swaps; the first is the empty one (no swap)."""
        previous = [row[rnd - 1] for row in state.answers]
        peers = sorted({m.agent for m in state.reads[agent] if m.agent != agent})
        per_peer = {j: candidate_answers(self.task, state.question, previous[j], previous) for j in peers}
        out: list[list[tuple[int, Answer]]] = [[]]
        for k in range(1, min(self.budget, len(peers)) + 1):
            for chosen in itertools.combinations(peers, k):
                for values in itertools.product(*(per_peer[j] for j in chosen)):
                    out.append(list(zip(chosen, values, strict=True)))
        return out

    def select(self, states: Sequence[DebateState], rnd: int) -> None:
        if rnd < 1 or self.budget == 0:
            return
        jobs = []  # (state, agent, options, first text index)
        texts: list[str] = []
        for s in states:
            previous = [row[rnd - 1] for row in s.answers]
            for i in s.speakers():
                if i in s.supplied:
                    continue
                options = self.options(s, i, rnd)
                jobs.append((s, i, options, len(texts)))
                for swaps in options:
                    seen = observed_answers(previous, _as_swap(swaps))
                    texts.append(critic_state(s.question.text, seen))
        if not texts:
            return
        values = [float(v) for v in self.value_fn(texts)]
        if len(values) != len(texts):
            raise RuntimeError(f"the critic returned {len(values)} values for {len(texts)} states")
        for s, i, options, start in jobs:
            scores = values[start : start + len(options)]
            best = min(range(len(options)), key=lambda k: (scores[k], k))  # ties: fewer swaps first
            if not options[best]:
                continue
            swapped = dict(options[best])
            s.reads[i] = [
                Message(m.agent, m.round, answer_statement(self.task, s.question, swapped[m.agent]))
                if m.agent in swapped
                else m
                for m in s.reads[i]
            ]
            s.details[i]["adversary"] = {
                **_as_swap(options[best]),
                "value": scores[best],
                "clean_value": scores[0],
            }

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "budget": self.budget}


def _as_swap(swaps: Sequence[tuple[int, Answer]]) -> dict[str, list]:
    return {"peer": [j for j, _ in swaps], "answer": [a for _, a in swaps]}
