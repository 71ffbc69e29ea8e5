"""``udpo compare``: every method gets the same budget, the table's numbers come from the runs' evaluations,
finished runs are kept, and a real compare of three methods runs end to end."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from study_helpers import finished_run, no_diagnosis_plots
from train_helpers import TINY, read_jsonl

from udpo.config import ConfigError, TrainConfig
from udpo.env.trajectory import Trajectory
from udpo.study.plan import METHODS, TASK_ONLY, CompareConfig, check_budgets
from udpo.study.runner import run_compare


def write_compare(tmp_path: Path, model: str = "smollm2-135m-instruct", **config) -> Path:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**TINY, "model": model}))
    path = tmp_path / "compare.yaml"
    path.write_text(yaml.safe_dump({"recipe": "recipe.yaml", "output_dir": str(tmp_path / "out"), **config}))
    return path


def test_every_method_gets_the_same_budget(tmp_path):
    config = CompareConfig.load(write_compare(tmp_path, seeds=[3, 4], settings={"max_iterations": 5}))
    assert config.methods == list(METHODS) and config.recipe == str(tmp_path / "recipe.yaml")
    for seed in config.seeds:
        configs = {m: config.train_config(m, seed) for m in config.trained()}
        check_budgets(configs)
        for method, tc in configs.items():
            assert tc.seed == seed and tc.max_iterations == 5
            assert tc.output_dir == str(tmp_path / "out" / method / f"seed_{seed}")
            # only what defines the method (and where it writes) differs from UDPO's config
            differ = {
                f for f in TrainConfig.__dataclass_fields__ if getattr(tc, f) != getattr(configs["udpo"], f)
            }
            # (and, shared_start, whether it evaluates iteration 0: the first method's is Standard MAD;
            # task_only's reward coefficients, coin_control's reward, which ignores the answer, and
            # udpo_floor's correctness floor)
            defining = {"algorithm", "ablations", "output_dir", "run_name", "eval_at_start"}
            own = {
                "task_only": set(TASK_ONLY),
                "coin_control": {*TASK_ONLY, "task_reward"},
                "udpo_floor": {"correctness_floor"},
            }.get(method, set())
            assert differ <= defining | own, (method, differ)
            assert tc.eval_at_start == (method == "mappo")
    assert config.train_config("udpo_wo_sys", 3).ablations == ["sys"]
    assert config.train_config("rmaac", 3).algorithm == "rmaac"
    assert config.train_config("udpo_floor", 3).correctness_floor
    a, b = config.train_config("udpo", 3), config.train_config("mappo", 3)
    b.max_iterations = 6
    with pytest.raises(ConfigError, match="differ in budget settings"):
        check_budgets({"udpo": a, "mappo": b})


def test_eval_seed_per_seed_pairs_each_seeds_methods_and_varies_across_seeds(tmp_path):
    settings = {"eval_seed": 10}
    paired = CompareConfig.load(
        write_compare(tmp_path, seeds=[0, 3], settings=settings, eval_seed_per_seed=True)
    )
    for seed in paired.seeds:
        configs = {m: paired.train_config(m, seed) for m in paired.trained()}
        check_budgets(configs)  # every method of a seed samples its evaluations alike
        assert {tc.eval_seed for tc in configs.values()} == {10 + seed}
    shared = CompareConfig.load(write_compare(tmp_path, seeds=[0, 3], settings=settings))
    assert {shared.train_config("udpo", s).eval_seed for s in shared.seeds} == {10}


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"methods": ["standard_mad"]}, "at least one trained method"),
        ({"methods": ["udpo", "ppo"]}, "unknown method"),
        ({"seeds": [0, 0]}, "must not repeat"),
        ({"method_settings": {"mappo": {"max_tokens": 64}}}, "fix the method or its budget"),
        ({"method_settings": {"task_only": {"lambda_": [0.5]}}}, "fix the method or its budget"),
        ({"method_settings": {"udpo_floor": {"correctness_floor": False}}}, "fix the method or its budget"),
        ({"settings": {"correctness_floor": True}}, "set by compare itself"),
        ({"settings": {"seed": 1}}, "set by compare itself"),
        ({"colour": "red"}, "unknown key"),
    ],
)
def test_bad_compare_configs_are_refused(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        CompareConfig.load(write_compare(tmp_path, **extra))


def test_compare_reads_its_recipe_as_training_does(tmp_path, monkeypatch):
    """The recipe is read by training's reader: each method's config is what ``udpo train --config
    RECIPE`` reads but for what compare sets, and the recipe's env: is set for the runs, as training sets
    it (it was dropped)."""
    from udpo.config import parse_config

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("UDPO_COMPARE_TEST", "before")  # restored after the test
    recipe = tmp_path / "recipe.yaml"
    values = {**TINY, "learning_rate": "5e-4", "env": {"UDPO_COMPARE_TEST": "from the recipe"}}
    recipe.write_text("\ufeff" + yaml.safe_dump(values), encoding="utf-8")  # a BOM, a number as text
    path = tmp_path / "compare.yaml"
    path.write_text(yaml.safe_dump({"recipe": "recipe.yaml", "methods": ["udpo", "mappo"], "seeds": [0]}))
    config = CompareConfig.load(path)
    assert os.environ["UDPO_COMPARE_TEST"] == "from the recipe"
    trained = parse_config(["--config", str(recipe)])
    for method in config.trained():
        tc = config.train_config(method, 0)
        assert tc.learning_rate == 5e-4
        differ = {f for f in TrainConfig.__dataclass_fields__ if getattr(tc, f) != getattr(trained, f)}
        assert differ <= {"algorithm", "ablations", "seed", "output_dir", "run_name", "eval_at_start"}, differ

    seen = []

    class Stop(Exception):
        pass

    def train(tc):
        seen.append((tc.algorithm, os.environ.get("UDPO_COMPARE_TEST")))
        raise Stop

    monkeypatch.setenv("UDPO_COMPARE_TEST", "before")
    config = CompareConfig.load(path)
    with pytest.raises(Stop):
        run_compare(config, train=train, progress=False)
    assert seen == [("udpo", "from the recipe")]


@pytest.mark.parametrize(
    "compare, recipe, message",
    [
        ("recipe: recipe.yaml\nseeds: &s [0]\nsettings: {max_iterations: *s}\n", None, "YAML aliases"),
        ("recipe: recipe.yaml\n", "n_agents: &n 2\nrounds: *n\n", "recipe.yaml:2: YAML aliases"),
        ("recipe: recipe.yaml\n", "n_agnets: 2\n", "did you mean 'n_agents'"),
        (
            "recipe: recipe.yaml\nsettings: {learning_rat: 0.1}\n",
            None,
            "settings: unknown .* 'learning_rate'",
        ),
        ("recipe: recipe.yaml\nmethod_settings: {udpo: {etaa: 1}}\n", None, "method_settings.udpo: unknown"),
        ("recipe: recipe.yaml\nsettings: {env: {A: 1}}\n", None, "env: belongs in the recipe"),
    ],
)
def test_compare_configs_are_checked_as_recipes_are(tmp_path, compare, recipe, message):
    """The compare config and its recipe answer as a training recipe does: YAML aliases refused (the
    compare config's were accepted), unknown keys named with the closest field (settings: gave a
    TypeError), at load."""
    (tmp_path / "recipe.yaml").write_text(recipe if recipe is not None else yaml.safe_dump(TINY))
    path = tmp_path / "compare.yaml"
    path.write_text(compare)
    with pytest.raises(ConfigError, match=message):
        CompareConfig.load(path)


def test_tables_come_from_the_final_evaluations_and_finished_runs_are_kept(tmp_path, monkeypatch):
    no_diagnosis_plots(monkeypatch)
    config = CompareConfig.load(
        write_compare(
            tmp_path,
            methods=["standard_mad", "udpo", "mappo"],
            seeds=[0],
            shared_start=False,
            bootstrap_resamples=200,  # the machinery, not the numbers
        )
    )
    start = [True, False, False, False]
    finished_run(config.run_dir("udpo", 0), "udpo", start, [True, True, True, False])
    finished_run(config.run_dir("mappo", 0), "mappo", start, [True, False, True, False])

    def must_not_train(tc):
        raise AssertionError(f"{tc.output_dir} was done and trained again")

    results = run_compare(config, train=must_not_train, progress=False)
    acc = {m: results["methods"][m]["accuracy"] for m in config.methods}
    assert acc["standard_mad"]["mean"] == pytest.approx(0.25)
    assert acc["udpo"]["mean"] == pytest.approx(0.75) and acc["udpo"]["change"] == pytest.approx(0.5)
    assert acc["mappo"]["mean"] == pytest.approx(0.5) and acc["mappo"]["change"] == pytest.approx(0.25)
    assert acc["udpo"]["low"] <= 0.75 <= acc["udpo"]["high"]
    out = tmp_path / "out"
    table = (out / "table.md").read_text()
    assert "| udpo | 0.750 [" in table and "+0.500 (intervals: next table)" in table
    assert table.splitlines()[0].endswith("| accuracy per seed |")
    assert table.splitlines()[3].endswith("| 0.750 |")  # udpo's one seed
    rows = list(csv.DictReader((out / "table.csv").open()))
    assert {(r["method"], r["metric"]) for r in rows} >= {("mappo", "u_sys"), ("standard_mad", "accuracy")}
    budget = list(csv.DictReader((out / "budget.csv").open()))
    assert [(r["method"], r["debates"], r["optimizer_steps"]) for r in budget] == [
        ("udpo", "2", "1"),
        ("mappo", "2", "1"),
    ]
    gains = json.loads((out / "diagnosis" / "summary.json").read_text())
    assert "standard_mad" in json.dumps(gains)
    assert (out / "runs" / "mappo_seed0" / "run.json").exists()  # each finished run's record
    # a method whose iteration 0 differs did not start from the same team on the same questions
    finished_run(config.run_dir("mappo", 0), "mappo", [True, True, False, False], [True, False, True, False])
    shutil.rmtree(config.record_dir("mappo", 0))  # a record stands for its run: write it again
    with pytest.raises(ValueError, match="iteration-0 evaluations of udpo and mappo differ"):
        run_compare(config, train=must_not_train, progress=False)


def test_the_plans_comparisons_pair_each_seeds_arms(tmp_path, monkeypatch):
    no_diagnosis_plots(monkeypatch)
    config = CompareConfig.load(
        write_compare(
            tmp_path,
            methods=["standard_mad", "task_only", "udpo"],
            seeds=[0, 1],
            comparisons=[["udpo", "task_only"]],
            bootstrap_resamples=200,
        )
    )
    start = [False] * 4
    after = {  # udpo - task_only: +0.25 in seed 0 (0.75 - 0.5), +0.5 in seed 1 (1.0 - 0.5)
        ("task_only", 0): [True, True, False, False],
        ("udpo", 0): [True, True, True, False],
        ("task_only", 1): [True, False, True, False],
        ("udpo", 1): [True, True, True, True],
    }
    for (method, seed), correct in after.items():
        finished_run(config.run_dir(method, seed), method, start, correct, seed=seed)
    results = run_compare(config, train=lambda tc: None, progress=False)
    c = results["comparisons"]["udpo - task_only"]["accuracy"]
    assert c["per_seed"] == pytest.approx([0.25, 0.5]) and c["delta"] == pytest.approx(0.375)
    assert c["t_low"] < 0.375 < c["t_high"]
    table = (tmp_path / "out" / "table.md").read_text()
    assert "| udpo - task_only | accuracy | +0.375 |" in table
    assert "composition" in table and "cut_share" in table  # the answer-length table and columns
    with pytest.raises(ConfigError, match="comparisons"):
        CompareConfig.load(
            write_compare(tmp_path, methods=["standard_mad", "udpo"], comparisons=[["udpo", "x"]])
        )


def test_task_only_trains_udpo_on_the_correctness_reward_alone(tmp_path, monkeypatch):
    """task_only (SPEC section 3): alpha = beta = gamma = 0 and lambda = 1 for every agent, whatever the
    recipe and settings give; eta is calibrated as UDPO's. Compare accepts it and tabulates it."""
    from udpo.algorithms.udpo import Coefficients, compute_rewards
    from udpo.training import calibration

    no_diagnosis_plots(monkeypatch)

    path = write_compare(
        tmp_path,
        methods=["standard_mad", "udpo", "task_only"],
        seeds=[0],
        settings={"alpha": [0.7]},
        bootstrap_resamples=200,
    )
    config = CompareConfig.load(path)
    tc = config.train_config("task_only", 0)
    assert (tc.algorithm, tc.ablations, tc.alpha) == ("udpo", [], [0.0])
    assert config.train_config("udpo", 0).alpha == [0.7]
    warmup = [
        Trajectory(f"w{k}", "?", "4", [["4", "4"], [a, a]], "4", True) for k, a in enumerate(["4", "5", None])
    ]
    record, _ = calibration.calibrate(
        tc,
        tc,
        ["q"] * 3,
        lambda questions, meta: warmup,
        tmp_path,
        main=True,
        n_agents=tc.n_agents,
        rounds=tc.rounds,
    )
    coefficients = Coefficients.from_dict(record)
    assert (coefficients.alpha, coefficients.beta, coefficients.gamma) == ((0.0, 0.0),) * 3
    assert coefficients.lambda_ == (1.0, 1.0) and all(e > 0 for e in coefficients.eta)
    assert record["ordering"]["split_beats_unanimous_wrong"] == [True, True]
    rewards, _ = compute_rewards(
        warmup[1:] + [Trajectory("x", "?", "4", [["5"], ["5"]], "5", False)], coefficients
    )
    assert rewards.tolist() == [[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]]  # r_task, nothing else

    trained = []

    def train(tc):
        trained.append(tc.run_name)
        method = tc.run_name.split("-seed")[0]
        finished_run(Path(tc.output_dir), method, [True, False, False, False], [True, True, False, False])

    results = run_compare(config, train=train, progress=False)
    assert trained == ["udpo-seed0", "task_only-seed0"]
    assert results["methods"]["task_only"]["accuracy"]["change"] == pytest.approx(0.25)
    assert "| task_only | 0.500 [" in (tmp_path / "out" / "table.md").read_text()


