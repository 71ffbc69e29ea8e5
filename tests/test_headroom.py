"""Headroom measured before a study trains (udpo.study.headroom): the statistics on hand-computed success
matrices, the bounds a plan states and its refusal to train outside them, and ``udpo study PLAN --check`` on
the tiny model end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from test_study import RECIPE as STUDY_RECIPE

from udpo.config import ConfigError
from udpo.study import load_plan, study
from udpo.study.headroom import (
    HEADROOM_FILE,
    HeadroomSpec,
    debate_untrained,
    headroom_statistics,
    measured_settings,
    plan_spec,
    require_headroom,
    violations,
)

#: the tiny study's recipe (one agent, no round, 4 tokens), sampling at 0.7, one iteration
RECIPE = {**STUDY_RECIPE, "temperature": 0.7, "max_iterations": 1}
BOUNDS = {"min_mixed_share": 0.5, "min_ceiling_gain": 0.15, "max_cut": 0.10}


def write_plan(tmp_path: Path, model: str = "smollm2-135m-instruct", **headroom) -> Path:
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump({**RECIPE, "model": model}))
    plan = {
        "recipe": "recipe.yaml",
        "methods": ["standard_mad", "task_only"],
        "seeds": [3, 4],
        "output_dir": str(tmp_path / "runs"),
        "results_dir": str(tmp_path / "results"),
        "headroom": headroom,
    }
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    return path


def test_the_statistics_of_a_success_matrix_by_hand():
    success = np.array(
        [
            [1, 1, 1, 1],  # always right
            [0, 0, 0, 0],  # never
            [1, 0, 0, 0],  # right 1 of 4: its majority is wrong
            [1, 1, 0, 0],  # a tie: half
            [0, 1, 1, 1],  # 3 of 4: its majority is right
        ]
    )
    s = headroom_statistics(success)
    assert s["accuracy"] == pytest.approx(10 / 20)
    assert s["distribution"] == {"0": 1, "1": 1, "2": 1, "3": 1, "4": 1}
    assert (s["never_share"], s["mixed_share"], s["always_share"]) == pytest.approx((0.2, 0.6, 0.2))
    assert s["majority_ceiling"] == pytest.approx((1 + 0 + 0 + 0.5 + 1) / 5)
    assert s["majority_gain"] == pytest.approx(0.0)
    assert s["ceiling"] == pytest.approx(4 / 5) and s["ceiling_gain"] == pytest.approx(0.3)

    # three debates: no ties; a task whose outcomes are fixed has no headroom at all
    s = headroom_statistics(np.array([[1, 0, 0], [1, 1, 0], [0, 0, 0]]))
    assert s["accuracy"] == pytest.approx(3 / 9)
    assert s["majority_ceiling"] == pytest.approx(1 / 3) and s["ceiling"] == pytest.approx(2 / 3)
    assert s["mixed_share"] == pytest.approx(2 / 3)
    fixed = headroom_statistics(np.array([[1, 1], [0, 0], [0, 0]]))
    assert (fixed["mixed_share"], fixed["ceiling_gain"], fixed["majority_gain"]) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="questions x debates"):
        headroom_statistics(np.zeros(3))


def test_bounds_are_checked_and_named():
    measured = {"mixed_share": 0.3, "ceiling_gain": 0.2, "cut_share": 0.1, "unparsed_share": 0.0}
    assert violations(measured, BOUNDS) == [
        "mixed_share 0.300 (needs >= 0.5, headroom.min_mixed_share)",
        "cut_share 0.100 (needs < 0.1, headroom.max_cut)",  # strictly under
    ]
    assert violations({**measured, "mixed_share": 0.5, "cut_share": 0.09}, BOUNDS) == []
    for block, match in [
        ({"debates": 1}, "debates must be >= 2"),
        ({"max_cut": 1.5}, r"max_cut must be a share in \[0, 1\]"),
        ({"min_gain": 0.1}, r"unknown key\(s\) \['min_gain'\]"),
        ({"questions": 0}, "questions must be an integer >= 1"),
    ]:
        with pytest.raises(ConfigError, match=match):
            HeadroomSpec.from_plan(block)


def committed_check(plan, **measured) -> Path:
    """A headroom.json as the check writes it, measured on the plan's settings, with ``measured``."""
    spec, seed = plan_spec(plan)
    values = {"mixed_share": 0.6, "ceiling_gain": 0.25, "cut_share": 0.02, "unparsed_share": 0.0, **measured}
    path = plan.results_path() / HEADROOM_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    settings = measured_settings(plan.train_config(plan.trained()[0], seed))
    path.write_text(json.dumps({"measured": values, "settings": settings, "spec": spec.sample()}))
    return path


