"""Uncertainty-driven replay (docs/algorithms.md, paper A.3): priorities, probabilities, IS weights, state."""

from __future__ import annotations

import json

import numpy as np
import pytest

from udpo.env.trajectory import Trajectory, Turn
from udpo.training.replay import ReplayBuffer

# Three debates, N = 3, T = 2, with base weights (0.5, 0.3, 0.2):
# settled: every answer "1"                     -> r = (1, 1, 1)                          U = 0
# mixed:   1 1 1 / 2 1 1 / 2 2 1                -> r = (2/3, 5/9, 1)  U = 0.5/3 + 0.3*4/9  = 0.3
# split:   1 1 1 / 2 2 2 / 3 3 3                -> r_intra 1, r_inter 0, U_sys = (1 + 1 + 1/3)/3 = 7/9
#                                                  U = 0.3 * 1 + 0.2 * 7/9 = 0.455556
MATRICES = {
    "settled": [["1"] * 3] * 3,
    "mixed": [["1", "1", "1"], ["2", "1", "1"], ["2", "2", "1"]],
    "split": [["1"] * 3, ["2"] * 3, ["3"] * 3],
}
U = np.array([0.0, 0.3, 0.3 + 0.2 * 7 / 9])
BASE = (0.5, 0.3, 0.2)


def debate(qid: str) -> Trajectory:
    answers = MATRICES[qid.split("#")[0]]
    turns = [
        [Turn(i, t, [], "x", a, [1, 2], [5, 6], [-0.5, -0.25]) for t, a in enumerate(row)]
        for i, row in enumerate(answers)
    ]
    return Trajectory(qid, "q", "1", [list(r) for r in answers], "1", True, turns=turns)


def filled(**kw) -> ReplayBuffer:
    buf = ReplayBuffer(base_weights=BASE, **kw)
    buf.add([debate("settled"), debate("mixed"), debate("split")])
    return buf


def test_priorities_are_the_composite_uncertainty():
    assert np.allclose(filled().priorities(), U)


@pytest.mark.parametrize("eta_replay", [1.0, 2.0, 0.0])
def test_probabilities(eta_replay):
    p = (U + 1e-3) ** eta_replay
    assert np.allclose(filled(eta_replay=eta_replay).probabilities(), p / p.sum())


@pytest.mark.parametrize("beta_is", [1.0, 0.5])
def test_importance_weights_and_sampling(beta_is):
    buf = filled(beta_is=beta_is)
    p = (U + 1e-3) / (U + 1e-3).sum()
    w = (1 / (3 * p)) ** beta_is
    w = w / w.max()  # the settled debate (rarest draw) gets weight 1
    items, weights = buf.sample(20000, rng=0)
    picked = np.array([["settled", "mixed", "split"].index(t.question_id) for t in items])
    assert np.allclose(np.bincount(picked, minlength=3) / len(picked), p, atol=0.01)
    assert np.allclose(weights.numpy(), w[picked], rtol=1e-6)
    assert weights.dtype.is_floating_point and weights.max().item() <= 1.0


def test_sample_is_reproducible_and_keeps_behavior_logprobs():
    buf = filled()
    a, wa = buf.sample(8, rng=np.random.default_rng(3))
    b, wb = buf.sample(8, rng=np.random.default_rng(3))
    assert [t.question_id for t in a] == [t.question_id for t in b] and wa.tolist() == wb.tolist()
    assert a[0].turns[0][0].logprobs == [-0.5, -0.25]
    assert buf.sample(0, rng=0)[0] == []
    with pytest.raises(ValueError, match="empty replay buffer"):
        ReplayBuffer().sample(1, rng=0)


def test_capacity_evicts_oldest_and_replace_refreshes_questions():
    buf = ReplayBuffer(capacity=3, base_weights=BASE)
    buf.add([debate("settled#1"), debate("mixed#1"), debate("split#1"), debate("mixed#2")])
    assert [t.question_id for t in buf.items] == ["mixed#1", "split#1", "mixed#2"]
    buf.add([debate("mixed#1")], replace=True)  # re-run of a stored question replaces the old debate
    assert [t.question_id for t in buf.items] == ["split#1", "mixed#2", "mixed#1"]
    assert buf.question_ids() == ["split#1", "mixed#2", "mixed#1"]
    assert np.allclose(buf.priorities(), [U[2], U[1], U[1]])


def test_state_dict_round_trip_through_json():
    buf = filled(capacity=5, eta_replay=2.0, beta_is=0.5)
    state = json.loads(json.dumps(buf.state_dict()))
    other = ReplayBuffer()
    other.load_state_dict(state)
    assert (other.capacity, other.eta_replay, other.beta_is, other.base_weights) == (5, 2.0, 0.5, BASE)
    assert np.allclose(other.probabilities(), buf.probabilities())
    assert [t.to_dict() for t in other.items] == [t.to_dict() for t in buf.items]
    with pytest.raises(ValueError, match="missing"):
        other.load_state_dict({"items": []})


