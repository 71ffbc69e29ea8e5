"""Step 1 of DiverseAgentEntropy: the model writes varied questions about a query (paper section 3.4).

For every query of a batch (each step is one backend call for the whole batch):

1. **conceptualize**: rewrite the query with its specific entity replaced by a general category
   ("What is Joe Biden's occupation?" -> "What is a person's occupation?"); a reply whose first line
   is not a question is ignored (the query is used);
2. **aspects**: list up to ``n_aspects`` perspectives on the conceptualized query, one short phrase
   per line (perspectives of the category, so they do not give the answer away);
3. **aspect questions**: for each aspect, ``per_aspect`` questions that build on the query from that
   perspective, keep its wording and do not state its answer;
4. **paraphrases**: ``per_aspect`` questions that ask exactly what the query asks.

Generated questions are filtered (:func:`keeps_query`): a kept aspect question is a question (ends
with ``?``), differs from the query, and repeats at least half of the query's content words (the
paper asks the generator to keep the query's content and filters for it; we check the words). A kept
paraphrase is a question that differs from the query.

:func:`select_questions` then picks the n questions of the n agents: the query itself, one
paraphrase, and n - 2 aspect questions from distinct aspects (drawn at random within each aspect);
when too few aspects have a kept question, further questions of the used aspects, then further
paraphrases, then the query again fill the set.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from ..backends.base import Backend, SamplingParams
from ..debate import AgentSpec
from .procedures import chat, generate, request

#: function words left out of content words (words of fewer than three characters are left out anyway)
_STOPWORDS = frozenset(
    re.findall(
        r"\w+",
        "the and for from with but are was were been being does did what which who whom whose when where why "
        "how this that these those its into than then there their they them his her she you your our not any "
        "all can could would should will shall may might must has have had",
    )
)
_LIST_MARK_RE = re.compile(r"^\s*(?:[-*\u2022]+|\(?\d+[.):]|\(?[a-zA-Z][.)]|Q\d+\s*[:.)-])\s*")


@dataclass
class QuestionSet:
    """The generated material of one query: its concept, aspects, kept questions per aspect, kept
    paraphrases, and the raw generations (for the record)."""

    query: str
    concept: str = ""
    aspects: list[str] = field(default_factory=list)
    aspect_questions: list[list[str]] = field(default_factory=list)
    paraphrases: list[str] = field(default_factory=list)
    raw: dict[str, object] = field(default_factory=dict)


def content_words(text: str) -> set[str]:
    """Lower-case words of three or more letters or digits, without common function words."""
    return {w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) >= 3 and w not in _STOPWORDS}


def _same(a: str, b: str) -> bool:
    return " ".join(a.lower().split()) == " ".join(b.lower().split())


def keeps_query(question: str, query: str, min_overlap: float = 0.5) -> bool:
    """Whether a generated aspect question qualifies: a question, not the query itself, and holding at
    least ``min_overlap`` of the query's content words (any question when the query has none)."""
    if not question.endswith("?") or _same(question, query):
        return False
    words = content_words(query)
    return not words or len(words & content_words(question)) >= min_overlap * len(words)


def list_lines(text: str, limit: int) -> list[str]:
    """Up to ``limit`` distinct non-empty lines of a list reply, bullets and numbering ("1.", "Q2:") removed."""
    out: list[str] = []
    for line in text.splitlines():
        item = _LIST_MARK_RE.sub("", line).strip().strip("*").strip()
        if item and not any(_same(item, x) for x in out):
            out.append(item)
        if len(out) == limit:
            break
    return out


