"""DiverseAgentEntropy (docs/uncertainty.md): weighted answer entropy after 1-1 agent interaction, abstention.

n agents each answer the query (each through its own varied question), then interact for R rounds;
``r_j`` is the number of rounds in which agent j changed its answer. With the answer matrix
``a[j][t]`` (t = 0 the answer before any interaction, t = 1..R after each round):

- weights ``w_j = (R - r_j + 1) / sum_k (R - r_k + 1)`` (Laplace-smoothed: a stable agent counts more,
  none counts 0; with R = 0 every weight is 1/n);
- ``p(y) = sum_j w_j [a[j][R] = y]`` over the distinct final answers y. By the silence rule of every
  uncertainty metric (docs/metrics.md, "The answer matrix") ``None``, "no answer", differs from every
  answer, another ``None`` included: each ``None`` is a class of its own in p, and ``None`` in two rounds
  counts in ``r_j`` as a change;
- DiverseAgentEntropy ``H = -sum_y p(y) ln p(y)`` in nats; ``normalized`` divides by ln n (0 when n = 1)
  so it lies in [0, 1] beside U_intra, U_inter and U_sys.
- Prediction: the non-``None`` answer of highest p; ties go to the tied answer the vote's tie-break
  prefers (:func:`~udpo.rewards.majority_vote` with the question id as key: the smallest
  ``sha256(f"{key}\n{answer}")``, never the earlier agent); ``None`` if every final answer is ``None``.
- Abstention: abstain when H exceeds a threshold: :data:`STRICT_THRESHOLD` = H(0.6, 0.4) (a 3/2 split of
  five equal agents is still answered, anything less decided is not) or :data:`LOOSE_THRESHOLD` =
  H(0.6, 0.2, 0.2); a ``None`` prediction always abstains. "Exceeds" allows :data:`ABSTAIN_TOLERANCE` for
  rounding, so a split that equals the threshold in exact arithmetic is answered.

Probabilities are computed from the integer numerators ``R - r_j + 1`` (one division per answer), so
p = 3/5 is the same float as 0.6, and entropies sum the sorted probabilities, so equal distributions
give bit-identical entropies whatever the agents' order.

Baselines on plain samples of the original query (all weights equal, R = 0): self-consistency entropy
(:func:`self_consistency`) and SC(3/5): answer the majority answer if at least 3 of the 5 samples give
it, else abstain.

Training hooks: :func:`dae_certainty_reward` and :func:`dae_calibration_reward` take ``(trajectory,
agent)`` and return a float, for a recipe's extra reward terms; :func:`make_dae_reward` builds them. They
read ``answers`` (the N x (T+1) matrix), ``correct`` and ``meta["rounds_run"]`` (the rounds a debate
actually ran, when it stopped early) from a trajectory object or its JSON dict; this module imports
nothing else from the project.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from .batch import one_debate
from .coding import AnswerMatrix, answer_classes, check_answers
from .vote import majority_vote

Answer = Hashable | None

#: an entropy must exceed a threshold by more than this to abstain (rounding, not information)
ABSTAIN_TOLERANCE = 1e-12
#: SC(k/n): the majority answer must appear at least this often among the samples
SC_MIN_VOTES = 3


def entropy(probabilities: Sequence[float]) -> float:
    """``-sum p ln p`` in nats over a probability vector (zeros contribute 0); summed in descending
    order of p so the result does not depend on the order given."""
    p = [float(x) for x in probabilities]
    if not p:
        raise ValueError("entropy of an empty distribution")
    if any(not math.isfinite(x) or x < 0 for x in p):
        raise ValueError(f"probabilities must be finite and >= 0, got {p}")
    if abs(sum(p) - 1.0) > 1e-9:
        raise ValueError(f"probabilities must sum to 1, got {sum(p)}")
    return max(0.0, -sum(x * math.log(x) for x in sorted(p, reverse=True) if x > 0))


#: abstention threshold of the strict variant: H(0.6, 0.4) in nats (about 0.673)
STRICT_THRESHOLD = entropy([0.6, 0.4])
#: abstention threshold of the loose variant: H(0.6, 0.2, 0.2) in nats (about 0.950)
LOOSE_THRESHOLD = entropy([0.6, 0.2, 0.2])
THRESHOLDS = {"strict": STRICT_THRESHOLD, "loose": LOOSE_THRESHOLD}


def answer_changes(answers: AnswerMatrix) -> tuple[int, ...]:
    """``r_j``: per agent, the rounds t = 1..T in which its answer differs from round t - 1 (a ``None``
    always does): the flips of :mod:`udpo.rewards.batch`."""
    return tuple(int(r) for r in one_debate(answers).agent_flips[0])


def weight_numerators(changes: Sequence[int], rounds: int) -> tuple[int, ...]:
    """``R - r_j + 1`` per agent (checked: 0 <= r_j <= R)."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"rounds R must be an integer >= 0, got {rounds!r}")
    if not changes:
        raise ValueError("no agents")
    for j, r in enumerate(changes):
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r <= rounds:
            raise ValueError(f"agent {j} changed its answer {r!r} times, which must lie in [0, R = {rounds}]")
    return tuple(rounds - r + 1 for r in changes)