def test_state_keeps_the_trainers_logprobs_beside_the_trajectory_records():
    buf = filled()
    buf.items[1].turns[2][0].trainer_logprobs = [-0.75, -0.125]  # recorded by the loop before storing
    state = json.loads(json.dumps(buf.state_dict()))
    assert state["items"] == [t.to_dict() for t in buf.items]  # the trajectory file's records
    other = ReplayBuffer()
    other.load_state_dict(state)
    turns = [turn for t in other.items for row in t.turns for turn in row]
    assert other.items[1].turns[2][0].behavior_logprobs == [-0.75, -0.125]
    assert sum(turn.trainer_logprobs is not None for turn in turns) == 1
    assert other.items[1].turns[2][0].logprobs == [-0.5, -0.25]  # the engine's, as recorded
    # a state written before the trainer's log-probs were kept apart held them in the records' log-probs
    del state["trainer_logprobs"]
    state["items"][1]["turns"][2][0]["logprobs"] = [-0.75, -0.125]
    old = ReplayBuffer()
    old.load_state_dict(state)
    assert old.items[1].turns[2][0].behavior_logprobs == [-0.75, -0.125]


def test_bad_settings_are_rejected():
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(capacity=0)
    with pytest.raises(ValueError, match="base_weights"):
        ReplayBuffer(base_weights=(1.0, 1.0))


# a run's replay (RunReplay): its settings, its draw per iteration, the refresh -------------------------


def run_replay(calibration: dict, **settings):
    from udpo.config import TrainConfig
    from udpo.config.groups import AlgorithmArgs, RewardArgs
    from udpo.training.replay import RunReplay

    config = TrainConfig(replay=True, **settings)
    return RunReplay(config.group(AlgorithmArgs), config.group(RewardArgs), 11, calibration)


def test_replayed_count_makes_the_fraction_of_the_batch():
    from udpo.training.replay import replayed_count

    # 1 of 4 (3 fresh), 11 of 43 (32 fresh: 10.67 rounds to 11), 1 of 3 (2 fresh at 0.34: 1.03)
    assert [replayed_count(3, 0.25), replayed_count(32, 0.25), replayed_count(2, 0.34)] == [1, 11, 1]
    assert replayed_count(4, 0.5) == 4


def test_a_runs_buffer_takes_its_settings_and_the_calibrations_base_weights():
    calibration = {"base_weights": {"alpha_base": 0.5, "beta_base": 0.3}}  # gamma_base missing: 1/3
    replay = run_replay(calibration, replay_capacity=7, replay_eta=2.0, replay_beta=0.5, replay_fraction=0.4)
    assert (replay.capacity, replay.eta_replay, replay.beta_is, replay.fraction) == (7, 2.0, 0.5, 0.4)
    assert replay.base_weights == (0.5, 0.3, 1 / 3)
    given = run_replay(calibration, alpha_base=0.2, beta_base=0.2, gamma_base=0.6)
    assert given.base_weights == (0.2, 0.2, 0.6)  # explicit base weights win over the calibration's


def test_a_runs_update_batch_draws_after_the_refresh_and_leaves_the_fresh_debates_to_the_loop():
    from udpo.env.tasks.base import Question

    bases = {"alpha_base": BASE[0], "beta_base": BASE[1], "gamma_base": BASE[2]}
    settings = {"replay_fraction": 0.6, "replay_refresh_interval": 2, "replay_eta": 0.0}  # uniform draws
    replay = run_replay({"base_weights": bases}, **settings)
    questions = [Question(q, "q", "1") for q in ("split#1", "other", "mixed", "settled", "mixed#1")]
    asked, refreshed = [], []

    def again(qs, meta):
        asked.append(([q.id for q in qs], meta))
        refreshed.extend(debate(q.id) for q in qs)
        return list(refreshed)

    # iteration 1: nothing stored yet, nothing drawn; the loop stores the fresh debates after their update
    fresh = [debate("settled"), debate("mixed"), debate("split#1"), debate("mixed#1")]
    batch, weights, drawn = replay.update_batch(fresh, 1, questions, again)
    assert (batch, weights, drawn, asked) == (fresh, [1.0] * 4, 0, [])
    assert replay.items == []
    replay.add(fresh)
    # iteration 2: the refresh is due; the stored questions are debated again, in the questions' order,
    # their new debates replacing the stored ones; then 3 are drawn (0.6 of the update batch of 5), the
    # draw of the run's seed (11) and the iteration
    fresh = [debate("split"), debate("split#b")]
    batch, weights, drawn = replay.update_batch(fresh, 2, questions, again)
    assert asked == [
        (["split#1", "mixed", "settled", "mixed#1"], {"phase": "replay_refresh", "iteration": 2})
    ]
    twin = ReplayBuffer(eta_replay=0.0, base_weights=BASE)
    twin.add([debate(q) for q in asked[0][0]])
    expected, expected_weights = twin.sample(3, np.random.default_rng([11, 2, 7]))
    assert drawn == 3 and batch[:2] == fresh
    assert [t.question_id for t in batch[2:]] == [t.question_id for t in expected]
    assert all(any(t is r for r in refreshed) for t in batch[2:])  # drawn from the refreshed debates
    assert weights == [1.0, 1.0, *expected_weights.tolist()]
    assert [id(t) for t in replay.items] == [id(t) for t in refreshed]
    replay.add(fresh)
    assert [id(t) for t in replay.items] == [id(t) for t in [*refreshed, *fresh]]
