"""A study's intervals: how much training changed a metric measured on the same questions before and
after (``udpo.study.tables`` reads them; docs/study.md).

- :func:`paired_bootstrap`: mean change after - before of a per-question metric, with a percentile
  bootstrap interval that resamples questions (each question keeps its pairs; seeds that share their
  questions share each draw, seeds with their own questions are resampled independently). It is
  conditional on the trained runs: it does not resample them.
- :func:`seed_change`: the analysis of a study whose S training seeds were all evaluated on the same Q
  problems (``docs/lab/preregistration.md``): each seed's mean change ``d_s``; a t-interval over seeds,
  ``mean(d) +- t_{S-1} sd(d) / sqrt(S)`` (run-to-run variance, problems fixed); and a percentile
  bootstrap that resamples seeds and problems together (S seeds and the distinct problems drawn with
  replacement, a problem posed by several questions drawn with all of them; the statistic the mean of
  ``after - before`` over the drawn seed x question cells), so both the runs and the test problems vary.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class PairedChange:
    """Mean of after - before and its ``level`` percentile bootstrap interval."""

    before: float
    after: float
    delta: float
    low: float
    high: float
    level: float
    n_questions: int
    n_seeds: int

    def to_dict(self) -> dict:
        return asdict(self)


def paired_bootstrap(
    before: Sequence[float] | Sequence[Sequence[float]] | np.ndarray,
    after: Sequence[float] | Sequence[Sequence[float]] | np.ndarray,
    level: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
    shared_questions: bool = True,
) -> PairedChange:
    """Paired change of a metric measured on the same questions before and after training.

    ``before`` and ``after`` are [Q] (one run) or S rows, one per training seed, each pairing its
    questions before and after. The statistic is the mean over seeds of each seed's mean of
    ``after - before``. With ``shared_questions`` every seed evaluated the same Q questions in the same
    order and each resample draws Q questions with replacement, the same draw for every seed; otherwise
    each seed has its own questions (rows may differ in length) and each resample draws every seed's
    questions independently (a stratified bootstrap). The interval is the (1 - level) / 2 and
    (1 + level) / 2 quantiles of the resampled statistic; ``n_questions`` counts the distinct questions.
    """
    rows_b, rows_a = _seed_rows(before), _seed_rows(after)
    if not rows_b or [len(r) for r in rows_b] != [len(r) for r in rows_a] or not all(len(r) for r in rows_b):
        raise ValueError(
            "before and after need the same questions per seed, got "
            f"{[len(r) for r in rows_b]} and {[len(r) for r in rows_a]} values"
        )
    if not all(np.isfinite(r).all() for r in rows_b + rows_a):
        raise ValueError("before and after must be finite numbers")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    changes = [a - b for b, a in zip(rows_b, rows_a, strict=True)]
    rng = np.random.default_rng(seed)
    if shared_questions:
        if len({len(c) for c in changes}) != 1:
            raise ValueError("shared_questions needs the same number of questions in every seed")
        per_question = np.mean(changes, axis=0)  # [Q]: the seeds' mean change on each question
        stats = per_question[rng.integers(0, len(per_question), size=(n_resamples, len(per_question)))].mean(
            1
        )
        n_questions = len(per_question)
    else:
        stats = np.mean([c[rng.integers(0, len(c), size=(n_resamples, len(c)))].mean(1) for c in changes], 0)
        n_questions = sum(len(c) for c in changes)
    low, high = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return PairedChange(
        before=float(np.mean([b.mean() for b in rows_b])),
        after=float(np.mean([a.mean() for a in rows_a])),
        delta=float(np.mean([c.mean() for c in changes])),
        low=float(low),
        high=float(high),
        level=level,
        n_questions=n_questions,
        n_seeds=len(changes),
    )


def _seed_rows(values: Sequence[float] | Sequence[Sequence[float]] | np.ndarray) -> list[np.ndarray]:
    """[Q] or S rows of per-question values -> S float arrays."""
    if len(values) and np.ndim(values[0]) == 0:
        values = [values]
    return [np.asarray(r, dtype=float).reshape(-1) for r in values]


@dataclass(frozen=True)
class SeedChange:
    """The change after - before of a metric over S seeds x the same questions (:func:`seed_change`);
    ``n_questions`` counts distinct problems.

    delta: mean over seeds of each seed's mean change (``per_seed``). t_low, t_high: the t-interval over
    seeds (None with one seed). boot_low, boot_high: the seeds x problems bootstrap interval."""

    before: float
    after: float
    delta: float
    per_seed: tuple[float, ...]
    t_low: float | None
    t_high: float | None
    boot_low: float
    boot_high: float
    level: float
    n_seeds: int
    n_questions: int

    def to_dict(self) -> dict:
        """Plain JSON data (``per_seed`` a list)."""
        return {**asdict(self), "per_seed": list(self.per_seed)}


def seed_change(
    before: Sequence[Sequence[float]] | np.ndarray,
    after: Sequence[Sequence[float]] | np.ndarray,
    level: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
    clusters: Sequence[object] | None = None,
) -> SeedChange:
    """The pre-registered analysis of ``before`` and ``after``, [S seeds, Q questions] each, every row the
    same questions in the same order (see the module docstring). ``clusters``: one key per question (its
    problem text): questions that pose the same problem are drawn together by the bootstrap, so a test
    set that repeats a problem is resampled by distinct problems; ``n_questions`` then counts those."""
    from scipy import stats as scipy_stats

    b, a = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    if b.ndim != 2 or b.shape != a.shape or not b.size:
        raise ValueError(
            f"before and after must be [seeds, problems] of one shape, got {b.shape} and {a.shape}"
        )
    if not (np.isfinite(b).all() and np.isfinite(a).all()):
        raise ValueError("before and after must be finite numbers")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    change = a - b
    per_seed = change.mean(1)
    n_seeds, n_questions = change.shape
    delta = float(per_seed.mean())
    if n_seeds > 1:
        half = scipy_stats.t.ppf((1 + level) / 2, n_seeds - 1) * per_seed.std(ddof=1) / math.sqrt(n_seeds)
        t_low, t_high = delta - half, delta + half
    else:
        t_low = t_high = None
    if clusters is not None and len(clusters) != n_questions:
        raise ValueError(f"clusters needs one key per question ({n_questions}), got {len(clusters)}")
    keys = list(range(n_questions)) if clusters is None else list(clusters)
    members = list({k: None for k in keys})  # distinct problems in first-seen order
    index = {k: i for i, k in enumerate(members)}
    # per seed, each problem's summed change and its number of questions: a draw of problems sums both
    problem_sum = np.zeros((n_seeds, len(members)))
    np.add.at(problem_sum, (slice(None), [index[k] for k in keys]), change)
    problem_count = np.bincount([index[k] for k in keys], minlength=len(members)).astype(float)
    rng = np.random.default_rng(seed)
    stats = np.empty(n_resamples)
    for k in range(n_resamples):
        seeds = rng.integers(0, n_seeds, n_seeds)
        problems = rng.integers(0, len(members), len(members))
        stats[k] = problem_sum[np.ix_(seeds, problems)].sum() / (n_seeds * problem_count[problems].sum())
    boot_low, boot_high = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return SeedChange(
        before=float(b.mean()),
        after=float(a.mean()),
        delta=delta,
        per_seed=tuple(float(x) for x in per_seed),
        t_low=None if t_low is None else float(t_low),
        t_high=None if t_high is None else float(t_high),
        boot_low=float(boot_low),
        boot_high=float(boot_high),
        level=level,
        n_seeds=n_seeds,
        n_questions=len(members),
    )