def agent_weights(changes: Sequence[int], rounds: int) -> tuple[float, ...]:
    """``w_j = (R - r_j + 1) / sum_k (R - r_k + 1)``."""
    num = weight_numerators(changes, rounds)
    total = sum(num)
    return tuple(x / total for x in num)


def answer_distribution(
    final: Sequence[Answer], changes: Sequence[int] | None = None, rounds: int = 0
) -> tuple[tuple[Answer, float], ...]:
    """``(y, p(y))`` per distinct final answer in order of first appearance (each ``None`` an entry of its
    own), p weighted by :func:`agent_weights` (equal weights when ``changes`` is None)."""
    final = list(final)
    num = weight_numerators([0] * len(final) if changes is None else list(changes), rounds)
    if len(num) != len(final):
        raise ValueError(f"{len(final)} final answers but {len(num)} change counts")
    mass: dict[int, tuple[Answer, int]] = {}
    for c, y, w in zip(answer_classes(final), final, num, strict=True):
        mass[c] = (y, mass.get(c, (y, 0))[1] + w)
    total = sum(num)
    return tuple((y, m / total) for y, m in mass.values())


def top_answer(distribution: Sequence[tuple[Answer, float]], key: str = "") -> Answer:
    """The non-None answer of highest probability, or None; a tie goes where the vote of question ``key``
    sends it (:func:`~udpo.rewards.majority_vote` of the tied answers, one vote each)."""
    best_p = max((p for y, p in distribution if y is not None), default=None)
    return majority_vote([y for y, p in distribution if y is not None and p == best_p], key)


def abstains(score: float, threshold: float) -> bool:
    """Whether an entropy ``score`` exceeds ``threshold`` (beyond :data:`ABSTAIN_TOLERANCE`)."""
    return score > threshold + ABSTAIN_TOLERANCE


def _normalized(h: float, n: int) -> float:
    return min(1.0, h / math.log(n)) if n > 1 else 0.0


@dataclass(frozen=True)
class DAEScore:
    """DiverseAgentEntropy of one query: ``entropy`` (nats), ``normalized`` (entropy / ln n),
    ``prediction``, the answer ``distribution`` and the agents' ``weights``, ``changes`` r_j and ``rounds`` R."""

    entropy: float
    normalized: float
    prediction: Answer
    distribution: tuple[tuple[Answer, float], ...]
    weights: tuple[float, ...]
    changes: tuple[int, ...]
    rounds: int

    def abstains(self, threshold: float = STRICT_THRESHOLD) -> bool:
        """Abstain when the entropy exceeds ``threshold`` or there is no answer to give."""
        return self.prediction is None or abstains(self.entropy, threshold)


def diverse_agent_entropy(answers: AnswerMatrix, rounds: int | None = None, key: str = "") -> DAEScore:
    """DiverseAgentEntropy of an answer matrix ``a[j][t]`` (n agents x (R+1) rounds); ``key``: the
    question id, the key of the prediction's tie-break.

    ``rounds`` is R, the interaction rounds actually run (default: the matrix's T). A matrix may carry
    answers forward past R (a debate that stopped early); those rounds add no changes.
    """
    a = check_answers(answers)
    changes = answer_changes(a)
    rounds = len(a[0]) - 1 if rounds is None else rounds
    final = [row[-1] for row in a]
    dist = answer_distribution(final, changes, rounds)
    h = entropy([p for _, p in dist])
    return DAEScore(
        entropy=h,
        normalized=_normalized(h, len(a)),
        prediction=top_answer(dist, key),
        distribution=dist,
        weights=agent_weights(changes, rounds),
        changes=changes,
        rounds=rounds,
    )


