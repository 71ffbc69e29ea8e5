"""udpo.rewards: uncertainty metrics, rewards and calibration as pure functions of answer matrices.

An answer matrix is N per-agent sequences of T+1 hashable answers (``None`` = unparsed). One debate:
:func:`uncertainty`, :func:`agent_uncertainty`, :func:`rewards`, the consensus-on-wrong guard
:func:`wrong_consensus`. Many debates at once (vectorized):
:func:`debate_metrics` on answer matrices, :func:`batch_uncertainty` on integer codes from
:func:`encode_answers`, and :func:`agent_rewards` for each agent's UDPO reward. Warm-up calibration of
per-agent coefficients: :func:`calibrate`; what coefficients pay for reference debates (unanimous wrong,
correct split, all silent): :func:`reward_ordering`; the task weight at which the correct split wins, and
the floor that raises ``lambda_i`` above it: :func:`correctness_threshold`, :func:`correctness_floor`. Agents that stop answering: :func:`collapse_rate`. A
reward that ignores the answer (a learning check's negative control): :func:`coin_rewards`. Hallucination propagation (the DIGRA paper's woozle metrics
MA, MR, IMR, CR per round): :func:`woozle_metrics`. Statistics for diagnostics live in
:mod:`udpo.rewards.statistics` (with AUROC and abstention scores). DiverseAgentEntropy (weighted answer
entropy, abstention thresholds, self-consistency baselines, reward hooks):
:mod:`udpo.rewards.diverse_agent_entropy`. Error detection scores (precision, recall, F1, F2):
:mod:`udpo.rewards.detection`. This package imports nothing else from the project.
"""

from .batch import DebateMetrics, agent_rewards, batch_uncertainty, debate_metrics
from .calibration import BaseWeights, Calibration, calibrate, calibration_from_dict
from .coding import NONE_CODE, AnswerCoder, check_answers, encode_answers
from .coin import coin, coin_rewards
from .collapse import COLLAPSE_THRESHOLD, agent_unparsed_rates, collapse_rate
from .detection import DetectionScores, detection_scores
from .diverse_agent_entropy import (
    LOOSE_THRESHOLD,
    STRICT_THRESHOLD,
    DAEScore,
    dae_calibration_reward,
    dae_certainty_reward,
    diverse_agent_entropy,
    make_dae_reward,
    self_consistency,
)
from .metrics import (
    AgentUncertainty,
    Uncertainty,
    WrongConsensus,
    agent_uncertainty,
    uncertainty,
    wrong_consensus,
)
from .ordering import (
    REFERENCE_DEBATES,
    RewardOrdering,
    correctness_floor,
    correctness_threshold,
    ordering_from_dict,
    reference_debates,
    reward_ordering,
)
from .reward import Rewards, composite_uncertainty, is_correct, rewards
from .vote import majority_vote
from .woozle import WoozleMetrics, correctness, read_flow, woozle_metrics

__all__ = [
    "COLLAPSE_THRESHOLD",
    "LOOSE_THRESHOLD",
    "NONE_CODE",
    "REFERENCE_DEBATES",
    "STRICT_THRESHOLD",
    "AgentUncertainty",
    "AnswerCoder",
    "BaseWeights",
    "Calibration",
    "DAEScore",
    "DebateMetrics",
    "DetectionScores",
    "RewardOrdering",
    "Rewards",
    "Uncertainty",
    "WoozleMetrics",
    "WrongConsensus",
    "agent_rewards",
    "agent_unparsed_rates",
    "agent_uncertainty",
    "batch_uncertainty",
    "calibrate",
    "calibration_from_dict",
    "check_answers",
    "coin",
    "coin_rewards",
    "collapse_rate",
    "composite_uncertainty",
    "correctness",
    "correctness_floor",
    "correctness_threshold",
    "dae_calibration_reward",
    "dae_certainty_reward",
    "debate_metrics",
    "detection_scores",
    "diverse_agent_entropy",
    "encode_answers",
    "is_correct",
    "majority_vote",
    "ordering_from_dict",
    "read_flow",
    "make_dae_reward",
    "reference_debates",
    "reward_ordering",
    "rewards",
    "self_consistency",
    "uncertainty",
    "woozle_metrics",
    "wrong_consensus",
]
