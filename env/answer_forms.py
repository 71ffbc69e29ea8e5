"""The reward-hacking monitor: how each agent's answers were read (docs/metrics.md, "Answer forms and echo
rate").

Every turn records the form its answer was read in (``Turn.form``, one of
:data:`~udpo.env.tasks.parsing.FORMS`: ``box``, ``stated``, ``letter``, ``restatement``, ``all_options``,
``none``, ``custom``; ``unknown`` in a record written before forms were). Per agent, over all its turns
(every round of every debate), :func:`form_shares` gives the share of each form and the **echo rate**:
the share of its turns, among those whose form is known, that the grader refused for restating the
question (``restatement`` or ``all_options``). A policy drifting toward a form the grader likes shows here
before it shows up as accuracy.

The form depends only on a turn's text and its question (:func:`answer_form`), so a committed record can
be read again under the current parser (:func:`regraded_forms`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .tasks.base import Question, Task
from .tasks.parsing import FORM_UNKNOWN, FORMS, REFUSED_FORMS
from .trajectory import Trajectory, Turn

#: a debate as the monitor reads it: a Trajectory or its JSONL record
Debate = Trajectory | Mapping[str, Any]


def answer_form(task: Task, text: str, question: Question) -> str:
    """The form in which ``task`` reads the answer of ``text``, a reply to ``question``."""
    return task.read(text, question).form


def recorded_forms(debate: Debate) -> list[list[str]]:
    """``forms[i][t]``: the form recorded for agent i's turn t (``unknown`` where none was)."""
    rows = debate.turns if isinstance(debate, Trajectory) else debate.get("turns") or []
    return [[_form_of(turn) for turn in row] for row in rows]


def regraded_forms(task: Task, debate: Debate) -> list[list[str]]:
    """``forms[i][t]`` as ``task`` reads each turn's text now, against the debate's question text (and its
    options, for a record that kept them in ``meta["options"]``): a committed record graded again."""
    record = debate.to_dict() if isinstance(debate, Trajectory) else debate
    question = debate_question(debate)
    return [
        [answer_form(task, str(turn["text"]), question) for turn in row] for row in record.get("turns") or []
    ]


def debate_question(debate: Debate) -> Question:
    """The question a recorded debate answered: its id, text and gold (and its options, for a record that
    kept them in ``meta["options"]``), what a task reads the debate's turns against."""
    if isinstance(debate, Trajectory):
        qid, text, gold, meta = debate.question_id, debate.question, debate.gold, debate.meta
    else:
        qid, text, gold = debate["question_id"], debate.get("question", ""), debate.get("gold")
        meta = debate.get("meta") or {}
    options = meta.get("options")
    return Question(
        id=str(qid), text=str(text), gold=gold, options=tuple(options) if isinstance(options, list) else None
    )


def _form_of(turn: Turn | Mapping[str, Any]) -> str:
    form = turn.form if isinstance(turn, Turn) else turn.get("form", FORM_UNKNOWN)
    return form if form in FORMS else FORM_UNKNOWN


def form_shares(forms: Iterable[str]) -> dict[str, Any]:
    """``turns`` (how many), ``echo_rate`` (refused forms over the turns whose form is known; None when
    none is) and the share of each form of ``FORMS`` (over all turns; None without turns)."""
    counts = Counter(forms)
    turns = sum(counts.values())
    known = turns - counts[FORM_UNKNOWN]
    refused = sum(counts[f] for f in REFUSED_FORMS)
    return {
        "turns": turns,
        "echo_rate": refused / known if known else None,
        **{form: counts[form] / turns if turns else None for form in FORMS},
    }


def forms_by_agent(per_debate: Sequence[Sequence[Sequence[str]]]) -> dict[str, dict[str, Any]]:
    """``{"agent_<i>": form_shares(...)}`` over every debate's ``forms[i][t]`` (from
    :func:`recorded_forms` or :func:`regraded_forms`); agents are numbered as in the debates."""
    pooled: dict[int, list[str]] = {}
    for forms in per_debate:
        for i, row in enumerate(forms):
            pooled.setdefault(i, []).extend(row)
    return {f"agent_{i}": form_shares(pooled[i]) for i in sorted(pooled)}


def agent_form_shares(debates: Iterable[Debate]) -> dict[str, dict[str, Any]]:
    """:func:`forms_by_agent` of the forms recorded in ``debates``."""
    return forms_by_agent([recorded_forms(d) for d in debates])


def format_forms(by_agent: Mapping[str, Mapping[str, Any]]) -> str:
    """One line per agent of :func:`forms_by_agent`: its turns, its echo rate and the forms it used, in %
    ("agent_0  80 turns  echo 98.8%  restatement 98.8% stated 1.2%")."""
    lines = []
    for agent, shares in by_agent.items():
        echo = shares["echo_rate"]
        lines.append(
            f"{agent:<9} {shares['turns']:>6} turns  echo {'-' if echo is None else f'{100 * echo:.1f}%':>6}  "
            + forms_used(shares)
        )
    return "\n".join(lines)


def forms_used(shares: Mapping[str, Any]) -> str:
    """The forms of :func:`form_shares` that occur, most used first, in % ("restatement 98.8% stated 1.2%")."""
    used = sorted(((shares[f], f) for f in FORMS if shares.get(f)), key=lambda x: -x[0])
    return " ".join(f"{form} {100 * share:.1f}%" for share, form in used)
