"""Grouping answers that mean the same thing (DiverseAgentEntropy and self-consistency baselines).

Two answers are in one cluster when their normalized forms match (:func:`normalize_answer`: case
folded, spaces collapsed, surrounding punctuation and a leading article dropped). Our tasks' parsers
already return normalized answers (option letters, canonical numbers, verdict labels), so for them
this is equality; free-form answers need the normalization. Optionally an LLM judge then merges
clusters whose representatives it judges equivalent (:class:`AnswerJudge`, one backend call for all
pairs of a batch; the paper clusters with an LLM, checked by hand at 98% accuracy). ``None`` (no
answer) is its own cluster and never merged.

Each answer is replaced by its cluster's representative: the member that sorts first as text
(:func:`text_order`), one of the answers given, so clustering never invents an answer the task cannot
grade, and whichever agent gave which answer, the same (the vote's tie-break reads the representative).
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from ..backends.base import Backend, SamplingParams
from ..debate import AgentSpec
from .procedures import chat, generate, request

_EDGE_PUNCT = "\"'`.,;:!?()[]{} \t\n"


def normalize_answer(answer: Hashable | None) -> Hashable | None:
    """The form answers are matched on: strings case-folded, spaces collapsed, surrounding punctuation and
    a leading "a", "an" or "the" removed; other values (and None) unchanged."""
    if not isinstance(answer, str):
        return answer
    text = " ".join(answer.casefold().split()).strip(_EDGE_PUNCT)
    return re.sub(r"^(?:a|an|the)\s+", "", text)


def text_order(answer: Hashable | None) -> tuple[str, str]:
    """The order representatives are chosen in: ``str``, then ``repr`` (never the order answers came in)."""
    return str(answer), repr(answer)


def cluster_by_match(answers: Sequence[Hashable | None]) -> list[Hashable | None]:
    """Each answer replaced by the answer of the same normalized form that sorts first (:func:`text_order`)."""
    groups: dict[Hashable | None, list[Hashable | None]] = {}
    for a in answers:
        groups.setdefault(normalize_answer(a), []).append(a)
    first = {form: min(members, key=text_order) for form, members in groups.items()}
    return [first[normalize_answer(a)] for a in answers]


@dataclass
class AnswerJudge:
    """An LLM that says whether two answers to a question mean the same (the optional clustering judge).

    agent: its spec. sampling: its sampling (default greedy, 16 tokens: a yes or a no is enough).
    """

    backend: Backend
    agent: AgentSpec = field(default_factory=AgentSpec)
    sampling: SamplingParams = field(default_factory=lambda: SamplingParams(temperature=0.0, max_tokens=16))

    def same(self, pairs: Sequence[tuple[str, str, str]]) -> list[bool]:
        """For each ``(question, answer a, answer b)``: whether they are judged equivalent (one call)."""
        reqs = [request(self.agent, chat(JUDGE_PROMPT, _pair_text(*p)), self.sampling) for p in pairs]
        return [_says_yes(c.text) for c in generate(self.backend, reqs)]

    def merge(
        self, items: Sequence[tuple[str, Sequence[Hashable | None]]]
    ) -> list[dict[Hashable | None, Hashable | None]]:
        """For each ``(question, distinct answers)``: a map answer -> representative, after asking the
        judge about every pair of distinct non-None answers of every item (one backend call)."""
        asked = [
            (k, a, b) for k, (_, ans) in enumerate(items) for n, a in enumerate(ans) for b in ans[n + 1 :]
        ]
        asked = [(k, a, b) for k, a, b in asked if a is not None and b is not None]
        verdicts = self.same([(items[k][0], str(a), str(b)) for k, a, b in asked])
        maps = [{a: a for a in ans} for _, ans in items]
        for (k, a, b), same in zip(asked, verdicts, strict=True):
            if same:
                _union(maps[k], a, b)
        return [{a: _root(m, a) for a in m} for m in maps]


def _root(parent: dict, a):
    while parent[a] != a:
        a = parent[a]
    return a


def _union(parent: dict, a, b) -> None:
    """Join the clusters of a and b under the representative that sorts first (:func:`text_order`)."""
    ra, rb = _root(parent, a), _root(parent, b)
    if ra != rb:
        keep, drop = sorted((ra, rb), key=text_order)
        parent[drop] = keep


def _pair_text(question: str, a: str, b: str) -> str:
    return f"Question: {question}\nAnswer 1: {a}\nAnswer 2: {b}\nDo the two answers say the same thing?"


def _says_yes(text: str) -> bool:
    words = re.findall(r"[a-z]+", text.lower())
    return bool(words) and words[0] == "yes"


JUDGE_PROMPT = (
    "You compare two answers to the same question. Reply 'yes' if they give the same answer (the same "
    "entity, value or choice, however worded) and 'no' otherwise. Reply with one word."
)
