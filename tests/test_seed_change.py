"""The pre-registered analysis (docs/lab/preregistration.md): each seed's change after - before on the same
problems, a t-interval over seeds and a bootstrap over seeds and problems, by hand, and in ``udpo compare``'s
tables and figure when every seed evaluated the same problems."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image
from test_compare import finished_run, write_compare

from udpo.study.intervals import seed_change
from udpo.study.plan import CompareConfig
from udpo.study.runner import run_compare
from udpo.study.seed_change_plot import seed_change_figure
from udpo.study.tables import SEED_CHANGES_PLOT


def test_t_interval_over_the_seeds_changes_by_hand():
    before = np.zeros((4, 3))
    after = np.array([[0.1] * 3, [0.2] * 3, [0.3] * 3, [0.4] * 3])
    c = seed_change(before, after, n_resamples=2000)
    assert c.per_seed == pytest.approx((0.1, 0.2, 0.3, 0.4))
    assert c.delta == pytest.approx(0.25)
    half = 3.182446305284263 * np.std([0.1, 0.2, 0.3, 0.4], ddof=1) / 2  # t_{3, 0.975} sd / sqrt(4)
    assert (c.t_low, c.t_high) == pytest.approx((0.25 - half, 0.25 + half))
    assert (c.n_seeds, c.n_questions, c.before, c.after) == (4, 3, 0.0, pytest.approx(0.25))


def test_the_bootstrap_resamples_seeds_and_problems():
    # seeds differ, problems do not: only drawing seeds moves the statistic (two seeds: 0, 1/2 or 1)
    by_seed = seed_change(np.zeros((2, 5)), np.array([[0.0] * 5, [1.0] * 5]), n_resamples=4000)
    assert (by_seed.boot_low, by_seed.boot_high) == (0.0, 1.0)
    # problems differ, seeds do not: the t-interval has no width, the bootstrap does
    by_problem = seed_change(np.zeros((3, 4)), np.tile([0.0, 0.0, 1.0, 1.0], (3, 1)), n_resamples=4000)
    assert by_problem.t_low == pytest.approx(0.5) and by_problem.t_high == pytest.approx(0.5)
    assert by_problem.boot_low < 0.25 and by_problem.boot_high > 0.75
    # nothing varies: a point
    flat = seed_change(np.zeros((3, 4)), np.full((3, 4), 0.5), n_resamples=500)
    assert (flat.boot_low, flat.boot_high) == (0.5, 0.5)
    one = seed_change(np.zeros((1, 2)), np.ones((1, 2)), n_resamples=100)
    assert one.t_low is None and one.t_high is None
    with pytest.raises(ValueError, match="one shape"):
        seed_change(np.zeros((2, 3)), np.zeros((2, 4)))


@pytest.mark.slow
def test_compare_adds_the_seed_analysis_when_seeds_share_their_problems(tmp_path):
    config = CompareConfig.load(write_compare(tmp_path, methods=["standard_mad", "udpo"], seeds=[0, 1]))
    finished_run(config.run_dir("udpo", 0), "udpo", [True, False, False, False], [True, True, True, False])
    finished_run(config.run_dir("udpo", 1), "udpo", [False, False, False, False], [True, False, False, False])
    results = run_compare(config, train=lambda tc: None, progress=False)
    study = results["methods"]["udpo"]["accuracy"]["seed_change"]
    assert study["per_seed"] == pytest.approx([0.5, 0.25]) and study["delta"] == pytest.approx(0.375)
    assert results["methods"]["standard_mad"]["accuracy"]["seed_change"]["delta"] == 0.0
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| udpo | accuracy | +0.375 | [" in table and "+0.500, +0.250 |" in table
    assert json.loads((tmp_path / "out" / "results.json").read_text())["methods"]["udpo"]["accuracy"][
        "seed_change"
    ]
    with Image.open(tmp_path / "out" / SEED_CHANGES_PLOT) as png:
        assert png.format == "PNG" and png.width > 600


def test_the_seed_change_figure_draws_each_seed_the_mean_and_both_intervals():
    change = np.array([[0.5, 0.0, 0.25, 0.25], [0.25, 0.25, 0.0, 0.0], [0.0, 0.5, 0.5, 0.25]])
    c = seed_change(np.zeros_like(change), change, n_resamples=500).to_dict()
    lower = seed_change(np.zeros_like(change), -change, n_resamples=500).to_dict()
    fig = seed_change_figure(
        {"udpo": {"accuracy": c, "wrong_majority": lower}, "mappo": {"accuracy": lower, "wrong_majority": c}}
    )
    acc, guard = fig.axes
    assert [t.get_text() for t in acc.get_yticklabels()] == ["udpo", "mappo"]
    assert "higher is better" in acc.get_title() and "lower is better" in guard.get_title()
    lines = {tuple(line.get_xdata()): line for line in acc.get_lines()}
    assert tuple(c["per_seed"]) in lines and tuple(lower["per_seed"]) in lines  # one dot per seed
    assert (c["t_low"], c["t_high"]) in lines and (c["boot_low"], c["boot_high"]) in lines
    assert (c["delta"],) in lines and (0.0, 0.0) in lines  # the mean and the line at zero
    assert pytest.approx(c["per_seed"]) == [0.25, 0.125, 0.3125]


def test_questions_that_repeat_a_problem_are_resampled_together():
    # one seed, ten questions posing two problems (five times each): right on one, wrong on the other
    change = np.array([[1.0] * 5 + [0.0] * 5])
    problems = ["2 + 2"] * 5 + ["3 * 3"] * 5
    clustered = seed_change(np.zeros_like(change), change, n_resamples=4000, clusters=problems)
    assert clustered.n_questions == 2 and clustered.delta == pytest.approx(0.5)
    assert (clustered.boot_low, clustered.boot_high) == (0.0, 1.0)  # draws of 2 problems: 0, 1/2 or 1
    naive = seed_change(np.zeros_like(change), change, n_resamples=4000)
    assert naive.n_questions == 10 and naive.boot_low >= 0.1 and naive.boot_high <= 0.9
    with pytest.raises(ValueError, match="one key per question"):
        seed_change(np.zeros_like(change), change, clusters=problems[:3])
