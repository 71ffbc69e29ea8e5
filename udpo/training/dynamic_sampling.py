"""Informative batches: which questions of an iteration carry a within-question signal, dynamic sampling
(DAPO, Yu et al. 2025) that debates further questions until the update holds its planned number of them,
and the statistics logged about it (docs/training.md, "Informative batches").

A question's debates (its group: ``debates_per_question`` debates, the same question id) are
**uninformative** when every agent earned the same reward in each of them: the group's rewards say nothing
about which of the agents' answers was better (under ``baseline: group`` every advantage of the group is 0).
Dynamic sampling drops such a group from the update and draws the next questions of the run's question
stream (:meth:`udpo.training.data.QuestionSchedule.take`) until ``questions_per_iteration`` informative
groups are in hand or the cap on extra questions is reached; every draw is debated and written, and what
was dropped is counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from udpo.env.tasks.base import Question
from udpo.env.trajectory import Trajectory

#: two rewards closer than this are the same reward (they are sums of the same float terms)
TOLERANCE = 1e-6


def agents_without_signal(rewards: Tensor, group_ids: Sequence[str]) -> dict[str, Tensor]:
    """Per group (question id, in order of first appearance): a bool per agent [N], True where that agent's
    reward is the same in every debate of the group (its within-question difference is 0). ``rewards``:
    [M, N], one row per debate."""
    rows: dict[str, list[int]] = {}
    for m, g in enumerate(group_ids):
        rows.setdefault(g, []).append(m)
    out = {}
    for g, idx in rows.items():
        r = rewards[idx]
        out[g] = (r - r[0]).abs().amax(0) <= TOLERANCE
    return out


def informative_groups(rewards: Tensor, group_ids: Sequence[str]) -> list[str]:
    """The groups (question ids, in order) where some agent's reward differs between the group's debates."""
    return [g for g, flat in agents_without_signal(rewards, group_ids).items() if not bool(flat.all())]


def reward_shares(parts: dict[str, Tensor], group_ids: Sequence[str]) -> dict[str, float]:
    """Each reward term's share of the within-question reward differences: with ``parts`` the terms'
    contributions to every agent's reward ([M, N] each, summing to the rewards: the coefficient times the
    term), term j's share is ``sum |c_j(m, i) - mean_g c_j(., i)|`` over debates m and agents i (the mean over
    m's group g) divided by the same sum over every term. Empty when no group has a difference (no
    groups of two or more debates, or every term constant within its group)."""
    if not parts:
        return {}
    keys = {g: k for k, g in enumerate(dict.fromkeys(group_ids))}
    idx = torch.tensor([keys[g] for g in group_ids])
    counts = torch.bincount(idx, minlength=len(keys)).to(torch.float64)[:, None]
    spread = {}
    for name, c in parts.items():
        c = c.to(torch.float64)
        means = torch.zeros(len(keys), c.shape[1], dtype=torch.float64).index_add_(0, idx, c) / counts
        spread[name] = float((c - means[idx]).abs().sum())
    total = sum(spread.values())
    if total <= TOLERANCE:
        return {}
    return {name: value / total for name, value in spread.items()}


@dataclass
class Draw:
    """What an iteration debated and what its update keeps. debated: every fresh debate, in draw order
    (the dropped ones too: they are written to the run's trajectories). kept: the debates of the
    informative groups (all of them without dynamic sampling), in the same order. questions: how many
    questions were drawn from the stream (planned + extra). planned: questions_per_iteration. groups: the
    distinct questions debated; informative: those with a within-question signal; dropped: the
    uninformative ones left out of the update; cap_hit: the cap on extra questions ended the draws short
    of the planned informative questions."""

    debated: list[Trajectory] = field(default_factory=list)
    kept: list[Trajectory] = field(default_factory=list)
    questions: int = 0
    planned: int = 0
    groups: int = 0
    informative: int = 0
    dropped: int = 0
    cap_hit: bool = False

    def metrics(self) -> dict[str, float]:
        """The ``groups/*`` metrics of the iteration (docs/training.md, "Informative batches")."""
        return {
            "groups/planned": self.planned,
            "groups/debated": self.groups,
            "groups/informative": self.informative,
            "groups/uninformative": self.groups - self.informative,
            "groups/dropped": self.dropped,
            "groups/extra_draws": self.questions - self.planned,
            "groups/cap_hit": int(self.cap_hit),
        }


def extra_cap(planned: int, max_extra: float) -> int:
    """The most extra questions an iteration of ``planned`` questions may draw: floor(max_extra x planned)."""
    return math.floor(max_extra * planned + 1e-9)


def draw_informative(
    planned: int,
    per_question: int,
    take: Callable[[int, int], list[Question]],
    debate: Callable[[list[Question]], list[Trajectory]],
    rewards: Callable[[list[Trajectory]], Tensor],
    *,
    dynamic: bool,
    max_extra: int,
) -> Draw:
    """Debate ``planned`` questions ``per_question`` times each and, with ``dynamic`` (and groups of two or
    more debates), keep only the informative groups, drawing the next questions until ``planned`` of them
    are informative or ``max_extra`` extra questions have been drawn.

    ``take(offset, n)``: n questions of the run's stream from ``offset`` positions past the iteration's start.
    ``debate(questions)``: their debates, in order. ``rewards(debates)``: every agent's reward [M, N], of all
    the iteration's fresh debates together (a reward may depend on a debate's place among the question's
    draws, as the coin control's does). A question the stream gives twice in one iteration is one group."""
    dynamic = dynamic and per_question >= 2
    debated: list[Trajectory] = []
    drawn, wanted = 0, planned
    while True:
        questions = take(drawn, wanted)
        drawn += len(questions)
        debated += debate([q for q in questions for _ in range(per_question)])
        ids = [t.question_id for t in debated]
        groups = len(dict.fromkeys(ids))
        informative = informative_groups(rewards(debated), ids) if per_question >= 2 else []
        if not dynamic:
            kept = debated
            break
        wanted = min(planned - len(informative), planned + max_extra - drawn)
        if wanted <= 0:
            keep = set(informative)
            kept = [t for t in debated if t.question_id in keep]
            break
    dropped = 0 if not dynamic else groups - len(informative)
    return Draw(
        debated=debated,
        kept=kept,
        questions=drawn,
        planned=planned,
        groups=groups,
        informative=len(informative),
        dropped=dropped,
        cap_hit=dynamic and len(informative) < planned,
    )


def zero_advantage_agents(rewards: Tensor, group_ids: Sequence[str]) -> int:
    """(question, agent) pairs of a batch whose reward is the same in every debate of the question: their
    within-question difference, and their advantage under ``baseline: group``, is 0."""
    return sum(int(flat.sum()) for flat in agents_without_signal(rewards, group_ids).values())
