"""The calibration's ordering report (SPEC section 3, issue 39): each agent's reward for a unanimous wrong,
a correct split and an all-silent debate, and whether the split out-earns unanimous-wrong; in the run's
calibration.json, printed by ``udpo calibrate`` and shown by ``udpo report``. No model is loaded: the
warm-up debates are fixed answer matrices."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from train_helpers import TINY

from udpo.cli import main
from udpo.config import TrainConfig
from udpo.env.jsonl import write_json
from udpo.env.trajectory import Trajectory
from udpo.rewards import (
    REFERENCE_DEBATES,
    debate_metrics,
    ordering_from_dict,
    reference_debates,
    reward_ordering,
)
from udpo.training import calibration

#: agent 0 of issue 39's study, and a second agent whose lambda is large enough
STUDY = {
    "alpha": [0.822, 0.822],
    "beta": [0.843, 0.843],
    "gamma": [0.337, 0.337],
    "lambda_": [0.511, 1.5],
    "eta": [0.01, 0.01],
}
#: a model name the config accepts; nothing here loads it
MODEL = "smollm2-135m-instruct"
#: entropy of a 2:1 split (K = 2), the final round of the correct split at N = 3
H_2_1 = -(2 / 3 * math.log(2 / 3) + 1 / 3 * math.log(1 / 3)) / math.log(2)


def three_agents(values: dict[str, list[float]]) -> dict[str, list[float]]:
    """The first agent's coefficients for agents 0 and 1 and the second's for agent 2."""
    return {k: [v[0], v[0], v[1]] for k, v in values.items()}


def test_reference_rewards_by_hand():
    report = reward_ordering(three_agents(STUDY), rounds=2)
    a, b, g = 0.822, 0.843, 0.337
    split = a + b / 3 + g * (1 - (H_2_1 + 1) / 3)  # stable, one pair of three agrees, H, D = 1, L = 0
    assert report.rewards["unanimous_wrong"] == pytest.approx([a + b + g] * 3)  # 2.002
    assert report.rewards["correct_split"] == pytest.approx([split + 0.511, split + 0.511, split + 1.5])
    assert report.rewards["all_silent"] == pytest.approx([g / 3] * 3)  # r_sys = 1/3, nothing else
    assert round(report.rewards["correct_split"][0], 3) == 1.736
    assert round(report.rewards["all_silent"][0], 3) == 0.112
    assert report.split_beats_wrong.tolist() == [False, False, True]
    d = report.to_dict()
    assert d["split_beats_unanimous_wrong"] == [False, False, True] and (d["rounds"], d["scope"]) == (
        2,
        "trajectory",
    )
    again = ordering_from_dict(json.loads(json.dumps(d)))
    assert again.to_dict() == d
    lines = report.table().splitlines()
    assert "T = 2" in lines[0] and "NO" in lines[2] and lines[4].endswith("yes")
    with pytest.raises(ValueError, match="not a reward ordering record"):
        ordering_from_dict({"rounds": 2})


def test_task_only_coefficients_order_correctness_first():
    report = reward_ordering(
        {"alpha": [0.0] * 3, "beta": [0.0] * 3, "gamma": [0.0] * 3, "lambda_": [1.0] * 3}, 1
    )
    assert report.rewards["unanimous_wrong"].tolist() == [0.0] * 3
    assert report.rewards["correct_split"].tolist() == [1.0] * 3
    assert report.split_beats_wrong.all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 2), min_size=3, max_size=3))
def test_the_flag_is_specs_inequality_at_n_3(weights):
    beta, gamma, lambda_ = weights
    three = reward_ordering(
        {"alpha": [0.5] * 3, "beta": [beta] * 3, "gamma": [gamma] * 3, "lambda_": [lambda_] * 3}, 2
    )
    margin = lambda_ - (2 / 3 * beta + (H_2_1 + 1) / 3 * gamma)  # SPEC: lambda < (2/3) beta + 0.64 gamma
    if abs(margin) > 1e-9:
        assert bool(three.split_beats_wrong[0]) == (margin > 0)
    # N = 1: the one agent right or wrong, stable both times: only lambda tells them apart
    one = reward_ordering({"alpha": [0.5], "beta": [beta], "gamma": [gamma], "lambda_": [lambda_]}, 2)
    if lambda_ == 0 or lambda_ > 1e-9:
        assert bool(one.split_beats_wrong[0]) == (lambda_ > 0)


@pytest.mark.parametrize(("n", "right"), [(1, 1), (2, 1), (3, 2), (4, 3), (5, 3), (6, 4), (7, 4)])
def test_reference_debates_for_any_n(n, right):
    debates = reference_debates(n, rounds=3)
    assert list(debates) == list(REFERENCE_DEBATES)
    split = debates["correct_split"]
    assert [row[0] for row in split] == ["right"] * right + ["wrong"] * (n - right)
    assert all(len(set(row)) == 1 and len(row) == 4 for row in split)  # stable over rounds 0..3
    m = debate_metrics(list(debates.values()), ["right"] * 3)
    assert m.r_task.tolist() == [0.0, 1.0, 0.0]  # the split's vote is right, also at N = 2 (tie rule)
    assert m.loo_instability[1] == (0.5 if n == 2 else 0.0)
    assert debates["all_silent"] == [[None] * 4] * n and debates["unanimous_wrong"] == [["wrong"] * 4] * n
    with pytest.raises(ValueError, match="N >= 1"):
        reference_debates(0, 2)


def test_agent_scope_pays_the_dissenter_its_own_share():
    report = reward_ordering(three_agents(STUDY), rounds=2, scope="agent")
    split = report.rewards["correct_split"]
    # the dissenter (agent 2) disagrees with both peers in every round and is no pivot: r_inter_2 = 0
    assert split[2] == pytest.approx(0.822 + 0.337 * (1 - (H_2_1 + 1) / 3) + 1.5)
    assert split[0] == pytest.approx(0.822 + 0.843 / 2 + 0.337 * (1 - (H_2_1 + 1) / 3) + 0.511)


# --- in the run's calibration record, ``udpo calibrate`` and ``udpo report`` --------------------------
WARMUP = [  # N = 2, T = 1 (TINY's shape): the vote right, wrong, right
    (["4", "4"], ["4", "4"]),
    (["7", None], ["7", "8"]),
    (["3", "5"], ["3", "3"]),
]


def warmup_debate(questions, meta) -> list[Trajectory]:
    out = []
    for k, (first, last) in enumerate(WARMUP):
        answers = [[first[i], last[i]] for i in range(2)]
        vote = debate_metrics([answers], keys=[f"w{k}"]).predictions[0]
        out.append(
            Trajectory(f"w{k}", "?", "4" if k < 2 else "3", answers, vote, vote == ("4" if k < 2 else "3"))
        )
    return out


def calibrate(config: TrainConfig, warmup_set, debate, run_dir: Path) -> tuple[dict, list[Trajectory]]:
    """The trainer's call of :func:`udpo.training.calibration.calibrate` for ``config`` (main process)."""
    return calibration.calibrate(
        config, config, warmup_set, debate, run_dir, True, n_agents=config.n_agents, rounds=config.rounds
    )


