"""scripts/study_check.py, the pre-run check of a study plan: it debates training-split questions as the
plan's runs would, on the tiny model here, and reports accuracy, cut answers and their bounds."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import yaml
from train_helpers import TINY

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "study_check.py"


def load_script():
    spec = importlib.util.spec_from_file_location("study_check", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_check_debates_training_questions_and_states_its_bounds(tiny_model, tmp_path, capsys):
    check = load_script()
    recipe = {
        **TINY,
        "model": tiny_model,
        "max_tokens": 4,
        "dtype": "fp32",
        "task_options": {"difficulty": [1, 3]},
    }
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(recipe))
    plan = tmp_path / "plan.yaml"
    body = {
        "recipe": "recipe.yaml",
        "methods": ["standard_mad", "task_only"],
        "output_dir": str(tmp_path / "r"),
    }
    plan.write_text(yaml.safe_dump(body))
    out = tmp_path / "check"
    # the tiny model never answers right and, at 4 tokens, is cut on (nearly) every answer
    code = check.main(
        [str(plan), "--questions", "4", "--accuracy", "0.35", "0.65", "--max-cut", "0.1", "--out", str(out)]
    )
    result = json.loads((out / "check.json").read_text())
    assert code == 1 and result["split"] == "train" and result["questions"] == 4
    assert result["answers"]["answers"] == 4 * 2 * 2  # questions x agents x (rounds + 1)
    assert set(result["cut_share_by_round"]) == {"0", "1"} and result["dtype"] == "float32"
    assert result["team_accuracy_by_level"].keys() == {"1", "3"}
    assert (
        any(c.endswith("NO") for c in result["checks"]) and "team accuracy" in (out / "check.md").read_text()
    )
    # a setting tried with --set, and no bounds: exit 0
    assert check.main([str(plan), "--questions", "2", "--set", "max_tokens=8", "--set", "rounds=0"]) == 0
    assert "{'max_tokens': '8', 'rounds': '0'}" in capsys.readouterr().out
    low, high = check.wilson(5, 10)  # by hand: 0.5 -+ 1.96 sqrt(0.25 / 10 + 0.0096) / 1.384, centred
    assert abs(low - 0.2366) < 1e-4 and abs(high - 0.7634) < 1e-4
