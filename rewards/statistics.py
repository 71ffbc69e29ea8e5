"""Does uncertainty predict failure? The statistics of docs/metrics.md, "``udpo diagnose``" (SciPy
underneath).

- :func:`cohens_d`: (mean_fail - mean_success) / pooled sd, with the pooled sd
  ``sqrt(((n_f - 1) s_f^2 + (n_s - 1) s_s^2) / (n_f + n_s - 2))`` (sample variances, ddof = 1;
  a class of one contributes no variance). Undefined (``nan``) when a class is empty, when
  n_f + n_s < 3, or when the pooled sd is 0.
- :func:`failure_vs_success`: group means, Welch's two-sample t-test p-value and Cohen's d.
- :func:`pearson`: Pearson r and p-value; ``nan`` for constant inputs or fewer than 3 values.

"Constant" means a spread within rounding noise (:data:`ROUNDING_NOISE`): a metric that is equal in
exact arithmetic can differ in its last bits between debates (1/3 reached by two sums), and even
equal values have a float mean off by an ulp, so ``var() > 0`` would let noise pass for variation
(a Cohen's d of 1 from ten copies of 0.1). Such groups give the undefined result above, which
calibration turns into its 1/3 fallback (docs/metrics.md, "Agent-tailored coefficients").
- :func:`selective_prediction`: accuracy of the k% least uncertain debates. Debates tied at the cut
  are counted by their mean accuracy (the expected accuracy under a random tie-break), so the curve
  does not depend on file order.
- :func:`stratified_gains`: accuracy gain over a baseline within bins of the baseline's U_sys.
- :func:`auroc`: area under the ROC curve of a score separating positives from negatives, i.e. the
  probability that a random positive scores above a random negative, ties counting one half (the
  Mann-Whitney U statistic divided by n_pos * n_neg); ``nan`` when a class is empty. For an
  uncertainty score the positives are the wrong answers.
- :func:`abstention_scores`: accuracy, abstention rate, correctness and truthfulness of a method that
  may abstain (DiverseAgentEntropy paper, section 4.1).
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
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

#: difficulty bins of Standard-MAD U_sys, [0,.2) [.2,.4) [.4,.6) [.6,.8) [.8,1] (docs/metrics.md,
#: "``udpo diagnose``")
U_SYS_BINS: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
#: selective-prediction coverages k (%)
COVERAGES: tuple[int, ...] = tuple(range(10, 101, 10))
#: a spread at most this (times the values' magnitude, at least 1) is rounding noise, not variation
ROUNDING_NOISE = 1e-12


def _as_1d(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN at index {int(np.flatnonzero(np.isnan(arr))[0])}")
    return arr


def _is_constant(x: np.ndarray) -> bool:
    """Whether the values spread no more than rounding noise (empty and single values are constant)."""
    return len(x) < 2 or float(np.ptp(x)) <= ROUNDING_NOISE * max(1.0, float(np.abs(x).max()))


def _paired(values, correct) -> tuple[np.ndarray, np.ndarray]:
    v = _as_1d(values, "values")
    c = _as_1d(correct, "correct")
    if len(v) != len(c):
        raise ValueError(f"got {len(v)} values but {len(c)} correctness flags")
    if not np.isin(c, (0.0, 1.0)).all():
        raise ValueError("correct must hold booleans or 0/1")
    return v, c.astype(bool)


def cohens_d(fail: Sequence[float] | np.ndarray, success: Sequence[float] | np.ndarray) -> float:
    """Cohen's d of failures against successes (positive: failures more uncertain); nan if undefined."""
    f, s = _as_1d(fail, "fail"), _as_1d(success, "success")
    nf, ns = len(f), len(s)
    if nf == 0 or ns == 0 or nf + ns < 3 or (_is_constant(f) and _is_constant(s)):  # pooled sd 0
        return math.nan
    ss = ((f - f.mean()) ** 2).sum() + ((s - s.mean()) ** 2).sum()
    return float((f.mean() - s.mean()) / math.sqrt(ss / (nf + ns - 2)))


