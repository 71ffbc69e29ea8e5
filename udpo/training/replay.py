"""Uncertainty-driven replay (paper appendix A.3; docs/algorithms.md, "Uncertainty-driven replay").

The buffer keeps the most recent ``capacity`` debates. A debate's priority is its composite uncertainty
``U(tau) = alpha_base (1 - r_intra) + beta_base (1 - r_inter) + gamma_base (1 - r_sys)``; it is drawn
(with replacement) with probability ``P(tau) = (U + 1e-3)^eta_replay / sum (U' + 1e-3)^eta_replay``, so
unsettled debates (hard questions) come back more often. The bias this adds is corrected by importance
weights ``w = (1 / (n P(tau)))^beta_is``, divided by the largest weight any stored debate could get
(so w <= 1; as in prioritized experience replay). Replayed debates keep their recorded behavior
log-probs (the trainer's, recorded on the debates before they are stored, else the engine's), so their
ratio compares the current policy with the one that generated them.

A run's replay (:class:`RunReplay`, ``replay: true``) is such a buffer with the run's settings: each
update batch adds to the fresh debates as many drawn ones as make ``replay_fraction`` of it
(:func:`replayed_count`), the draw seeded by the run's seed and the iteration (the same on every
process); every ``replay_refresh_interval`` iterations the stored questions are debated again with the
current policy first, replacing their stored debates. The loop stores the fresh debates after their
update (:meth:`ReplayBuffer.add`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from udpo.config.groups import AlgorithmArgs, RewardArgs
from udpo.env.tasks.base import Question
from udpo.env.trajectory import Trajectory
from udpo.rewards import composite_uncertainty, debate_metrics

PRIORITY_FLOOR = 1e-3
#: the calibration record's base weights of the priority, and what stands for one it lacks
BASE_WEIGHT_NAMES, DEFAULT_BASE_WEIGHT = ("alpha_base", "beta_base", "gamma_base"), 1 / 3
#: debates(questions, meta) -> their debates with the current policy (the trainer's ``debate``)
Debate = Callable[[Sequence[Question], dict[str, Any]], list[Trajectory]]


def replayed_count(fresh: int, fraction: float) -> int:
    """Debates drawn from the buffer beside ``fresh`` new ones, so that they make ``fraction`` of the batch."""
    return round(fresh * fraction / (1 - fraction))


class ReplayBuffer:
    """Recent debates, sampled by uncertainty.

    capacity: debates kept (the oldest go first). eta_replay: prioritization strength (0 = uniform).
    beta_is: importance-correction strength (1 = full correction). base_weights: (alpha_base,
    beta_base, gamma_base) of the priority, e.g. from the warm-up calibration; may be reassigned.
    """

    def __init__(
        self,
        capacity: int = 256,
        eta_replay: float = 1.0,
        beta_is: float = 1.0,
        base_weights: Sequence[float] = (1 / 3, 1 / 3, 1 / 3),
    ):
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {capacity}")
        if eta_replay < 0 or beta_is < 0:
            raise ValueError(f"eta_replay and beta_is must be >= 0, got {eta_replay} and {beta_is}")
        self.capacity = capacity
        self.eta_replay = float(eta_replay)
        self.beta_is = float(beta_is)
        self.base_weights = tuple(float(w) for w in base_weights)
        if len(self.base_weights) != 3:
            raise ValueError(f"base_weights must be (alpha_base, beta_base, gamma_base), got {base_weights}")
        self._items: deque[Trajectory] = deque(maxlen=capacity)
        self._terms: deque[tuple[float, float, float]] = deque(maxlen=capacity)  # (r_intra, r_inter, r_sys)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def items(self) -> list[Trajectory]:
        return list(self._items)

    def question_ids(self) -> list[str]:
        """Distinct questions in the buffer (to re-run with the current policy and ``add(..., replace=True)``)."""
        return list(dict.fromkeys(t.question_id for t in self._items))

    def add(self, trajectories: Iterable[Trajectory], replace: bool = False) -> None:
        """Store debates (evicting the oldest beyond capacity). ``replace=True`` first drops stored
        debates of the same questions: how re-runs with the current policy refresh the buffer."""
        new = list(trajectories)
        if not new:
            return
        m = debate_metrics([t.answers for t in new], keys=[t.question_id for t in new])
        if replace:
            fresh = {t.question_id for t in new}
            kept = [
                (t, r) for t, r in zip(self._items, self._terms, strict=True) if t.question_id not in fresh
            ]
            self._items = deque((t for t, _ in kept), maxlen=self.capacity)
            self._terms = deque((r for _, r in kept), maxlen=self.capacity)
        for k, t in enumerate(new):
            self._items.append(t)
            self._terms.append((float(m.r_intra[k]), float(m.r_inter[k]), float(m.r_sys[k])))

    def priorities(self) -> np.ndarray:
        """U(tau) of every stored debate, oldest first."""
        if not self._terms:
            return np.zeros(0)
        r_intra, r_inter, r_sys = np.asarray(self._terms, dtype=float).T
        return np.atleast_1d(composite_uncertainty(r_intra, r_inter, r_sys, *self.base_weights))

    def probabilities(self) -> np.ndarray:
        """P(tau), proportional to (U + 1e-3)^eta_replay."""
        p = (self.priorities() + PRIORITY_FLOOR) ** self.eta_replay
        return p / p.sum()

    def sample(self, k: int, rng: np.random.Generator | int | None = None) -> tuple[list[Trajectory], Tensor]:
        """Draw ``k`` debates with replacement; returns them and their importance weights ([k], float32)."""
        if k < 0:
            raise ValueError(f"cannot sample {k} debates")
        if k and not self._items:
            raise ValueError("cannot sample from an empty replay buffer")
        if k == 0:
            return [], torch.zeros(0)
        rng = np.random.default_rng(rng)
        p = self.probabilities()
        picks = rng.choice(len(p), size=k, replace=True, p=p)
        w = (1.0 / (len(p) * p)) ** self.beta_is
        w = w / w.max()
        items = list(self._items)
        return [items[j] for j in picks], torch.as_tensor(w[picks], dtype=torch.float32)

    def stats(self) -> dict[str, float]:
        """Size and priority statistics, for logging."""
        u = self.priorities()
        return {
            "replay/size": float(len(u)),
            "replay/priority_mean": float(u.mean()) if len(u) else 0.0,
            "replay/priority_max": float(u.max()) if len(u) else 0.0,
        }

    def state_dict(self) -> dict:
        """JSON-serializable state: settings, the stored debates as trajectory records (token ids, the
        engine's log-probs) and, beside them, each turn's trainer log-probs (null where none)."""
        return {
            "capacity": self.capacity,
            "eta_replay": self.eta_replay,
            "beta_is": self.beta_is,
            "base_weights": list(self.base_weights),
            "items": [t.to_dict() for t in self._items],
            "trainer_logprobs": [
                [[turn.trainer_logprobs for turn in row] for row in t.turns] for t in self._items
            ],
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output (settings included). A state written before the trainer's
        log-probs were kept apart holds them in the items' log-probs, where they serve as well."""
        missing = [
            k for k in ("capacity", "eta_replay", "beta_is", "base_weights", "items") if k not in state
        ]
        if missing:
            raise ValueError(f"replay state is missing {', '.join(missing)}")
        self.capacity = int(state["capacity"])
        self.eta_replay, self.beta_is = float(state["eta_replay"]), float(state["beta_is"])
        self.base_weights = tuple(float(w) for w in state["base_weights"])
        self._items, self._terms = deque(maxlen=self.capacity), deque(maxlen=self.capacity)
        items = [Trajectory.from_dict(d) for d in state["items"]]
        trainer = state.get("trainer_logprobs")  # absent from a state written before they were kept apart
        for t, rows in zip(items, trainer or [], strict=trainer is not None):
            for row, values in zip(t.turns, rows, strict=True):
                for turn, lp in zip(row, values, strict=True):
                    turn.trainer_logprobs = lp
        self.add(items)


class RunReplay(ReplayBuffer):
    """A training run's replay buffer: its settings (``replay_*`` of ``algorithm``), its seed, and how each
    update batch draws from it (:meth:`update_batch`). The priority's base weights are ``reward``'s when
    given, else the calibration record's (Cohen's d)."""

    def __init__(self, algorithm: AlgorithmArgs, reward: RewardArgs, seed: int, calibration: dict[str, Any]):
        bases = calibration.get("base_weights", {})
        base = reward.base_weights or tuple(bases.get(k, DEFAULT_BASE_WEIGHT) for k in BASE_WEIGHT_NAMES)
        super().__init__(algorithm.replay_capacity, algorithm.replay_eta, algorithm.replay_beta, base)
        self.fraction, self.refresh_interval = algorithm.replay_fraction, algorithm.replay_refresh_interval
        self.seed = seed

    def update_batch(
        self, fresh: list[Trajectory], iteration: int, questions: Sequence[Question], debate: Debate
    ) -> tuple[list[Trajectory], list[float], int]:
        """Iteration ``iteration``'s update batch: the ``fresh`` debates, then the drawn ones; with their
        weights (1 for a fresh debate, the importance weight for a drawn one) and the number drawn. Every
        ``refresh_interval`` iterations the stored questions (of ``questions``) are debated again first.
        The fresh debates are not stored here: the loop adds them once their update has run."""
        if self.refresh_interval and iteration % self.refresh_interval == 0 and len(self):
            stored = set(self.question_ids())
            again = [q for q in questions if q.id in stored]
            self.add(debate(again, {"phase": "replay_refresh", "iteration": iteration}), replace=True)
        wanted = replayed_count(len(fresh), self.fraction)
        rng = np.random.default_rng([self.seed, iteration, 7])  # the same draw on every process
        replayed, weights = self.sample(min(wanted, len(self)), rng)
        return [*fresh, *replayed], [1.0] * len(fresh) + weights.tolist(), len(replayed)
