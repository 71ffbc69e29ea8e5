"""Agent-tailored reward coefficients from warm-up debates (docs/metrics.md, "Agent-tailored coefficients";
paper appendix A.2).

Profile, per agent i, averaged over the warm-up debates: ``u_intra`` (lam * F_i + (1 - lam) * M_i),
``u_inter`` (share of disagreeing peers per round), ``loo`` (how often removing i changes the vote) and
``u_sys = (u_intra + u_inter + loo) / 3``. Coefficients, with ``kappa`` setting the asymmetry::

    alpha_i  = alpha_base * (1 + kappa * u_intra_i)     beta_i = beta_base * (1 + kappa * u_inter_i)
    gamma_i  = gamma_base * (1 + kappa * loo_i)
    lambda_i = lambda_base / (1 + kappa * u_sys_i)      eta_i  = eta_base * (1 + kappa * u_sys_i)

Base weights (alpha_base, beta_base, gamma_base), "Cohen's d normalization": Cohen's d of the
debate-level U_intra, U_inter, U_sys between failed and successful warm-up debates, clipped at 0 and
normalized to sum 1. Fallback 1/3 each when a class is empty, when some d is undefined (pooled sd 0
or fewer than 3 debates), or when every d <= 0. Explicit ``base_weights`` override all of this.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from .batch import Match, debate_metrics
from .coding import AnswerMatrix
from .statistics import cohens_d

#: the three uncertainty levels whose failure-vs-success effect sizes give the base weights alpha, beta, gamma
UNCERTAINTY_LEVELS = ("u_intra", "u_inter", "u_sys")


@dataclass(frozen=True)
class BaseWeights:
    """alpha_base, beta_base, gamma_base, where they came from (``source``) and the d values behind them."""

    alpha: float
    beta: float
    gamma: float
    source: str
    cohens_d: dict[str, float | None]


@dataclass(frozen=True)
class Calibration:
    """Per-agent coefficients (arrays of N), the profile they came from, and the settings used."""

    alpha: np.ndarray
    beta: np.ndarray
    gamma: np.ndarray
    lambda_: np.ndarray
    eta: np.ndarray
    u_intra: np.ndarray
    u_inter: np.ndarray
    loo: np.ndarray
    u_sys: np.ndarray
    base: BaseWeights
    kappa: float
    lam: float
    lambda_base: float
    eta_base: float
    n_debates: int
    n_fail: int

    @property
    def n_agents(self) -> int:
        return len(self.alpha)

    def coefficients(self) -> dict[str, np.ndarray]:
        """The reward coefficients as keyword arguments of :func:`~udpo.rewards.agent_rewards`."""
        return {"alpha": self.alpha, "beta": self.beta, "gamma": self.gamma, "lambda_": self.lambda_}

    def table(self) -> str:
        """A plain-text table of the profile and coefficients per agent, for logs."""
        head = f"{'agent':>5} {'u_intra':>8} {'u_inter':>8} {'loo':>6} {'u_sys':>6} | "
        head += f"{'alpha':>6} {'beta':>6} {'gamma':>6} {'lambda':>6} {'eta':>7}"
        lines = [
            f"base weights ({self.base.source}): alpha {self.base.alpha:.3f}, beta {self.base.beta:.3f}, "
            f"gamma {self.base.gamma:.3f}; kappa {self.kappa:g}, {self.n_debates} warm-up debates "
            f"({self.n_fail} failed)",
            head,
        ]
        for i in range(self.n_agents):
            lines.append(
                f"{i:>5} {self.u_intra[i]:>8.3f} {self.u_inter[i]:>8.3f} {self.loo[i]:>6.3f} {self.u_sys[i]:>6.3f} | "
                f"{self.alpha[i]:>6.3f} {self.beta[i]:>6.3f} {self.gamma[i]:>6.3f} {self.lambda_[i]:>6.3f} "
                f"{self.eta[i]:>7.4f}"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """JSON-ready: per-agent lists, base weights with their source and Cohen's d values."""
        per_agent = ("alpha", "beta", "gamma", "lambda_", "eta")
        profile = ("u_intra", "u_inter", "loo", "u_sys")
        return {
            "coefficients": {k: getattr(self, k).tolist() for k in per_agent},
            "profile": {k: getattr(self, k).tolist() for k in profile},
            "base_weights": {
                "alpha_base": self.base.alpha,
                "beta_base": self.base.beta,
                "gamma_base": self.base.gamma,
                "source": self.base.source,
                "cohens_d": self.base.cohens_d,
            },
            "settings": {
                "kappa": self.kappa,
                "lam": self.lam,
                "lambda_base": self.lambda_base,
                "eta_base": self.eta_base,
            },
            "warmup": {
                "n_debates": self.n_debates,
                "n_fail": self.n_fail,
                "n_success": self.n_debates - self.n_fail,
            },
        }


def calibration_from_dict(d: dict) -> Calibration:
    """Rebuild a :class:`Calibration` from :meth:`Calibration.to_dict` output (e.g. a run's JSON file)."""
    try:
        arrays = {k: np.asarray(v, dtype=float) for k, v in {**d["coefficients"], **d["profile"]}.items()}
        bw = d["base_weights"]
        base = BaseWeights(bw["alpha_base"], bw["beta_base"], bw["gamma_base"], bw["source"], bw["cohens_d"])
        warmup = d["warmup"]
        return Calibration(
            **arrays, base=base, **d["settings"], n_debates=warmup["n_debates"], n_fail=warmup["n_fail"]
        )
    except (KeyError, TypeError) as e:
        raise ValueError(f"not a calibration record: {e!r}") from None


