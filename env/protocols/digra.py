"""DIGRA: a dynamic communication topology driven by the information-gain ratio (the woozle paper, sec. 4.1).

Before round t, for each agent i that still speaks and each non-empty subset J of its peers:

- ``Hbar(R)``: mean token entropy of a response R, the full-vocabulary entropy of the next-token
  distribution averaged over R's tokens (Fomicheva et al.), by forced decoding: R is read token by
  token after a prompt and never sampled. ``Hbar(R_j)`` is read after the question alone, under agent
  j's model and profile (its own uncertainty; the paper's hallucination level).
- ``IG(J) = Hbar(R_i) - Hbar(R_i | f(q, R_J))``: how much the peers' responses lower the entropy of
  agent i's own latest response R_i; ``f(q, R_J)`` is the question followed by the peers' responses,
  listed in descending order of their entropy, with the round's request (the debate's own peer
  message), read under agent i's model and profile.
- ``IGR(J) = (alpha + IG(J)) / mean_{j in J} Hbar(R_j)``, alpha = 0.2.

Agent i then reads ``J* = argmax IGR`` (variant DIG: ``argmax IG``), peers in descending entropy.
Ties go to the first subset enumerated (smaller subsets first, then by agent index). A mean peer
entropy of exactly 0 gives ``IGR = +inf`` (``-inf`` when the numerator is negative).

Entropies are in nats, from the model's logits at temperature 1; each response ends with the
end-of-turn token, as a generated turn does. Scoring uses the team's backend with each agent's
adapter (it needs logits: the ``hf`` backend), or, with ``entropy_model``, one separate hf model for
text produced by any backend (the paper's appendix B.6: the estimator can be another model).
Each round costs two batched ``token_entropies`` calls: one for the responses not yet scored (an
agent that stopped keeps its response and its entropy), one for every (speaker, subset) pair:
``N (2^(N-1) - 1)`` forced-decoding passes per debate when all N agents speak.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..backends.base import Backend, ScoreRequest
from ..tasks.base import Task
from .base import DebateState, Stage, peer_message

ALPHA = 0.2
VARIANTS = ("digra", "dig")


def peer_subsets(peers: Sequence[int]) -> list[tuple[int, ...]]:
    """Every non-empty subset of ``peers``: by size, then in index order (``2^k - 1`` of them)."""
    ordered = sorted(peers)
    return [c for size in range(1, len(ordered) + 1) for c in itertools.combinations(ordered, size)]


def mean_token_entropy(entropies: Sequence[float]) -> float:
    """``Hbar``: the mean of per-token entropies (0 for a response without tokens)."""
    return math.fsum(entropies) / len(entropies) if entropies else 0.0


def information_gain_ratio(ig: float, peer_entropies: Sequence[float], alpha: float = ALPHA) -> float:
    """``(alpha + IG) / mean(Hbar(R_j))`` over the peers of the subset."""
    numerator = alpha + ig
    denominator = math.fsum(peer_entropies) / len(peer_entropies)
    if denominator == 0:
        return math.copysign(math.inf, numerator)
    return numerator / denominator


def by_descending_entropy(peers: Sequence[int], entropy: Mapping[int, float]) -> list[int]:
    """Peers in descending order of their entropy (ties by agent index)."""
    return sorted(peers, key=lambda j: (-entropy[j], j))


def choose_peers(
    own_entropy: float,
    conditional: Mapping[tuple[int, ...], float],
    peer_entropy: Mapping[int, float],
    alpha: float = ALPHA,
    variant: str = "digra",
) -> tuple[tuple[int, ...], dict[tuple[int, ...], float]]:
    """The subset maximizing IGR (variant "dig": IG) and every subset's score.

    own_entropy: ``Hbar(R_i)``. conditional[J]: ``Hbar(R_i | f(q, R_J))`` for each subset J (in
    enumeration order). peer_entropy[j]: ``Hbar(R_j)``.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown DIGRA variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    scores = {}
    for subset, h in conditional.items():
        ig = own_entropy - h
        scores[subset] = (
            ig if variant == "dig" else information_gain_ratio(ig, [peer_entropy[j] for j in subset], alpha)
        )
    best = max(scores, key=lambda s: scores[s])  # max keeps the first of equal scores
    return best, scores