def test_udpo_floor_floors_the_calibration_udpo_shares(tmp_path):
    """udpo_floor (issue 49): UDPO with correctness_floor on, its default margin, on the plan's shared
    calibration_file like udpo, the same budget."""
    pilot = (
        Path(__file__).resolve().parents[1] / "docs" / "lab" / "results" / "pilot_udpo" / "calibration.json"
    )
    path = write_compare(
        tmp_path,
        methods=["standard_mad", "task_only", "udpo", "udpo_floor"],
        settings={"n_agents": 3, "rounds": 2, "calibration_file": str(pilot)},
    )
    config = CompareConfig.load(path)
    configs = {m: config.train_config(m, 0) for m in config.trained()}
    check_budgets(configs)
    floor, udpo = configs["udpo_floor"], configs["udpo"]
    assert (floor.correctness_floor, udpo.correctness_floor) == (True, False)
    assert floor.calibration_file == udpo.calibration_file == str(pilot)
    assert floor.correctness_floor_margin == 0.1


@pytest.mark.slow
def test_a_real_compare_of_three_methods(tiny_model, tmp_path):
    """Standard MAD, UDPO and MAPPO on the tiny model (the real trainer, rollouts and checkpoints), one
    seed, one iteration each; then ``udpo compare`` again keeps every finished run and rewrites the
    tables."""
    from udpo.cli import main

    path = write_compare(
        tmp_path,
        model=tiny_model,
        methods=["standard_mad", "udpo", "mappo"],
        seeds=[0],
        shared_start=False,  # both evaluate iteration 0; compare checks the debates agree
        bootstrap_resamples=200,  # the machinery, not the numbers
        settings={"max_iterations": 1, "warmup_fraction": 0.1},
    )
    assert main(["compare", "--config", str(path), "--no-progress"]) == 0
    out = tmp_path / "out"
    budget = list(csv.DictReader((out / "budget.csv").open()))
    assert {(r["debates"], r["optimizer_steps"], r["iterations"]) for r in budget} == {("2", "1", "1")}
    assert [r["warmup_debates"] != "0" for r in budget] == [True, False]  # udpo calibrates, mappo does not
    results = json.loads((out / "results.json").read_text())
    assert list(results["methods"]) == ["standard_mad", "udpo", "mappo"]
    assert results["methods"]["udpo"]["n_questions"] == TINY["eval_questions"]
    assert (out / "diagnosis" / "summary.json").exists()
    before = (out / "udpo" / "seed_0" / "metrics.jsonl").read_text()
    assert main(["compare", "--config", str(path), "--no-progress"]) == 0
    assert (out / "udpo" / "seed_0" / "metrics.jsonl").read_text() == before  # nothing trained again
    assert read_jsonl(out / "mappo" / "seed_0" / "metrics.jsonl")
    assert main(["compare", "--config", str(path), "--status"]) == 0