def run_record(tmp_path: Path, **overrides) -> dict:
    config = TrainConfig(
        **{**TINY, "model": MODEL, "warmup_fraction": 0.1, "output_dir": str(tmp_path), **overrides}
    )
    record, _ = calibrate(config, ["q"] * 3, warmup_debate, tmp_path)
    return record


def test_the_run_record_reports_the_final_coefficients(tmp_path):
    record = run_record(tmp_path / "plain")
    ordering = record["ordering"]
    assert ordering == reward_ordering(record["coefficients"], rounds=1).to_dict()
    assert len(ordering["split_beats_unanimous_wrong"]) == 2
    # explicit coefficients and ablations are applied first: what the run trains with is reported
    ablated = run_record(tmp_path / "wo", ablations=["inter", "sys"], lambda_=[0.1])
    assert ablated["ordering"]["reward"]["unanimous_wrong"] == pytest.approx(ablated["coefficients"]["alpha"])
    assert ablated["ordering"]["reward"]["all_silent"] == [0.0, 0.0]
    text = calibration.describe(record)
    assert "reward of reference debates (T = 1, scope trajectory)" in text and "correct_split" in text


def test_udpo_calibrate_prints_and_writes_the_ordering(tmp_path, monkeypatch, capsys):
    class ScriptedTrainer:
        """What ``udpo calibrate`` uses of a Trainer, with fixed warm-up debates instead of a model."""

        def __init__(self, config):
            self.config, self.run_dir, self.main = config, Path(config.output_dir), True
            self.rollouts = SimpleNamespace(sync_adapters=lambda iteration: None)

        def calibrate(self):
            return calibrate(self.config, ["q"] * 3, warmup_debate, self.run_dir)

        def close(self):
            pass

    monkeypatch.setattr("udpo.training.trainer.Trainer", ScriptedTrainer)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**TINY, "model": MODEL, "warmup_fraction": 0.1}))
    out = tmp_path / "cal"
    assert main(["calibrate", "--config", str(recipe), "--output_dir", str(out)]) == 0
    printed = capsys.readouterr()
    record = json.loads((out / "calibration.json").read_text())
    assert "reward of reference debates (T = 1" in printed.err
    for flag in record["ordering"]["split_beats_unanimous_wrong"]:
        assert ("yes" if flag else "NO: a unanimous wrong team earns more") in printed.err


def test_the_report_page_shows_the_ordering(tmp_path):
    run = tmp_path / "train"
    (run / "eval").mkdir(parents=True)
    write_json(run / "config.json", {"task": "arithmetic", "n_agents": 3, "rounds": 2})
    record = {"coefficients": three_agents(STUDY), "explicit": [], "ablations": []}
    record["ordering"] = reward_ordering(record["coefficients"], rounds=2).to_dict()
    write_json(run / "calibration.json", record)
    out = tmp_path / "report.html"
    assert main(["report", str(run), "--out", str(out)]) == 0
    page = out.read_text()
    assert "reward of reference debates (T = 2, scope trajectory)" in page
    assert "<th>unanimous wrong</th><td>2.002</td>" in page and "<th>all silent</th><td>0.112</td>" in page
    assert (
        "<th>correct split out-earns unanimous wrong</th><td><b>no</b></td><td><b>no</b></td><td>yes</td>"
        in page
    )
    assert "earns agent(s) 0, 1 at least as much as a correct but split one" in page
