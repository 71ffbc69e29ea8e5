"""Seeds derived from names, stable across processes and batchings (unlike ``hash``)."""

from __future__ import annotations

import hashlib


def derived_seed(*parts: object) -> int:
    """A 64-bit seed from parts, e.g. (seed, question id, round, agent)."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big")