@dataclass
class QuestionGenerator:
    """Runs steps 1-4 for a batch of queries (see the module docstring).

    n_aspects: perspectives asked for (paper: up to 5). per_aspect: m, questions asked per aspect and
    paraphrases asked. agent: the generating model's spec (the model under test). sampling: of every call.
    """

    backend: Backend
    agent: AgentSpec = field(default_factory=AgentSpec)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n_aspects: int = 5
    per_aspect: int = 3

    def __post_init__(self) -> None:
        if self.n_aspects < 0 or self.per_aspect < 1:
            raise ValueError(
                f"n_aspects must be >= 0 and per_aspect >= 1, got {self.n_aspects} and {self.per_aspect}"
            )

    def _ask(self, prompts: Sequence[tuple[str, str]]) -> list[str]:
        reqs = [request(self.agent, chat(system, user), self.sampling) for system, user in prompts]
        return [c.text for c in generate(self.backend, reqs)]

    def generate(self, queries: Sequence[str]) -> list[QuestionSet]:
        """The question sets of ``queries`` in four backend calls (three when ``n_aspects`` is 0)."""
        sets = [QuestionSet(query=q) for q in queries]
        concepts = self._ask([(CONCEPT_PROMPT, q) for q in queries])
        for s, text in zip(sets, concepts, strict=True):
            s.raw["concept"] = text
            first = next(iter(list_lines(text, 1)), "")
            s.concept = (
                first if first.endswith("?") else s.query
            )  # a reply that is no question: keep the query
        if self.n_aspects:
            listed = self._ask([(aspects_prompt(self.n_aspects), s.concept) for s in sets])
            for s, text in zip(sets, listed, strict=True):
                s.raw["aspects"] = text
                s.aspects = list_lines(text, self.n_aspects)
        keys = [(s, a) for s in sets for a in s.aspects]
        written = self._ask(
            [(aspect_questions_prompt(self.per_aspect), f"Question: {s.query}\nAspect: {a}") for s, a in keys]
        )
        for (s, _), text in zip(keys, written, strict=True):
            cast(list, s.raw.setdefault("aspect_questions", [])).append(text)
            kept = [x for x in list_lines(text, self.per_aspect) if keeps_query(x, s.query)]
            s.aspect_questions.append(kept)
        rewritten = self._ask([(paraphrase_prompt(self.per_aspect), s.query) for s in sets])
        for s, text in zip(sets, rewritten, strict=True):
            s.raw["paraphrases"] = text
            s.paraphrases = [
                x for x in list_lines(text, self.per_aspect) if x.endswith("?") and not _same(x, s.query)
            ]
        return sets


def select_questions(qs: QuestionSet, n: int, rng: random.Random) -> list[str]:
    """The n agents' questions: the query, a paraphrase, then aspect questions from distinct aspects,
    filled as the module docstring says."""
    if n < 1:
        raise ValueError(f"need at least one agent, got {n}")
    pools = [
        rng.sample(q, len(q)) for q in qs.aspect_questions if q
    ]  # each aspect's kept questions, shuffled
    paraphrases = rng.sample(qs.paraphrases, len(qs.paraphrases))
    chosen = [qs.query]
    if paraphrases and len(chosen) < n:
        chosen.append(paraphrases.pop(0))
    while len(chosen) < n and any(pools):  # one per aspect per pass: distinct aspects first
        for pool in pools:
            if pool and len(chosen) < n:
                chosen.append(pool.pop(0))
    chosen += paraphrases[: n - len(chosen)]
    return chosen + [qs.query] * (n - len(chosen))


CONCEPT_PROMPT = (
    "Rewrite the user's question so that any specific named entity in it (a person, a place, an "
    "organisation, a work, an object) is replaced by its general category, such as 'a person' or 'a "
    "city'. If it names nothing specific, repeat the question unchanged. Reply with the rewritten "
    "question only."
)


def aspects_prompt(k: int) -> str:
    return (
        f"List up to {k} different perspectives from which one could think about the user's question, "
        "as varied as possible (for example its history, the people involved, its practical use, its "
        "cultural side). Write each perspective as a short phrase on its own line, with no numbering, no "
        "explanation, and nothing that gives away the answer."
    )


def aspect_questions_prompt(m: int) -> str:
    return (
        f"Write {m} new questions that build on the given question from the given aspect. Each new "
        "question must contain the given question's wording, so that answering it requires knowing the "
        "answer to the given question, but it must not state that answer. Keep each question short. "
        "Write one question per line, starting with Q1:, Q2:, and so on, and nothing else."
    )


def paraphrase_prompt(m: int) -> str:
    return (
        f"Write {m} different questions that ask exactly the same thing as the user's question, in other "
        "words. Do not answer it. Write one question per line and nothing else."
    )
