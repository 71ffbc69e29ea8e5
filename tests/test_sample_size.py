"""The pilot's sample-size rule: the pooled within-arm sd of the per-seed change, and the seeds per arm a
two-sample t-test needs; blind to the difference between the arms."""

from __future__ import annotations

import pytest
import yaml
from study_helpers import finished_run

from udpo.config import ConfigError
from udpo.study.plan import CompareConfig
from udpo.study.power import pooled_sd, seeds_per_arm
from udpo.study.runner import record_finished
from udpo.study.sample_size import blind_sample_size


def test_pooled_sd_is_the_spread_around_each_arms_own_mean():
    assert pooled_sd([[1, 3], [10, 14]]) == pytest.approx(5**0.5)  # (2 + 8) / (4 - 2)
    assert pooled_sd([[1, 3], [110, 114]]) == pooled_sd([[1, 3], [10, 14]])  # the arms' means do not enter
    with pytest.raises(ValueError, match="at least 2 seeds"):
        pooled_sd([[1, 2], [3]])


def test_seeds_per_arm_match_the_textbook_t_test():
    # Cohen's d of 1 and of 0.5 at a two-sided 5% test and 80% power: 17 and 64 per group
    assert seeds_per_arm(1.0, 1.0) == 17 and seeds_per_arm(2.0, 1.0) == 64
    assert seeds_per_arm(0.01, 1.0) == 2
    with pytest.raises(ValueError, match="> 0"):
        seeds_per_arm(0.0, 0.05)


def test_the_rule_reads_the_records_and_shows_no_arm_mean(tmp_path, capsys):
    from udpo.cli import main

    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump({"task": "arithmetic", "eval_questions": 4}))
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        yaml.safe_dump(
            {
                "recipe": "recipe.yaml",
                "methods": ["standard_mad", "task_only", "udpo"],
                "seeds": [0, 1],
                "output_dir": str(tmp_path / "runs"),
            }
        )
    )
    config = CompareConfig.load(plan)
    start = [False] * 4
    # per-seed accuracy changes: task_only 0.25 and 0.75, udpo 0.5 and 1.0: pooled sd sqrt(0.125)
    for method, seed, after in [
        ("task_only", 0, [True, False, False, False]),
        ("task_only", 1, [True, True, True, False]),
        ("udpo", 0, [True, True, False, False]),
        ("udpo", 1, [True, True, True, True]),
    ]:
        finished_run(config.run_dir(method, seed), method, start, after, seed=seed)
        assert record_finished(config, method, seed)  # the rule reads the records
    rule = blind_sample_size(config, effect=0.25)
    assert rule.pooled_sd == pytest.approx(0.125**0.5) and rule.arms == ["task_only", "udpo"]
    assert rule.seeds_per_arm == seeds_per_arm(0.125**0.5, 0.25)
    assert main(["study", str(plan), "--sample-size", "0.25", "--grader", "recorded"]) == 0
    out = capsys.readouterr().out
    assert (
        f"pooled within-arm sd {0.125**0.5:.4f}" in out and f"needs {rule.seeds_per_arm} seeds per arm" in out
    )
    assert "0.500" not in out and "0.750" not in out  # no arm's mean change


def test_second_stage_sizes_for_the_effect_or_falls_back_blind(tmp_path, capsys):
    from udpo.cli import main
    from udpo.study.sample_size import second_stage

    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump({"task": "arithmetic", "eval_questions": 4}))
    plan = tmp_path / "plan.yaml"

    def write_plan(effect: float, fallback: float, most: int) -> CompareConfig:
        rule = {"effect": effect, "fallback_effect": fallback, "most_seeds": most}
        body = {"recipe": "recipe.yaml", "methods": ["standard_mad", "task_only", "udpo"], "seeds": [0, 1]}
        plan.write_text(yaml.safe_dump({**body, "output_dir": str(tmp_path / "runs"), "second_stage": rule}))
        return CompareConfig.load(plan)

    config = write_plan(0.25, 0.5, 20)
    start = [False] * 4
    for method, seed, after in [  # per-seed changes 0.25, 0.75 and 0.5, 1.0: pooled sd sqrt(0.125)
        ("task_only", 0, [True, False, False, False]),
        ("task_only", 1, [True, True, True, False]),
        ("udpo", 0, [True, True, False, False]),
        ("udpo", 1, [True, True, True, True]),
    ]:
        finished_run(config.run_dir(method, seed), method, start, after, seed=seed)
        assert record_finished(config, method, seed)
    sd = 0.125**0.5
    assert seeds_per_arm(sd, 0.25) > 20 >= seeds_per_arm(sd, 0.5)  # so the fallback decides
    n, line = second_stage(config)
    assert n == seeds_per_arm(sd, 0.5) and f"{n} seeds per arm" in line and f"{sd:.4f}" in line
    config = write_plan(0.5, 1.0, 20)
    assert second_stage(config)[0] == seeds_per_arm(sd, 0.5)
    config = write_plan(0.25, 0.25, 20)  # neither fits: capped at most_seeds
    assert second_stage(config)[0] == 20 and "capped at 20" in second_stage(config)[1]
    assert main(["study", str(plan), "--second-stage", "--grader", "recorded"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("second stage: 20 seeds per arm") and "0.500" not in out and "0.750" not in out
    with pytest.raises(ConfigError, match="second_stage"):
        write_plan(0.5, 0.25, 20)