def test_a_plan_refuses_to_train_outside_its_bounds(tmp_path, monkeypatch):
    plan = load_plan(write_plan(tmp_path, **BOUNDS))
    import udpo.study.main as main

    monkeypatch.setattr(main, "run_compare", lambda *a, **k: pytest.fail("trained despite the bounds"))
    with pytest.raises(ConfigError, match=r"headroom.json is missing: run `udpo study PLAN --check`"):
        study(plan)
    committed_check(plan, mixed_share=0.32, cut_share=0.4)
    with pytest.raises(ConfigError) as refused:
        study(plan)
    assert "mixed_share 0.320 (needs >= 0.5" in str(refused.value)
    assert "cut_share 0.400 (needs < 0.1" in str(refused.value)
    assert "ceiling_gain" not in str(refused.value)  # 0.25 meets 0.15
    # the tables are no training: the gate leaves them alone (here they find no record to build from)
    with pytest.raises(ValueError, match="no seed has a record"):
        study(plan, tables_only=True)

    committed_check(plan)  # within the bounds: the gate lets it through
    require_headroom(plan)
    # measured at another temperature, or on fewer questions: stale, whatever it says
    recipe = {**yaml.safe_load((tmp_path / "recipe.yaml").read_text()), "temperature": 0.3}
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    with pytest.raises(ConfigError, match=r"measured on other settings than the plan's \(temperature\)"):
        require_headroom(load_plan(tmp_path / "plan.yaml"))
    fewer = load_plan(write_plan(tmp_path, **BOUNDS, questions=10))
    committed_check(load_plan(write_plan(tmp_path, **BOUNDS)))
    with pytest.raises(ConfigError, match="headroom's questions, debates or seed"):
        require_headroom(fewer)
    # a plan without bounds needs no check
    (tmp_path / "free").mkdir()
    require_headroom(load_plan(write_plan(tmp_path / "free", questions=10)))


def test_the_check_command_on_the_tiny_model(tiny_model, tmp_path, capsys):
    """``udpo study PLAN --check``: 4 training questions x 3 debates; the file's statistics are those of
    the same debates drawn again; the bounds are missed (the tiny model is always cut at 4 tokens and never
    right), so it exits 1 and training is refused, naming the measured values."""
    from udpo.cli import main

    path = write_plan(tmp_path, tiny_model, questions=4, debates=3, **BOUNDS)
    assert main(["study", str(path), "--check"]) == 1
    out = capsys.readouterr().out
    assert "team accuracy" in out and "s a debate" in out and "wrote" in out
    result = json.loads((tmp_path / "results" / HEADROOM_FILE).read_text())
    m, pace = result["measured"], result["pace"]
    assert (m["questions"], m["debates_per_question"], pace["debates"]) == (4, 3, 12)
    assert sum(m["distribution"].values()) == 4 and len(set(result["question_ids"])) == 4
    assert pace["dtype"] in ("fp32", "bf16") and pace["cpu"] and pace["tokens_per_s"] > 0
    assert result["seed"] == 3 and result["bounds"] == BOUNDS

    plan = load_plan(path)
    spec, seed = plan_spec(plan)
    config = plan.train_config("task_only", seed)
    from udpo.study.headroom import check_questions

    questions = check_questions(config, spec.questions)
    assert [q.id for q in questions] == result["question_ids"]
    debates = debate_untrained(config, questions, spec.debates).debates
    success = np.array([t.correct for t in debates], dtype=float).reshape(4, 3)
    assert {k: m[k] for k in headroom_statistics(success)} == headroom_statistics(success)
    assert m["cut_share"] == pytest.approx(1.0)  # 4 tokens: every answer of the tiny model is cut
    assert result["violations"] and "cut_share 1.000 (needs < 0.1" in " ".join(result["violations"])
    with pytest.raises(ConfigError, match=r"too little headroom to start .*cut_share 1.000"):
        study(plan)
