"""Seeds derived from names, stable across processes and batchings (unlike ``hash``), and the process's
random generators seeded at once."""

from __future__ import annotations

import hashlib
import random

import numpy as np


def derived_seed(*parts: object) -> int:
    """A 64-bit seed from parts, e.g. (seed, question id, round, agent)."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def seed_everything(seed: int) -> None:
    """Seed random, numpy and torch (this imports torch: call it after the arguments are checked)."""
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