@dataclass(frozen=True)
class GroupComparison:
    """One metric, failed vs successful debates. Undefined statistics are nan."""

    n_fail: int
    n_success: int
    mean_fail: float
    mean_success: float
    t_statistic: float
    p_value: float
    cohens_d: float

    def to_dict(self) -> dict:
        return asdict(self)


def failure_vs_success(
    values: Sequence[float] | np.ndarray, correct: Sequence[bool] | np.ndarray
) -> GroupComparison:
    """Compare a metric between failed and successful debates (Welch t-test and Cohen's d)."""
    v, c = _paired(values, correct)
    fail, success = v[~c], v[c]
    t_stat, p_value = math.nan, math.nan
    if len(fail) >= 2 and len(success) >= 2 and not (_is_constant(fail) and _is_constant(success)):
        from scipy import stats  # imported on use: SciPy takes about a second to import

        with warnings.catch_warnings():
            # SciPy warns of "precision loss ... nearly identical" data whenever one group is constant
            # (and not 0); Welch's test is well defined then, the other group's variance carries it
            warnings.filterwarnings("ignore", "Precision loss occurred", RuntimeWarning)
            res = stats.ttest_ind(fail, success, equal_var=False)
        t_stat, p_value = float(res.statistic), float(res.pvalue)
    return GroupComparison(
        n_fail=len(fail),
        n_success=len(success),
        mean_fail=float(fail.mean()) if len(fail) else math.nan,
        mean_success=float(success.mean()) if len(success) else math.nan,
        t_statistic=t_stat,
        p_value=p_value,
        cohens_d=cohens_d(fail, success),
    )


