"""The majority vote (docs/metrics.md, "The vote"): the one rule every vote of the project follows.

``majority_vote(answers, key)`` is the most frequent non-None answer. A tie among the most frequent
answers goes to the tied answer with the smallest :func:`tie_digest` ``sha256(f"{key}\\n{answer}")`` (hex
digests compared as strings), ``key`` being the debate's question id (``""`` for a bare list of answers);
all None (or no answers) gives None. The answer in the digest is ``str(answer)``: answers are normalized
strings (udpo.env.tasks), and any other hashable answer is read as its ``str``. The vote never depends on
which agent gave an answer, only on the multiset of answers and the key, so every agent weighs the same,
and over many questions each tied answer wins about equally often.

Two different answers that read as the same string (``1`` and ``"1"``) cannot be ordered by the digest: a
tie between them is a ValueError. The vectorized votes of :mod:`udpo.rewards.batch` (the final round and
the round without each agent, for many debates) follow the same rule and are tested equal to this one.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Hashable, Iterable


def tie_bytes(key: str, answer: Hashable) -> bytes:
    """The raw sha256 of ``f"{key}\\n{answer}"`` in UTF-8 (``answer`` read as ``str(answer)``). Bytes sort
    as their hex digests do (hex writes each byte as two digits, in order), so the vectorized votes compare
    these (cheaper to make and to sort) where :func:`tie_digest` is the rule as written."""
    return hashlib.sha256(f"{key}\n{answer}".encode()).digest()


def tie_digest(key: str, answer: Hashable) -> str:
    """The tie-break digest of ``answer`` in the vote of question ``key``: the hex sha256 of
    ``f"{key}\\n{answer}"`` in UTF-8 (``answer`` read as ``str(answer)``). The smallest digest wins a tie."""
    return tie_bytes(key, answer).hex()


def check_key(key: object, where: str = "key") -> str:
    """``key`` if it is a string (a question id), else a ValueError naming ``where``."""
    if not isinstance(key, str):
        raise ValueError(
            f"{where}: a vote's key is the question id, a string; got {type(key).__name__} {key!r}"
        )
    return key


def unordered_tie(key: str, answers: Iterable[Hashable]) -> ValueError:
    """The error for tied answers that differ but read as the same string (the digest cannot order them)."""
    shown = ", ".join(f"{type(a).__name__} {a!r}" for a in answers)
    return ValueError(
        f"vote of question {key!r}: tied answers {shown} differ but read as the same string, so the "
        "tie-break digest cannot order them; give answers one type (normalized strings)"
    )


def majority_vote(answers: Iterable[Hashable | None], key: str = "") -> Hashable | None:
    """The vote of ``answers`` (one per agent; None abstains) in the debate of question ``key``: the most
    frequent non-None answer, a tie to the tied answer with the smallest :func:`tie_digest`, None when
    nobody answered (see the module docstring)."""
    check_key(key)
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    top = max(counts.values())
    tied = [a for a, c in counts.items() if c == top]
    if len(tied) == 1:
        return tied[0]
    digests = {a: tie_digest(key, a) for a in tied}
    best = min(digests.values())
    winners = [a for a, d in digests.items() if d == best]
    if len(winners) > 1:
        raise unordered_tie(key, winners)
    return winners[0]
