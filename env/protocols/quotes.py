"""The quote system of ColMAD / CopMAD debates (after Kenton et al. 2024): quotes checked by exact match.

Debaters cite evidence as ``<quote>...</quote>``. Before anyone reads a turn, each quote is checked
against the item's sources (for ReaLMistake: the model input and the model response): a quote that
occurs verbatim in one source becomes ``<v_quote>...</v_quote>`` (verified), any other quote
``<u_quote>...</u_quote>`` (unverified: the judge is told not to trust it). The match is exact and
case-sensitive; only whitespace at the two ends of the quote is ignored (it is layout, not content).
An empty quote, or one whose closing tag never comes, is not verified.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_QUOTE_RE = re.compile(r"<quote>(.*?)(</quote>|$)", re.DOTALL)


@dataclass(frozen=True)
class QuoteCheck:
    """A turn with its quotes marked, and how many were verified / unverified."""

    text: str
    verified: int
    unverified: int


def is_verified(quote: str, sources: Sequence[str]) -> bool:
    """Whether ``quote`` (ends stripped of whitespace) occurs verbatim in one of ``sources``."""
    q = quote.strip()
    return bool(q) and any(q in s for s in sources)


def mark_quotes(text: str, sources: Sequence[str]) -> QuoteCheck:
    """``text`` with every ``<quote>`` replaced by a ``<v_quote>`` or ``<u_quote>`` (see module docstring)."""
    counts = [0, 0]

    def mark(m: re.Match) -> str:
        closed = bool(m.group(2))
        ok = closed and is_verified(m.group(1), sources)
        counts[0 if ok else 1] += 1
        tag = "v_quote" if ok else "u_quote"
        return f"<{tag}>{m.group(1)}</{tag}>"

    marked = _QUOTE_RE.sub(mark, text)
    return QuoteCheck(text=marked, verified=counts[0], unverified=counts[1])
