"""udpo.rewards: uncertainty metrics, rewards and calibration as pure functions of answer matrices."""

from .vote import majority_vote

__all__ = ["majority_vote"]