class DIGRATopology(Stage):
    """The DIGRA (or DIG) topology stage.

    scorer: the backend that scores by forced decoding. use_adapters: score each agent's text under its
    own adapter and base model (True with the team's backend; False for a separate ``entropy_model``).
    owns_scorer: close the scorer with the stage. Counters for benchmarks: ``passes`` (forced-decoding
    requests), ``calls`` (batched ``token_entropies`` calls), ``seconds`` (time spent in them).
    """

    selects = True

    def __init__(
        self,
        task: Task,
        scorer: Backend,
        alpha: float = ALPHA,
        variant: str = "digra",
        use_adapters: bool = True,
        owns_scorer: bool = False,
        entropy_model: str | None = None,
    ):
        if variant not in VARIANTS:
            raise ValueError(f"unknown DIGRA variant {variant!r}; choose one of {', '.join(VARIANTS)}")
        self.task, self.scorer, self.alpha, self.variant = task, scorer, alpha, variant
        self.name = variant
        self.use_adapters, self.owns_scorer, self.entropy_model = use_adapters, owns_scorer, entropy_model
        self.passes = self.calls = 0
        self.seconds = 0.0

    def select(self, states: Sequence[DebateState], rnd: int) -> None:
        entropies = self._response_entropies(states)
        jobs: list[tuple[int, int, tuple[int, ...]]] = []  # (debate, speaker, subset)
        requests: list[ScoreRequest] = []
        for k, s in enumerate(states):
            peer = entropies[k][0]
            for i in s.speakers():
                for subset in peer_subsets([j for j in range(s.n_agents) if j != i]):
                    reads = [s.latest(j) for j in by_descending_entropy(subset, peer)]
                    prompt = f"{s.question.text}\n\n{peer_message(self.task, s.question, reads, rnd)}"
                    jobs.append((k, i, subset))
                    requests.append(self._request(s, i, prompt, s.own_text(i)))
        conditional: dict[tuple[int, int], dict[tuple[int, ...], float]] = {}
        for (k, i, subset), value in zip(jobs, self._score(requests), strict=True):
            conditional.setdefault((k, i), {})[subset] = value
        for (k, i), found in conditional.items():
            s, (peer, own) = states[k], entropies[k]
            best, scores = choose_peers(own[i], found, peer, self.alpha, self.variant)
            s.reads[i] = [s.latest(j) for j in by_descending_entropy(best, peer)]
            s.details[i][self.name] = {
                "own_entropy": own[i],
                "peer_entropy": {str(j): peer[j] for j in range(s.n_agents) if j != i},
                "conditional_entropy": {_key(subset): v for subset, v in found.items()},
                "ig" if self.variant == "dig" else "igr": {_key(subset): v for subset, v in scores.items()},
                "selected": list(best),
            }

    def _response_entropies(
        self, states: Sequence[DebateState]
    ) -> list[tuple[dict[int, float], dict[int, float]]]:
        """Per debate, (peer, own): ``peer[j]`` = Hbar of agent j's latest response as peers read it,
        ``own[j]`` = as j wrote it (the same text unless an attack rewrote it). Only texts not scored
        before are scored (one batched call); the rest come from the debate's cache."""
        todo: dict[tuple[int, int, int, str], ScoreRequest] = {}
        for k, s in enumerate(states):
            cache = s.memory.setdefault(self.name, {})
            for j in range(s.n_agents):
                rnd = s.latest(j).round
                for text in (s.latest(j).text, s.own_text(j)):
                    if (j, rnd, text) not in cache and (k, j, rnd, text) not in todo:
                        todo[(k, j, rnd, text)] = self._request(s, j, self.task.prompt(s.question), text)
        for (k, j, rnd, text), value in zip(todo, self._score(list(todo.values())), strict=True):
            states[k].memory[self.name][(j, rnd, text)] = value
        out = []
        for s in states:
            cache = s.memory[self.name]
            latest = [s.latest(j) for j in range(s.n_agents)]
            out.append(
                (
                    {m.agent: cache[(m.agent, m.round, m.text)] for m in latest},
                    {m.agent: cache[(m.agent, m.round, s.own_text(m.agent))] for m in latest},
                )
            )
        return out

    def _request(self, state: DebateState, agent: int, prompt: str, response: str) -> ScoreRequest:
        spec = state.agents[agent]
        profile = spec.profile if spec.profile is not None else self.task.default_profile
        messages = ([{"role": "system", "content": profile}] if profile else []) + [
            {"role": "user", "content": prompt}
        ]
        if not self.use_adapters:
            return ScoreRequest(messages, response)
        return ScoreRequest(messages, response, adapter=spec.adapter, model=spec.model)

    def _score(self, requests: list[ScoreRequest]) -> list[float]:
        if not requests:
            return []
        start = time.perf_counter()
        entropies = self.scorer.token_entropies(requests)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        self.passes += len(requests)
        return [mean_token_entropy(e) for e in entropies]

    def stats(self) -> dict[str, float]:
        return {"passes": self.passes, "calls": self.calls, "seconds": self.seconds}

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.variant == "digra":
            out["alpha"] = self.alpha
        if self.entropy_model:
            out["entropy_model"] = self.entropy_model
        return out

    def close(self) -> None:
        if self.owns_scorer:
            self.scorer.close()


def _key(subset: tuple[int, ...]) -> str:
    return ",".join(map(str, subset))


__all__ = [
    "ALPHA",
    "DIGRATopology",
    "by_descending_entropy",
    "choose_peers",
    "information_gain_ratio",
    "mean_token_entropy",
    "peer_subsets",
]
