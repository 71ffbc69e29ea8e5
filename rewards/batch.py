"""The one implementation of the uncertainty metrics, reward terms and majority vote: vectorized, for many
debates at once.

:func:`batch_uncertainty` takes integer codes ``M x N x (T+1)`` (see :func:`udpo.rewards.encode_answers`)
and returns every metric of :mod:`udpo.rewards.metrics` (their definitions) and every reward term of
:mod:`udpo.rewards.reward` as arrays. :func:`debate_metrics` does the same for a list of answer matrices
(shapes may differ; debates are grouped by shape), adds predictions and r_task, and is what the trainer
calls every iteration. :func:`one_debate` is a batch of one: ``uncertainty``, ``agent_uncertainty``,
``rewards`` and ``majority_vote`` read their numbers from it. The formulas written out one debate at a
time live in the tests (tests/reference_metrics.py), as the oracle this path is checked against.

Implementation notes: unparsed answers first get codes of their own (the silence rule, applied once by
:func:`~udpo.rewards.coding.unparsed_apart`), so every comparison below follows it. Pairwise disagreement
is counted in N passes over the ``M x N x (T+1)`` codes. For the final round, ``c_i`` (how many agents
share agent i's answer) gives everything else: entropy ``-mean_i ln(c_i / N)``, distinct answers
``K = sum_i 1 / c_i``, unanimity ``max c_i = N``; the vote is an agent with the largest non-None count,
and removing agent k lowers the counts of the agents that share k's answer. Ties follow the rule of
:func:`~udpo.rewards.majority_vote` (docs/metrics.md, "The vote"): the answers in some tie (of the vote or
of a vote without one agent) get the rank of their ``sha256(f"{key}\n{answer}")`` digest, computed once
per distinct (question id, answer) pair of the batch, and the smallest rank among the top agents wins.
That needs each code's answer (``values``) and each debate's question id (``keys``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, fields
from typing import Literal

import numpy as np

from .coding import (
    NONE_CODE,
    AnswerCoder,
    AnswerMatrix,
    check_answer_matrices,
    check_answers,
    check_codes,
    unparsed_apart,
)
from .vote import check_key, tie_bytes, unordered_tie

Scope = Literal["trajectory", "agent"]
#: match(prediction, gold) -> whether a (non-None) prediction is correct; default ``==``
Match = Callable[[Hashable, Hashable], bool]


def is_correct(prediction: Hashable | None, gold: Hashable | None, match: Match | None = None) -> bool:
    """Whether a prediction is right: ``None`` never is; otherwise ``match`` (default ``==``)."""
    if prediction is None:
        return False
    return bool(match(prediction, gold)) if match is not None else bool(prediction == gold)


def _check_lam(lam: float) -> None:
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must lie in [0, 1], got {lam}")


@dataclass
class DebateMetrics:
    """Metrics of M debates. Per-debate fields have shape (M,); ``conflict`` (M, T+1); ``agent_*`` (M, N).

    Field meanings are those of :class:`~udpo.rewards.Uncertainty`, :class:`~udpo.rewards.AgentUncertainty`
    and :class:`~udpo.rewards.Rewards` (``agent_r_*``: scope "agent"). ``vote`` holds the vote's code
    (``NONE_CODE`` for an all-None vote). When :func:`debate_metrics` mixes shapes, shorter rows of
    ``conflict`` and ``agent_*`` are padded with NaN. ``predictions`` and ``r_task`` are filled by
    :func:`debate_metrics` (``r_task`` only when golds are given).
    """

    flip_rate: np.ndarray
    revision_rate: np.ndarray
    u_intra: np.ndarray
    conflict: np.ndarray
    u_inter: np.ndarray
    entropy: np.ndarray
    disagreement: np.ndarray
    loo_instability: np.ndarray
    u_sys: np.ndarray
    r_intra: np.ndarray
    r_inter: np.ndarray
    r_sys: np.ndarray
    vote: np.ndarray
    agent_flips: np.ndarray
    agent_u_intra: np.ndarray
    agent_u_inter: np.ndarray
    agent_loo: np.ndarray
    agent_r_intra: np.ndarray
    agent_r_inter: np.ndarray
    agent_r_sys: np.ndarray
    predictions: list[Hashable | None] | None = None
    r_task: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.u_sys)


_ARRAY_FIELDS = [f.name for f in fields(DebateMetrics) if f.name not in ("predictions", "r_task")]


#: the tie rank of an answer no tie involves (never compared with a different answer)
_UNTIED = -1
#: the rank that keeps an agent out of a vote's choice
_OUT = np.iinfo(np.int64).max


def _tie_ranks(
    final: np.ndarray,
    same: np.ndarray,
    tied: np.ndarray,
    values: Sequence[Hashable],
    keys: Sequence[str],
) -> np.ndarray:
    """(M, N) int64: where agent i's final answer may meet a tie (``tied``: the contenders of
    :func:`_votes`), its place in the order of :func:`~udpo.rewards.vote.tie_digest` (key = the debate's
    key; smaller wins; compared as the raw :func:`~udpo.rewards.vote.tie_bytes`, which sort the same),
    else :data:`_UNTIED`.

    Digests are computed once per distinct (key, answer) pair in a tie; the places are dense ranks over
    all those pairs of the batch (pairs of one debate share its key, so their ranks order their digests).
    """
    rank = np.full(final.shape, _UNTIED, dtype=np.int64)
    where = np.nonzero(tied)
    if not len(where[0]):
        return rank
    debates, at = np.unique(where[0], return_inverse=True)
    key_ids: dict[str, int] = {}
    debate_key = np.array([key_ids.setdefault(keys[m], len(key_ids)) for m in debates.tolist()], np.int64)
    width = len(values)
    unique, inverse = np.unique(debate_key[at] * width + final[where], return_inverse=True)
    names = list(key_ids)
    pairs = zip((unique // width).tolist(), (unique % width).tolist(), strict=True)
    digests = np.array([tie_bytes(names[k], values[v]) for k, v in pairs], dtype="S32")
    distinct, dense = np.unique(digests, return_inverse=True)  # dense[u]: place of pair u's digest
    rank[where] = dense.ravel()[inverse.ravel()]
    if len(distinct) < len(digests):  # two answers read as one string: an error if both tie in one debate
        clash = (rank[:, :, None] == rank[:, None, :]) & (rank[:, :, None] != _UNTIED) & ~same
        if clash.any():
            m, i, j = (int(x) for x in np.argwhere(clash)[0])
            raise unordered_tie(keys[m], [values[int(final[m, i])], values[int(final[m, j])]])
    return rank


def _votes(
    final: np.ndarray, same: np.ndarray, values: Sequence[Hashable], keys: Sequence[str]
) -> tuple[np.ndarray, np.ndarray]:
    """Majority vote of each debate's final round and of the round without each agent k.

    final: codes (M, N), unparsed answers < 0; same[m, i, j] = final[m, i] == final[m, j]; values[code]:
    the answer behind each code >= 0; keys[m]: debate m's key. Returns codes (M,) and (M, N),
    :data:`NONE_CODE` where nobody answered.

    With c the top count of the final round and n its distinct top answers, removing agent k changes
    only the count of k's answer, by one: if k's answer is below the top (or None) the vote stands; if it
    is one of n > 1 top answers, the vote stands unless k gave it, and then goes to the runner-up of the top
    answers; if it is the only top answer, it ties with the answers of count c - 1 (none when c = 1: then
    nobody is left). So the only answers a tie can involve are the top ones and, with one top answer,
    those of count c - 1; only they get tie ranks (:func:`_tie_ranks`), the smallest rank winning.
    """
    rows = np.arange(len(final))
    # count[m, i]: agents sharing agent i's answer, -1 for an abstention (None)
    count = np.where(final >= 0, same.sum(axis=2), -1)
    top = count.max(axis=1)
    at_top = count == top[:, None]
    single = at_top.sum(axis=1) == np.maximum(top, 1)  # one answer at the top
    below = (count == (top - 1)[:, None]) & (count > 0)
    contender = (at_top | (below & single[:, None])) & (count > 0)
    distinct = (contender / np.maximum(count, 1)).sum(axis=1)  # an answer of count c has c agents
    rank = _tie_ranks(final, same, contender & (distinct > 1.5)[:, None], values, keys)

    first = np.where(at_top, rank, _OUT).argmin(axis=1)
    vote = np.where(top > 0, final[rows, first], NONE_CODE)
    # several top answers: without an agent of the vote's answer, the runner-up among them wins
    runner_up = final[rows, np.where(at_top & (final != vote[:, None]), rank, _OUT).argmin(axis=1)]
    # one top answer: without one of its agents it ties with the answers of count c - 1 (if any)
    nearest = np.where(below, rank, _OUT).argmin(axis=1)
    overtaken = below[rows, nearest] & (rank[rows, nearest] < rank[rows, first])
    shrunk = np.where(top > 1, np.where(overtaken, final[rows, nearest], vote), NONE_CODE)
    gave_vote = at_top & (final == vote[:, None])
    vote_k = np.where(gave_vote, np.where(single, shrunk, runner_up)[:, None], vote[:, None])
    return vote, np.where((top > 0)[:, None], vote_k, NONE_CODE)


def batch_uncertainty(
    codes: np.ndarray,
    lam: float = 0.5,
    *,
    values: Sequence[Hashable],
    keys: Sequence[str] | None = None,
) -> DebateMetrics:
    """Uncertainty metrics, reward terms and votes of M integer-coded debates ``M x N x (T+1)``.

    ``values[code]`` is the answer behind each code >= 0 (:func:`~udpo.rewards.encode_answers` with
    ``return_values``), ``keys[m]`` debate m's question id (default ``""`` for every debate): the vote's
    tie-break reads both (:func:`~udpo.rewards.majority_vote`). Unparsed answers (:data:`NONE_CODE`)
    follow the silence rule (:func:`~udpo.rewards.coding.unparsed_apart`).
    """
    _check_lam(lam)
    x = unparsed_apart(check_codes(codes))
    keys = _check_keys(keys, len(x))
    if x.size and x.max() >= len(values):
        raise ValueError(
            f"code {x.max()} has no answer: values holds {len(values)} (codes 0..{len(values) - 1})"
        )
    m, n, t1 = x.shape
    t_max = t1 - 1

    # intra-agent: changes t -> t+1 over all transitions (rewards) and over debate rounds 1..T-1 (F)
    changes = x[:, :, 1:] != x[:, :, :-1]  # (M, N, T)
    agent_flips = changes.sum(axis=2)
    agent_f = changes[:, :, 1:].sum(axis=2) / (t_max - 1) if t_max >= 2 else np.zeros((m, n))
    agent_m = (x[:, :, 0] != x[:, :, t_max]).astype(float)
    agent_u_intra = lam * agent_f + (1 - lam) * agent_m
    flip_rate = agent_f.mean(axis=1)
    revision_rate = agent_m.mean(axis=1)
    agent_r_intra = 1.0 - agent_flips / t_max if t_max > 0 else np.ones((m, n))
    r_intra = agent_r_intra.mean(axis=1)

    # inter-agent: pairwise disagreement per round
    differ = np.zeros(x.shape, dtype=np.int32)  # (M, N, T+1): how many peers agent i disagrees with
    for j in range(n):  # N passes over M x N x (T+1) beat one M x N x N x (T+1) comparison
        differ += x != x[:, j : j + 1, :]
    if n > 1:
        agent_u_inter = (differ / (n - 1)).mean(axis=2)
        conflict = differ.sum(axis=1) / (n * (n - 1))
    else:
        agent_u_inter = np.zeros((m, n))
        conflict = np.zeros((m, t1))
    u_inter = conflict.mean(axis=1)

    # system level: the final round
    final = x[:, :, t_max]
    same = final[:, :, None] == final[:, None, :]
    share = same.sum(axis=2)  # c_i
    distinct = np.rint((1.0 / share).sum(axis=1)).astype(int)
    raw_entropy = -np.log(share / n).mean(axis=1) / np.log(np.maximum(distinct, 2))
    # H: 0 when unanimous, exactly 1 for a uniform split (the sum of logs alone can round to 1 +- 4e-16),
    # else capped at 1 against rounding, so H never leaves [0, 1]
    uniform = share.min(axis=1) == share.max(axis=1)
    entropy = np.select([distinct == 1, uniform], [0.0, 1.0], np.minimum(raw_entropy, 1.0))
    disagreement = (share.max(axis=1) < n).astype(float)
    vote, vote_k = _votes(final, same, values, keys)
    agent_loo = (vote_k != vote[:, None]).astype(float) if n > 1 else np.zeros((m, n))
    loo_instability = agent_loo.mean(axis=1)
    u_sys = (entropy + disagreement + loo_instability) / 3

    return DebateMetrics(
        flip_rate=flip_rate,
        revision_rate=revision_rate,
        u_intra=agent_u_intra.mean(axis=1),
        conflict=conflict,
        u_inter=u_inter,
        entropy=entropy,
        disagreement=disagreement,
        loo_instability=loo_instability,
        u_sys=u_sys,
        r_intra=r_intra,
        r_inter=1.0 - u_inter,
        r_sys=1.0 - u_sys,
        vote=vote,
        agent_flips=agent_flips,
        agent_u_intra=agent_u_intra,
        agent_u_inter=agent_u_inter,
        agent_loo=agent_loo,
        agent_r_intra=agent_r_intra,
        agent_r_inter=1.0 - agent_u_inter,
        agent_r_sys=1.0 - ((entropy + disagreement)[:, None] + agent_loo) / 3,
    )


def _check_keys(keys: Sequence[str] | None, total: int) -> Sequence[str]:
    """One vote key (question id) per debate, ``""`` for each when ``keys`` is None."""
    if keys is None:
        return [""] * total
    if len(keys) != total:
        raise ValueError(f"got {len(keys)} keys (question ids) for {total} debates")
    for m, key in enumerate(keys):
        check_key(key, f"debate {m}")
    return keys


def debate_metrics(
    answer_matrices: Sequence[AnswerMatrix],
    golds: Sequence[Hashable | None] | None = None,
    lam: float = 0.5,
    match: Match | None = None,
    keys: Sequence[str] | None = None,
) -> DebateMetrics:
    """Metrics of a list of debates (answer matrices N x (T+1), shapes may differ), in input order.

    With ``golds`` (one per debate) also ``r_task``; ``match(prediction, gold)`` overrides ``==``.
    ``keys``: each debate's question id, the key of its votes' tie-break (default ``""`` for every debate;
    pass the ids wherever the debates are questions: trajectories' ``question_id``).
    """
    total = len(answer_matrices)
    if total == 0:
        raise ValueError("no debates given")
    if golds is not None and len(golds) != total:
        raise ValueError(f"got {len(golds)} golds for {total} debates")
    keys = _check_keys(keys, total)
    matrices = check_answer_matrices(answer_matrices)
    groups: dict[tuple[int, int], list[int]] = {}
    for idx, a in enumerate(matrices):
        groups.setdefault((len(a), len(a[0])), []).append(idx)
    n_max = max(n for n, _ in groups)
    t1_max = max(t1 for _, t1 in groups)

    coder = AnswerCoder()
    out: dict[str, np.ndarray] = {}
    for members in groups.values():
        codes = coder.encode([matrices[i] for i in members])
        part = batch_uncertainty(codes, lam, values=coder.values(), keys=[keys[i] for i in members])
        for name in _ARRAY_FIELDS:
            value = getattr(part, name)
            if name not in out:
                tail = {"conflict": (t1_max,)}.get(name, (n_max,) if name.startswith("agent_") else ())
                out[name] = np.zeros(total, int) if name == "vote" else np.full((total, *tail), np.nan)
            if value.ndim == 2:
                out[name][members, : value.shape[1]] = value
            else:
                out[name][members] = value
    values = coder.values()
    predictions = [None if code == NONE_CODE else values[code] for code in out["vote"].tolist()]
    metrics = DebateMetrics(**out, predictions=predictions)
    if golds is not None:
        metrics.r_task = np.array(
            [is_correct(p, g, match) for p, g in zip(predictions, golds, strict=True)], float
        )
    return metrics


def one_debate(
    answers: AnswerMatrix,
    gold: Hashable | None = None,
    lam: float = 0.5,
    match: Match | None = None,
    key: str = "",
) -> DebateMetrics:
    """:func:`debate_metrics` of one debate (a batch of one; errors name ``answers``), ``r_task`` against
    ``gold``, ``key`` its question id: where the one-debate functions read their numbers."""
    _check_lam(lam)
    return debate_metrics([check_answers(answers)], [gold], lam=lam, match=match, keys=[check_key(key)])


def agent_rewards(
    metrics: DebateMetrics,
    alpha: float | Sequence[float] | np.ndarray,
    beta: float | Sequence[float] | np.ndarray,
    gamma: float | Sequence[float] | np.ndarray,
    lambda_: float | Sequence[float] | np.ndarray,
    scope: Scope = "trajectory",
) -> np.ndarray:
    """Each agent's UDPO reward ``r_i = alpha_i r_intra + beta_i r_inter + gamma_i r_sys + lambda_i r_task``.

    Coefficients are scalars or one value per agent (e.g. from :func:`~udpo.rewards.calibrate`). Scope
    "trajectory" uses the debate's terms for every agent, "agent" the per-agent terms. Returns (M, N).
    """
    if metrics.r_task is None:
        raise ValueError("metrics have no r_task: pass golds to debate_metrics()")
    if scope == "trajectory":
        terms = [metrics.r_intra[:, None], metrics.r_inter[:, None], metrics.r_sys[:, None]]
    elif scope == "agent":
        terms = [metrics.agent_r_intra, metrics.agent_r_inter, metrics.agent_r_sys]
    else:
        raise ValueError(f"scope must be 'trajectory' or 'agent', got {scope!r}")
    n = metrics.agent_loo.shape[1]
    coefs = []
    for name, c in (("alpha", alpha), ("beta", beta), ("gamma", gamma), ("lambda_", lambda_)):
        c = np.asarray(c, dtype=float)
        if c.ndim > 1 or (c.ndim == 1 and len(c) != n):
            raise ValueError(f"{name} must be a scalar or {n} per-agent values, got shape {c.shape}")
        coefs.append(c)
    r_task = metrics.r_task[:, None]
    return coefs[0] * terms[0] + coefs[1] * terms[1] + coefs[2] * terms[2] + coefs[3] * r_task
