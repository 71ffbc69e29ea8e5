"""The error every attack raises when it cannot do its job (attacker failure, bad cache file)."""

from __future__ import annotations


class AttackError(RuntimeError):
    """An attack could not be applied; the message says which attack, what failed and what to do."""
