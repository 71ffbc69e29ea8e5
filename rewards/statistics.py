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
