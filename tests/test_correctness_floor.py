"""SPEC section 4's ``correctness_floor`` (issue 49): ``lambda*_i``, the task weight above which a correct split
out-earns a unanimous wrong debate for agent i, checked against hand-computed cases; each ``lambda_i`` raised
to ``(1 + m) lambda*_i``; the run's record keeps both values; ``udpo calibrate`` (on a tiny model) and
``udpo report`` show them. (The ``udpo_floor`` method of a study: test_compare.py.)"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from train_helpers import REPO, TINY
from train_helpers import digit_model as build_digit_model

from udpo.cli import main
from udpo.config import ConfigError, TrainConfig
from udpo.env.jsonl import write_json
from udpo.rewards import (
    agent_rewards,
    correctness_floor,
    correctness_threshold,
    debate_metrics,
    reward_ordering,
)
from udpo.rewards.ordering import RIGHT, reference_debates, split_seatings
from udpo.training import calibration

#: the pilot's shared calibration (N = 3, T = 2, trajectory scope), committed with its plan
PILOT = REPO / "docs" / "lab" / "results" / "pilot_udpo" / "calibration.json"
#: a model name the config accepts; the tests that use it load no model
MODEL = "smollm2-135m-instruct"

# N = 3, T = 2, the correct split [right, right, wrong] in rounds 0..2 (SPEC sections 2 and 3):
#   r_intra = 1 (nobody changes);  C_t = 2/3 in every round (2 of 3 pairs disagree), so r_inter = 1/3;
#   final answers p = (2/3, 1/3), K = 2: H = -(2/3 ln 2/3 + 1/3 ln 1/3) / ln 2 = log2(3) - 2/3;
#   D = 1; L = 0 (removing a right agent leaves a 1-1 tie the vote gives to the right answer: under the
#   key "" of the reference debates sha256("\nright") < sha256("\nwrong"));
#   U_sys = (H + D + L) / 3 = (1/3 + log2 3) / 3 = 1/9 + log2(3)/3 = 0.63943..., r_sys = 1 - U_sys.
# The unanimous wrong debate is certain: r_intra = r_inter = r_sys = 1. With lambda = 0:
#   lambda* = R0(unanimous_wrong) - R0(correct_split) = beta (1 - 1/3) + gamma U_sys
#           = (2/3) beta + (1/9 + log2(3)/3) gamma;   alpha drops out.
U_SYS_2_1 = 1 / 9 + math.log2(3) / 3
# Scope agent, N = 3, T = 2: r_inter_i = 1 - (share of i's peers that disagree), L_i = [removing i flips the
# vote]. The vote does not depend on the seats, so L_i = 0 in every seating and each agent's worst seating
# is the one where it is the dissenter: both peers disagree (r_inter_i = 0): lambda* = beta + U_SYS_2_1
# gamma. (Under the old rule, ties to the earliest seat, a right agent could be pivotal: removing it left a
# tie the vote gave to the wrong answer.)


def coefficients(n: int, **values: float) -> dict[str, list[float]]:
    base = {"alpha": 0.4, "beta": 0.0, "gamma": 0.0, "lambda_": 0.0, "eta": 0.01, **values}
    return {k: [v] * n for k, v in base.items()}


@pytest.mark.parametrize(("alpha", "beta", "gamma"), [(0.9, 1.04, 0.18), (0.0, 0.3, 2.0), (1.0, 0.0, 0.0)])
def test_the_n3_t2_trajectory_threshold_by_hand(alpha, beta, gamma):
    assert round(U_SYS_2_1, 3) == 0.639  # SPEC's example, to three decimals
    star = correctness_threshold(coefficients(3, alpha=alpha, beta=beta, gamma=gamma), rounds=2)
    assert star == pytest.approx([2 / 3 * beta + U_SYS_2_1 * gamma] * 3, abs=1e-9)


def test_the_pilots_calibration_through_the_runs_calibration(tmp_path):
    """The committed pilot calibration (issue 49: lambda 0.50 / 0.55 / 0.55 below thresholds about 0.81 /
    0.78 / 0.77), read as a study run reads it (calibration_file), with the floor on."""
    pilot = json.loads(PILOT.read_text())
    beta, gamma, before = (np.array(pilot["coefficients"][k]) for k in ("beta", "gamma", "lambda_"))
    assert pilot["ordering"]["split_beats_unanimous_wrong"] == [False, False, False]
    record = run_record(tmp_path, n_agents=3, rounds=2, calibration_file=str(PILOT), correctness_floor=True)
    floor = record["correctness_floor"]
    star = 2 / 3 * beta + U_SYS_2_1 * gamma
    assert floor["lambda_star"] == pytest.approx(star, abs=1e-9)
    assert np.round(floor["lambda_star"], 2).tolist() == [0.81, 0.78, 0.77]
    assert floor["margin"] == 0.1 and floor["lambda_before"] == before.tolist()
    assert floor["lambda_after"] == pytest.approx(1.1 * star, abs=1e-12)
    assert record["coefficients"]["lambda_"] == floor["lambda_after"]
    # everything else as the pilot calibrated it; the ordering report of the floored coefficients
    assert {k: v for k, v in record["coefficients"].items() if k != "lambda_"} == {
        k: v for k, v in pilot["coefficients"].items() if k != "lambda_"
    }
    assert record["ordering"] == reward_ordering(record["coefficients"], rounds=2).to_dict()
    assert record["ordering"]["split_beats_unanimous_wrong"] == [True, True, True]
    assert calibration.flat_coefficients(record)["lambda_before/agent_1"] == before[1]
    # a floored record is no calibration to share: a run without the floor would train on raised lambdas
    shared = tmp_path / "floored.json"
    write_json(shared, record)
    with pytest.raises(ConfigError, match="raised by correctness_floor"):
        run_record(tmp_path, n_agents=3, rounds=2, calibration_file=str(shared))
    # off by default: the pilot's lambdas as committed
    plain = run_record(tmp_path, n_agents=3, rounds=2, calibration_file=str(PILOT))
    assert "correctness_floor" not in plain and plain["coefficients"]["lambda_"] == before.tolist()


def test_agent_scope_takes_the_worst_seating_of_the_dissenter():
    assert hashlib.sha256(b"\nright").hexdigest() < hashlib.sha256(b"\nwrong").hexdigest()
    assert [[row[0] for row in a] for a in split_seatings(3, 2)] == [
        ["wrong", "right", "right"],
        ["right", "wrong", "right"],
        ["right", "right", "wrong"],
    ]
    assert [[row[0] for row in a] for a in split_seatings(2, 1)] == [["wrong", "right"], ["right", "wrong"]]
    for n, t in (
        (2, 1),
        (3, 2),
        (5, 1),
    ):  # every seating votes right, with L_i the same for every right agent
        seatings = split_seatings(n, t)
        m = debate_metrics(seatings, [RIGHT] * len(seatings))
        assert m.r_task.tolist() == [1.0] * len(seatings)
        assert len(set(m.loo_instability.tolist())) == 1
    for beta, gamma in [(1.0, 0.1), (0.2, 1.0)]:
        star = correctness_threshold(coefficients(3, beta=beta, gamma=gamma), rounds=2, scope="agent")
        assert star == pytest.approx([beta + U_SYS_2_1 * gamma] * 3, abs=1e-9)
        # the reference seating alone would give the right agents 0 and 1 only beta / 2 + U_SYS_2_1 gamma
        assert star[0] > beta / 2 + U_SYS_2_1 * gamma + 1e-3
    # floored, the split out-earns the unanimous wrong debate for every agent in every seating
    floored = coefficients(3, alpha=0.3, beta=0.8, gamma=0.6)
    floored["lambda_"] = correctness_floor(floored, 2, "agent")["lambda_after"]
    seatings = split_seatings(3, 2)
    debates = [reference_debates(3, 2)["unanimous_wrong"], *seatings]
    weights = {k: floored[k] for k in ("alpha", "beta", "gamma", "lambda_")}
    rewards = agent_rewards(debate_metrics(debates, [RIGHT] * len(debates)), **weights, scope="agent")
    assert (rewards[1:] > rewards[0]).all()
    assert reward_ordering(floored, 2, "agent").split_beats_wrong.all()


def test_n2_t1_threshold_by_hand():
    # the correct split [right, wrong]: r_intra = 1, the pair disagrees in both rounds (r_inter = 0);
    # H = 1, D = 1, L = 1/2 (removing agent 0 leaves the wrong answer): U_sys = 5/6
    star = correctness_threshold(coefficients(2, beta=0.7, gamma=0.3), rounds=1)
    assert star == pytest.approx([0.7 + 5 / 6 * 0.3] * 2, abs=1e-9)


def test_the_floor_leaves_lambda_where_it_is_enough_or_where_nothing_is_needed():
    # task_only: alpha = beta = gamma = 0, so lambda* = 0: nothing changes
    task_only = coefficients(3, alpha=0.0, lambda_=1.0)
    floor = correctness_floor(task_only, rounds=2)
    assert floor["lambda_star"] == [0.0] * 3 and floor["lambda_after"] == floor["lambda_before"] == [1.0] * 3
    # lambda above (1 + m) lambda* stays; below it rises to (1 + m) lambda* exactly (m = 0.25 here)
    mixed = {**coefficients(3, beta=0.6, gamma=0.5), "lambda_": [2.0, 0.1, 0.0]}
    star = 0.4 + 0.5 * U_SYS_2_1
    floor = correctness_floor(mixed, rounds=2, margin=0.25)
    assert floor["lambda_after"] == pytest.approx([2.0, 1.25 * star, 1.25 * star], abs=1e-12)
    assert floor["lambda_before"] == [2.0, 0.1, 0.0] and floor["margin"] == 0.25
    with pytest.raises(ValueError, match="margin must be a finite number >= 0"):
        correctness_floor(mixed, rounds=2, margin=-0.1)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"correctness_floor_margin": -0.1},
            "correctness_floor_margin must be a finite number >= 0, got -0.1",
        ),
        ({"correctness_floor_margin": math.nan}, "correctness_floor_margin must be a finite number >= 0"),
        ({"correctness_floor": True, "algorithm": "mappo"}, "correctness_floor belong to udpo"),
    ],
)
def test_bad_floor_settings_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**{**TINY, "model": MODEL, **overrides})


def run_record(tmp_path: Path, **overrides) -> dict:
    """The calibration record of a run of ``overrides`` that reads its coefficients from a file (no model,
    no warm-up debates), as the trainer builds it."""
    config = TrainConfig(**{**TINY, "model": MODEL, "output_dir": str(tmp_path / "run"), **overrides})
    record, debates = calibration.calibrate(
        config, config, [], None, tmp_path, True, n_agents=config.n_agents, rounds=config.rounds
    )
    assert debates == []
    return record


@pytest.fixture(scope="module")
def digit_model(tokenizer_path, tmp_path_factory) -> str:
    return build_digit_model(tokenizer_path, tmp_path_factory)


def test_udpo_calibrate_floors_and_prints_both_lambdas(digit_model, tmp_path, capsys):
    """``udpo calibrate`` on a tiny model (N = 2, T = 1): warm-up debates, calibration, the floor; the record
    and the printout hold lambda before and after."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**TINY, "model": digit_model, "warmup_fraction": 0.1}))
    out = tmp_path / "cal"
    args = ["calibrate", "--config", str(recipe), "--output_dir", str(out), "--correctness_floor", "true"]
    assert main([*args, "--correctness_floor_margin", "0.5"]) == 0
    printed = capsys.readouterr().err
    record = json.loads((out / "calibration.json").read_text())
    floor, coefs = record["correctness_floor"], record["coefficients"]
    # N = 2, T = 1 (test_n2_t1_threshold_by_hand): lambda* = beta + (5/6) gamma
    star = np.array(coefs["beta"]) + 5 / 6 * np.array(coefs["gamma"])
    assert floor["lambda_star"] == pytest.approx(star, abs=1e-9) and floor["margin"] == 0.5
    lambda_base = 1 / (1 + 1.5 * np.array(record["profile"]["u_sys"]))  # SPEC section 4, kappa 1.5
    assert floor["lambda_before"] == pytest.approx(lambda_base, abs=1e-12)
    assert coefs["lambda_"] == floor["lambda_after"]
    assert floor["lambda_after"] == pytest.approx(np.maximum(lambda_base, 1.5 * star), abs=1e-12)
    assert record["ordering"]["split_beats_unanimous_wrong"] == [True, True]
    assert "correctness floor, margin 0.5" in printed
    for label, values in (("before", floor["lambda_before"]), ("after", floor["lambda_after"])):
        assert f"  {label:8s}" + " ".join(f"{v:7.4f}" for v in values) in printed.splitlines()


def test_the_report_page_shows_lambda_before_and_after(tmp_path, monkeypatch):
    run = tmp_path / "train"
    (run / "eval").mkdir(parents=True)
    write_json(run / "config.json", {"task": "arithmetic", "n_agents": 3, "rounds": 2})
    write_json(
        run / "calibration.json",
        run_record(tmp_path, n_agents=3, rounds=2, calibration_file=str(PILOT), correctness_floor=True),
    )
    out = tmp_path / "report.html"
    assert main(["report", str(run), "--out", str(out)]) == 0
    page = out.read_text()
    assert "<caption>correctness floor: lambda raised to (1 + 0.100) lambda* where lower</caption>" in page
    assert "<th>lambda* (the split wins above it)</th><td>0.811</td><td>0.779</td><td>0.775</td>" in page
    assert "<th>lambda before the floor</th><td>0.496</td><td>0.545</td><td>0.552</td>" in page
    assert "<th>lambda after the floor</th><td>0.893</td><td>0.857</td><td>0.852</td>" in page
    assert "earns agent(s)" not in page  # no ordering warning: the split wins for every agent