def cohens_d_base_weights(
    u_intra: np.ndarray, u_inter: np.ndarray, u_sys: np.ndarray, correct: np.ndarray
) -> BaseWeights:
    """Base weights from Cohen's d of each debate-level metric between failures and successes."""
    correct = np.asarray(correct, dtype=bool)
    ds = {
        name: cohens_d(values[~correct], values[correct])
        for name, values in zip(UNCERTAINTY_LEVELS, (u_intra, u_inter, u_sys), strict=True)
    }
    shown = {k: (None if math.isnan(d) else d) for k, d in ds.items()}
    if correct.all() or not correct.any():
        reason = "no failed warm-up debates" if correct.all() else "no successful warm-up debates"
    elif any(math.isnan(d) for d in ds.values()):
        undefined = ", ".join(k for k, d in ds.items() if math.isnan(d))
        reason = f"Cohen's d undefined for {undefined} (pooled sd 0 or fewer than 3 debates)"
    elif all(d <= 0 for d in ds.values()):
        reason = "every Cohen's d <= 0"
    else:
        clipped = np.array([max(d, 0.0) for d in ds.values()])
        w = clipped / clipped.sum()
        return BaseWeights(float(w[0]), float(w[1]), float(w[2]), "cohens_d", shown)
    return BaseWeights(1 / 3, 1 / 3, 1 / 3, f"fallback: {reason}", shown)


def calibrate(
    answer_matrices: Sequence[AnswerMatrix],
    golds: Sequence[Hashable | None] | None,
    kappa: float = 1.5,
    lam: float = 0.5,
    base_weights: tuple[float, float, float] | None = None,
    lambda_base: float = 1.0,
    eta_base: float = 0.01,
    match: Match | None = None,
    correct: Sequence[bool] | None = None,
    keys: Sequence[str] | None = None,
) -> Calibration:
    """Agent-tailored alpha, beta, gamma, lambda and eta from warm-up debates (all with the same N).

    ``base_weights=(alpha_base, beta_base, gamma_base)`` skips the Cohen's d normalization.
    Correctness of each warm-up debate (for the Cohen's d base weights): ``correct`` when given (e.g.
    the trajectories' ``correct`` flags, judged by their task; ``golds`` may then be None), else the vote
    against ``golds`` with ``match(prediction, gold)`` (default ``==``; a None prediction is wrong).
    ``keys``: each debate's question id, the key of its votes (:func:`~udpo.rewards.debate_metrics`).
    """
    if not kappa >= 0 or not math.isfinite(kappa):
        raise ValueError(f"kappa must be a finite number >= 0, got {kappa}")
    for name, v in (("lambda_base", lambda_base), ("eta_base", eta_base)):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {v}")
    if len(answer_matrices) == 0:
        raise ValueError("calibration needs at least one warm-up debate")
    if correct is None and golds is None:
        raise ValueError("calibration needs golds or correct flags for the warm-up debates")
    if correct is not None:
        if len(correct) != len(answer_matrices):
            raise ValueError(f"got {len(correct)} correct flags for {len(answer_matrices)} debates")
        golds = None
    m = debate_metrics(answer_matrices, golds, lam=lam, match=match, keys=keys)  # validates every matrix
    n_agents = len(answer_matrices[0])
    for i, a in enumerate(answer_matrices):
        if len(a) != n_agents:
            raise ValueError(
                f"calibration needs the same N in every warm-up debate: debate 0 has {n_agents} agents, "
                f"debate {i} has {len(a)}"
            )
    correct = np.asarray(correct, dtype=bool) if correct is not None else m.r_task.astype(bool)
    base = cohens_d_base_weights(m.u_intra, m.u_inter, m.u_sys, correct)
    if base_weights is not None:
        if len(base_weights) != 3 or any(not math.isfinite(w) or w < 0 for w in base_weights):
            raise ValueError(f"base_weights must be three finite numbers >= 0, got {base_weights}")
        base = BaseWeights(*map(float, base_weights), source="explicit", cohens_d=base.cohens_d)

    u_intra = m.agent_u_intra.mean(axis=0)
    u_inter = m.agent_u_inter.mean(axis=0)
    loo = m.agent_loo.mean(axis=0)
    u_sys = (u_intra + u_inter + loo) / 3
    return Calibration(
        alpha=base.alpha * (1 + kappa * u_intra),
        beta=base.beta * (1 + kappa * u_inter),
        gamma=base.gamma * (1 + kappa * loo),
        lambda_=lambda_base / (1 + kappa * u_sys),
        eta=eta_base * (1 + kappa * u_sys),
        u_intra=u_intra,
        u_inter=u_inter,
        loo=loo,
        u_sys=u_sys,
        base=base,
        kappa=float(kappa),
        lam=float(lam),
        lambda_base=float(lambda_base),
        eta_base=float(eta_base),
        n_debates=len(m),
        n_fail=int((~correct).sum()),
    )