@dataclass(frozen=True)
class SelfConsistency:
    """Self-consistency of k samples of the original query: ``entropy`` (nats) of their answers,
    ``normalized`` (/ ln k), the majority ``prediction`` (the vote of docs/metrics.md), its ``votes``, and
    whether SC(3/5) abstains (fewer than ``min_votes`` samples give the majority answer)."""

    entropy: float
    normalized: float
    prediction: Answer
    votes: int
    abstain_majority: bool
    distribution: tuple[tuple[Answer, float], ...]

    def abstains(self, threshold: float = STRICT_THRESHOLD) -> bool:
        """Abstain when the samples' entropy exceeds ``threshold`` or there is no answer to give."""
        return self.prediction is None or abstains(self.entropy, threshold)


def self_consistency(
    samples: Sequence[Answer], min_votes: int = SC_MIN_VOTES, key: str = ""
) -> SelfConsistency:
    """Self-consistency entropy and the SC(``min_votes``/len(samples)) abstention of sampled answers;
    ``key``: the question id, the key of the majority vote."""
    samples = list(samples)
    if not samples:
        raise ValueError("self-consistency needs at least one sample")
    dist = answer_distribution(samples)
    h = entropy([p for _, p in dist])
    prediction = majority_vote(samples, key)
    votes = sum(s == prediction for s in samples) if prediction is not None else 0
    return SelfConsistency(
        entropy=h,
        normalized=_normalized(h, len(samples)),
        prediction=prediction,
        votes=votes,
        abstain_majority=prediction is None or votes < min_votes,
        distribution=dist,
    )


# --- training hooks: (trajectory, agent) -> float ------------------------------------------------


def _get(trajectory: Any, name: str, default: Any = None) -> Any:
    if isinstance(trajectory, dict):
        return trajectory.get(name, default)
    return getattr(trajectory, name, default)


def trajectory_dae(trajectory: Any) -> DAEScore:
    """DiverseAgentEntropy of a debate trajectory (object or JSON dict): its answer matrix, with R the
    rounds it actually ran (``meta["rounds_run"]`` when present, else T), keyed by its question id."""
    rounds = (_get(trajectory, "meta") or {}).get("rounds_run")
    return diverse_agent_entropy(
        _get(trajectory, "answers"), rounds=rounds, key=_get(trajectory, "question_id", "")
    )


def make_dae_reward(mode: str = "certainty") -> Callable[[Any, int], float]:
    """A reward term ``(trajectory, agent) -> float`` in [0, 1] from the debate's normalized DAE ``h``.

    mode ``"certainty"``: ``1 - h``, the same for every agent (a team that settles on one answer with
    stable agents scores 1). ``"calibration"``: ``1 - h`` when the debate's prediction is correct, ``h``
    when it is wrong (rewards being certain when right and uncertain when wrong).
    """
    if mode not in ("certainty", "calibration"):
        raise ValueError(f"unknown DAE reward mode {mode!r}; choose certainty or calibration")

    def reward(trajectory: Any, agent: int) -> float:
        h = trajectory_dae(trajectory).normalized
        if mode == "calibration" and not _get(trajectory, "correct", False):
            return h
        return 1.0 - h

    reward.__name__ = f"dae_{mode}_reward"
    reward.__doc__ = f"DiverseAgentEntropy reward term, mode {mode!r} (see make_dae_reward)."
    return reward


#: ``udpo.rewards.diverse_agent_entropy:dae_certainty_reward``: 1 - normalized DAE of the debate
dae_certainty_reward = make_dae_reward("certainty")
#: ``udpo.rewards.diverse_agent_entropy:dae_calibration_reward``: 1 - h if correct, else h
dae_calibration_reward = make_dae_reward("calibration")
