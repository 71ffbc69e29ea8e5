"""A reward that ignores the answer: a fixed coin per (seed, question, draw), the negative control of a
learning check (docs/lab/preregistration_proof.md).

Debate k of a question in a batch (k = 0, 1, ... in batch order: the ``debates_per_question`` draws of
one question) gets ``coin(seed, question_id, k)``, 0 or 1 from a hash. Nothing of the debate but its
question id and position enters, so the reward is independent of every answer; it is the same whenever
the same draw of the same question comes back, on any machine. The draw index matters: with one coin per
question, every debate of a question would share it and a group baseline would cancel it (every
advantage 0, the adapters never moving), a control that cannot fail.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence

import numpy as np


def coin(seed: int, question_id: str, draw: int) -> float:
    """0.0 or 1.0, from the first byte of SHA-256 of ``"seed:question_id:draw"``."""
    digest = hashlib.sha256(f"{seed}:{question_id}:{draw}".encode()).digest()
    return float(digest[0] & 1)


def coin_rewards(question_ids: Sequence[str], seed: int) -> np.ndarray:
    """One coin per debate of a batch, [M]: each debate's draw index is the number of debates of the same
    question before it in ``question_ids``."""
    drawn: Counter[str] = Counter()
    out = np.empty(len(question_ids))
    for m, question_id in enumerate(question_ids):
        out[m] = coin(seed, question_id, drawn[question_id])
        drawn[question_id] += 1
    return out