def pearson(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> tuple[float, float]:
    """Pearson r and its two-sided p-value; (nan, nan) if fewer than 3 pairs or an input is constant."""
    x, y = _as_1d(x, "x"), _as_1d(y, "y")
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length ({len(x)} vs {len(y)})")
    if len(x) < 3 or _is_constant(x) or _is_constant(y):
        return math.nan, math.nan
    from scipy import stats

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # r of exactly +-1 warns about a p-value of 0
        res = stats.pearsonr(x, y)
    return float(res.statistic), float(res.pvalue)


def selective_prediction(
    values: Sequence[float] | np.ndarray,
    correct: Sequence[bool] | np.ndarray,
    coverages: Sequence[int] = COVERAGES,
) -> list[dict]:
    """Accuracy of the k% lowest-uncertainty debates for each k in ``coverages``.

    Keeps ``max(1, round(k/100 * n))`` debates; debates tied with the last kept value count with the
    tied group's mean accuracy. Returns ``[{"k", "n_kept", "accuracy"}, ...]``.
    """
    v, c = _paired(values, correct)
    n = len(v)
    if n == 0:
        raise ValueError("selective prediction needs at least one debate")
    order = np.argsort(v, kind="stable")
    v_sorted, c_sorted = v[order], c[order].astype(float)
    curve = []
    for k in coverages:
        if not 0 < k <= 100:
            raise ValueError(f"coverage k must lie in (0, 100], got {k}")
        kept = max(1, int(round(k / 100 * n)))
        cut = v_sorted[kept - 1]
        below = v_sorted < cut
        tied = v_sorted == cut
        n_below = int(below.sum())
        correct_kept = c_sorted[below].sum() + (kept - n_below) * c_sorted[tied].mean()
        curve.append({"k": int(k), "n_kept": kept, "accuracy": float(correct_kept / kept)})
    return curve


def bin_label(index: int, edges: Sequence[float] = U_SYS_BINS) -> str:
    """Readable bin name: ``[0.2, 0.4)``; the last bin is closed: ``[0.8, 1]``."""
    close = "]" if index == len(edges) - 2 else ")"
    return f"[{edges[index]:g}, {edges[index + 1]:g}{close}"


def bin_index(values: Sequence[float] | np.ndarray, edges: Sequence[float] = U_SYS_BINS) -> np.ndarray:
    """Bin of each value among half-open bins ``[e_j, e_j+1)``, the last one closed."""
    v = _as_1d(values, "values")
    if ((v < edges[0]) | (v > edges[-1])).any():
        raise ValueError(f"values outside [{edges[0]}, {edges[-1]}]")
    return np.minimum(np.searchsorted(edges, v, side="right") - 1, len(edges) - 2)


def stratified_gains(
    baseline_u_sys: Sequence[float] | np.ndarray,
    baseline_correct: Sequence[float] | np.ndarray,
    method_correct: Sequence[float] | np.ndarray,
    edges: Sequence[float] = U_SYS_BINS,
) -> list[dict]:
    """Per bin of the baseline's U_sys: questions, baseline and method accuracy, and the gain (method - baseline).

    The three arrays are aligned per question; correctness may be a per-question mean in [0, 1]
    (several debates of one question). Accuracies and gains are fractions; empty bins give nan.
    """
    u = _as_1d(baseline_u_sys, "baseline_u_sys")
    base = _as_1d(baseline_correct, "baseline_correct")
    method = _as_1d(method_correct, "method_correct")
    if not len(u) == len(base) == len(method):
        raise ValueError(f"arrays differ in length ({len(u)}, {len(base)}, {len(method)})")
    bins = bin_index(u, edges)
    rows = []
    for j in range(len(edges) - 1):
        sel = bins == j
        n = int(sel.sum())
        b = float(base[sel].mean()) if n else math.nan
        mth = float(method[sel].mean()) if n else math.nan
        rows.append(
            {
                "bin": bin_label(j, edges),
                "n_questions": n,
                "baseline_accuracy": b,
                "accuracy": mth,
                "gain": mth - b,
            }
        )
    return rows


def auroc(scores: Sequence[float] | np.ndarray, positive: Sequence[bool] | np.ndarray) -> float:
    """P(score of a random positive > score of a random negative) + 0.5 P(tie); nan if a class is empty."""
    s, pos = _paired(scores, positive)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return math.nan
    from scipy.stats import rankdata

    ranks = rankdata(s)  # average ranks: ties share their mean rank, which counts them one half
    u = ranks[pos].sum() - n_pos * (n_pos + 1) / 2
    return float(u / (n_pos * n_neg))


@dataclass(frozen=True)
class AbstentionScores:
    """A method that answers or abstains, over n questions (fractions; nan where undefined).

    accuracy: correct among the answered questions (nan when all abstain). abstention_rate: abstained / n.
    correctness: answered and correct / n. truthfulness: (answered and correct, or abstained) / n.
    """

    n: int
    n_answered: int
    accuracy: float
    abstention_rate: float
    correctness: float
    truthfulness: float

    def to_dict(self) -> dict:
        return asdict(self)


def abstention_scores(
    correct: Sequence[bool] | np.ndarray, abstained: Sequence[bool] | np.ndarray
) -> AbstentionScores:
    """Scores of answers that are ``correct`` (whether the answer the method would give is right) when
    the method did not ``abstain``."""
    c = _as_1d(correct, "correct")
    a = _as_1d(abstained, "abstained")
    if len(c) != len(a):
        raise ValueError(f"got {len(c)} correctness flags but {len(a)} abstention flags")
    if not (np.isin(c, (0.0, 1.0)).all() and np.isin(a, (0.0, 1.0)).all()):
        raise ValueError("correct and abstained must hold booleans or 0/1")
    if len(c) == 0:
        raise ValueError("abstention scores need at least one question")
    c, a = c.astype(bool), a.astype(bool)
    answered = ~a
    right = int((c & answered).sum())
    n = len(c)
    return AbstentionScores(
        n=n,
        n_answered=int(answered.sum()),
        accuracy=right / int(answered.sum()) if answered.any() else math.nan,
        abstention_rate=float(a.mean()),
        correctness=right / n,
        truthfulness=(right + int(a.sum())) / n,
    )


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
