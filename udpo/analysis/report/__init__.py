"""``udpo report``: one self-contained HTML page per run (or two runs side by side).

:func:`write_report` reads run folders (:mod:`udpo.analysis.report.load`: debate runs, evaluation folders,
training runs, ``udpo eval`` attack runs, collections of runs), renders the overview with inline SVG
plots (:mod:`udpo.analysis.report.overview`, :mod:`udpo.analysis.report.svg`) and embeds every debate for the page's
script to browse (:mod:`udpo.analysis.report.page`). Nothing here imports torch or transformers.
"""

from __future__ import annotations

import os
from pathlib import Path

from udpo.env.jsonl import write_text_atomic

from .load import DebateSet, NotARunError, Run, load_run
from .page import render_page

__all__ = ["DebateSet", "NotARunError", "Run", "load_run", "render_page", "write_report"]


def write_report(
    runs: list[str | os.PathLike], out: str | os.PathLike, lam: float = 0.5
) -> tuple[Path, list[Run]]:
    """Read one run (or two, compared side by side) and write the report page to ``out``.

    Returns the page's path and the runs as read. Raises NotARunError for a path holding no run.
    """
    if not 1 <= len(runs) <= 2:
        raise ValueError(f"give one run folder, or two to compare, not {len(runs)}")
    loaded = [load_run(p, lam=lam) for p in runs]
    if len(loaded) == 2 and loaded[0].label == loaded[1].label:
        loaded[0].label, loaded[1].label = str(runs[0]), str(runs[1])
    out = Path(out)
    write_text_atomic(out, render_page(loaded))
    return out, loaded
