"""TrainConfig: recipes + command-line overrides, named errors for bad input, every shipped recipe parses."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from udpo.cli import main as udpo_main
from udpo.config import ConfigError, TrainConfig, parse_config, reference_markdown
from udpo.config.groups import AlgorithmArgs, OptimizerArgs, RewardArgs
from udpo.config.train import GROUPS

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return str(path)


def test_defaults_follow_the_paper():
    c = TrainConfig()
    # the paper's 32 debates per update, as 8 questions of 4 debates each (the group dynamic sampling reads)
    assert (c.learning_rate, c.questions_per_iteration, c.debates_per_question) == (1e-5, 8, 4)
    assert (c.dynamic_sampling, c.dynamic_sampling_max_extra) == (True, 2.0)
    # the paper's 500 warm-up steps exceed whole CSQA / TruthfulQA runs: warm-up is a share of the run
    assert (c.warmup_ratio, c.warmup_steps, c.dual_clip) == (0.1, 0, 3.0)
    assert (c.lr_scheduler_type, c.max_grad_norm, c.num_train_epochs) == ("cosine", 1.0, 10.0)
    assert (c.kappa, c.lam, c.clip_eps, c.eta_base, c.lambda_base) == (1.5, 0.5, 0.2, 0.01, 1.0)
    assert not c.coefficients_explicit and c.base_weights is None


def test_yaml_then_command_line_overrides(tmp_path):
    recipe = write(
        tmp_path, "n_agents: 2\nlearning_rate: 1e-5\nalpha: [0.5]\ntask_options: {difficulty: [1, 3]}\n"
    )
    c = parse_config(["--config", recipe, "--learning_rate", "2e-5", "--lambda_", "1", "2", "--rounds", "4"])
    assert c.learning_rate == 2e-5  # the command line wins
    assert c.n_agents == 2 and c.rounds == 4
    assert c.alpha == [0.5] and c.lambda_ == [1.0, 2.0]
    assert c.task_options == {"difficulty": [1, 3]}
    assert parse_config(["--task_options", '{"n_questions": 7}']).task_options == {"n_questions": 7}


def test_unknown_keys_are_named_with_a_suggestion(tmp_path):
    recipe = write(tmp_path, "n_agent: 3\nfoo: 1\n")
    with pytest.raises(ConfigError) as e:
        parse_config(["--config", recipe])
    msg = str(e.value)
    assert recipe in msg and "'n_agent' (did you mean 'n_agents'?)" in msg and "'foo'" in msg
    with pytest.raises(
        ConfigError, match="command line: unknown config key.*'lerning_rate' .*'learning_rate'"
    ):
        parse_config(["--lerning_rate", "1e-4"])


@pytest.mark.parametrize(
    "text, match",
    [
        ("n_agents: three\n", "n_agents must be an integer, got 'three'"),
        ("learning_rate: fast\n", "learning_rate must be a number"),
        ("baseline: median\n", "baseline must be one of 'batch', 'group'"),
        ("profiles: {a: 1}\n", "profiles must be a list"),
        ("- just\n- a list\n", "must be a mapping"),
        ("n_agents: [\n", "not valid YAML"),
    ],
)
def test_bad_values_name_the_file_and_key(tmp_path, text, match):
    recipe = write(tmp_path, text)
    with pytest.raises(ConfigError, match=match) as e:
        parse_config(["--config", recipe])
    assert recipe in str(e.value)


def test_missing_recipe_file():
    with pytest.raises(ConfigError, match="config file not found: nowhere.yaml"):
        parse_config(["--config", "nowhere.yaml"])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"baseline": "group", "debates_per_question": 1}, "set debates_per_question >= 2"),
        ({"dynamic_sampling_max_extra": -1.0}, "dynamic_sampling_max_extra must be a finite number >= 0"),
        ({"alpha_base": 0.5}, r"missing: beta_base, gamma_base"),
        ({"warmup_fraction": 0.0}, "leaves no warm-up debates to calibrate alpha, beta, gamma, lambda_, eta"),
        ({"n_agents": 3, "alpha": [1.0, 2.0]}, "alpha needs 1 value .* or n_agents=3 values, got 2"),
        ({"eta": [-1.0]}, "eta values must be finite and >= 0"),
        ({"eval_split": "train"}, "evaluation must be held out"),
        ({"reference": "lagged"}, "needs ref_update_interval >= 1"),
        ({"ref_update_interval": 5}, "only applies to reference: lagged"),
        ({"backend": "openai"}, "needs base_url"),
        ({"base_url": "http://x"}, "only used by a server backend"),
        ({"shared_adapter": True, "n_agents": 2, "agent_models": ["a/b", "c/d"]}, "needs one base model"),
        ({"agent_models": ["a/b"]}, "agent_models needs n_agents=3 entries"),
        ({"report_to": ["mlflow"]}, "unknown tracker"),
        ({"report_to": ["none", "wandb"]}, "'none' cannot be combined"),
        ({"replay_refresh_interval": 3}, "needs replay: true"),
        ({"clip_eps": 1.5}, r"clip_eps must be in \(0, 1\)"),
        ({"max_iterations": 0}, "max_iterations must be >= 1"),
        (
            {"eval_callbacks": ["no_colon"]},
            "eval_callbacks: entry 'no_colon' must look like 'package.module:name'",
        ),
        (
            {"ablations": ["intra", "task"]},
            r"unknown ablation\(s\) \['task'\]; choose from \['inter', 'intra', 'sys'\]",
        ),
        ({"ablations": ["sys"], "gamma": [0.5]}, r"zero \['gamma'\]: do not also give"),
        (
            {"attack_eval": "autotransform", "attack_eval_m": [1, 3]},
            r"each m must be in 1..n_agents-1 = 1..2",
        ),
        (
            {"attack_eval": "autoinject", "eval_questions": 0},
            "attack_eval: autoinject needs eval_questions > 0",
        ),
        ({"attack_eval": "mutiny"}, "attack_eval must be one of 'none', 'autotransform', 'autoinject'"),
        ({"warmup_steps": 10, "max_iterations": 10}, "warmup_steps=10 is not shorter than the run's 10"),
        ({"warmup_steps": 25, "max_iterations": 5, "update_epochs": 4}, "not shorter than the run's 20"),
        ({"warmup_ratio": 1.0}, r"warmup_ratio must be in \[0, 1\)"),
        ({"dual_clip": 1.0}, "dual_clip must be 0 .off. or a finite number > 1"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        (
            {"backend": "vllm", "n_agents": 5, "rounds": 5, "max_tokens": 512},
            "vllm_max_model_len=4096 cannot hold a debate of n_agents=5, rounds=5, max_tokens=512",
        ),
        ({"reward_functions": ["nocolon"]}, "reward_functions: entry 'nocolon' must look like"),
        (
            {"reward_functions": ["a:b"], "reward_weights": [1.0, 2.0]},
            "one weight per reward_functions entry",
        ),
    ],
)
def test_incompatible_options(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        TrainConfig(**kwargs)


def test_warmup_is_a_share_of_the_run_or_explicit_steps():
    c = TrainConfig(max_iterations=40, update_epochs=2)  # 80 optimizer steps
    assert c.warmup_for(80) == 8
    assert TrainConfig(warmup_ratio=0.0).warmup_for(80) == 0
    assert TrainConfig(warmup_steps=5).warmup_for(80) == 5  # explicit steps win over the ratio
    assert TrainConfig(max_iterations=1).warmup_for(1) == 0  # a one-step run has no warm-up
    with pytest.raises(ConfigError, match="never leave warm-up"):
        TrainConfig(warmup_steps=500).warmup_for(173)  # the paper's 500 steps on a whole CSQA run


def test_explicit_coefficients_need_no_warmup():
    c = TrainConfig(warmup_fraction=0.0, alpha=[1], beta=[1], gamma=[1], lambda_=[1], eta=[0.01])
    assert c.coefficients_explicit


def test_every_shipped_recipe_parses():
    recipes = sorted((REPO / "recipes").rglob("*.yaml"))
    recipes = [r for r in recipes if "accelerate" not in r.parts]
    assert len(recipes) >= 29  # quickstart + the 27-recipe paper grid + a compare config
    for recipe in recipes:
        if "compare" in recipe.parts:  # udpo compare configs: every method's training config builds
            from udpo.study.plan import CompareConfig, check_budgets

            config = CompareConfig.load(recipe)
            for seed in config.seeds:
                check_budgets({m: config.train_config(m, seed) for m in config.trained()})
        else:
            parse_config(["--config", str(recipe)])


@pytest.mark.slow
def test_paper_grid_is_up_to_date():
    result = subprocess.run(
        [sys.executable, str(REPO / "recipes" / "make_grid.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_udpo_train_forwards_arguments(capsys):
    assert udpo_main(["train", "--lerning_rate", "1"]) == 2
    assert "did you mean 'learning_rate'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        udpo_main(["train", "--help"])
    assert e.value.code == 0
    assert "--questions_per_iteration" in capsys.readouterr().out


def test_training_help_tells_the_truth(capsys):
    with pytest.raises(SystemExit):
        parse_config(["--help"], prog="udpo train")
    text = " ".join(capsys.readouterr().out.split())
    assert text.startswith("usage: udpo train [-h] [--config RECIPE.yaml]")
    assert "--no_progress, --no-progress turn --progress off" in text
    assert "--no_eval_at_start, --no-eval-at-start turn --eval_at_start off" in text
    assert "(default: all). (default: None)" not in text and "training questions (default: all)." in text
    assert "--max-tokens MAX_TOKENS Maximum new tokens per response. (default: 256)" in text
    assert "$UDPO_DATA_DIR" in text  # where data is found, as docs/tasks.md says


def test_training_entry_points_need_a_recipe(capsys, tmp_path):
    assert udpo_main(["train", "--rounds", "2"]) == 2
    assert "no --config given" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="recipes/quickstart.yaml"):
        parse_config([], require_config=True)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert parse_config(["--config", str(empty), "--rounds", "3"], require_config=True).rounds == 3


def test_reference_table_lists_every_field_and_the_docs_show_it():
    table = reference_markdown()
    for name in TrainConfig.__dataclass_fields__:
        assert f"| `{name}` |" in table
    assert table in (REPO / "docs" / "training.md").read_text(), "regenerate with python -m udpo.config"


def test_field_groups_partition_the_config_and_check_their_own_fields():
    """Six groups hold every field once; each group's check refuses its own bad values without the rest
    of the config, and the rules that span groups are TrainConfig's."""
    from dataclasses import fields as dc_fields

    from udpo.config import (
        GROUPS,
        AlgorithmArgs,
        DebateArgs,
        ModelArgs,
        OptimizerArgs,
        RewardArgs,
        RunArgs,
    )

    names = [f.name for group in GROUPS for f in dc_fields(group)]
    assert sorted(names) == sorted(TrainConfig.__dataclass_fields__) and len(names) == len(set(names))
    assert max(len(dc_fields(group)) for group in GROUPS) <= 30
    for group, bad, needle in [
        (ModelArgs, {"dtype": "int4"}, "dtype must be auto"),
        (DebateArgs, {"top_p": 0.0}, "top_p must be in (0, 1]"),
        (RewardArgs, {"lam": 2.0}, "lam must be in [0, 1]"),
        (AlgorithmArgs, {"clip_eps": 1.5}, "clip_eps must be in (0, 1)"),
        (OptimizerArgs, {"learning_rate": 0.0}, "learning_rate must be a finite number > 0"),
        (RunArgs, {"report_to": ["mlflow"]}, "report_to: unknown tracker"),
    ]:
        group().check()  # the defaults pass on their own
        with pytest.raises(ConfigError, match=re.escape(needle)):
            group(**bad).check()
    with pytest.raises(ConfigError, match="alpha needs 1 value"):  # n_agents (debate) x alpha (rewards)
        TrainConfig(n_agents=3, alpha=[0.1, 0.2])


def test_a_group_holds_its_own_fields_and_no_others():
    """What the trainer hands each part: one group's fields, as that group's dataclass."""
    config = TrainConfig(learning_rate=3e-4, rounds=1, lora_r=4)
    optim = config.group(OptimizerArgs)
    assert type(optim) is OptimizerArgs and optim.learning_rate == 3e-4
    assert {f.name for f in fields(optim)} == {f.name for f in fields(OptimizerArgs)}
    assert not hasattr(optim, "rounds") and not hasattr(optim, "lora_r")
    sizes = [len(fields(group)) for group in GROUPS]
    assert sum(sizes) == len(fields(TrainConfig))  # every field in exactly one group


def test_algorithm_registry_matches_the_config_and_declares_needs():
    """One registry: the config's names (one Literal, also the command line's choices and the API
    configs' type) are its keys; the classes say whether they need a critic and whether they perturb
    training rollouts."""
    from typing import get_args, get_type_hints

    from udpo.algorithms import ALGORITHMS, MAPPO, RMAAC, UDPO, algorithm_class
    from udpo.api import MAPPOConfig
    from udpo.config import ALGORITHMS as NAMES
    from udpo.config import AlgorithmName
    from udpo.config.recipes import config_parser

    assert tuple(ALGORITHMS) == NAMES == get_args(AlgorithmName)
    assert (
        get_type_hints(TrainConfig)["algorithm"] == get_type_hints(MAPPOConfig)["algorithm"] == AlgorithmName
    )
    (action,) = [a for a in config_parser()._actions if a.dest == "algorithm"]
    assert tuple(action.choices) == NAMES
    assert [algorithm_class(n).needs_critic for n in NAMES] == [False, True, True]
    with pytest.raises(ValueError, match="unknown algorithm 'ppo'; choose udpo, mappo, rmaac"):
        algorithm_class("ppo")
    with pytest.raises(ValueError, match="mappo needs a critic"):
        MAPPO.from_config(TrainConfig(algorithm="mappo"), RewardArgs(), {}, critic=None)
    with pytest.raises(ValueError, match="rmaac needs a critic"):
        RMAAC.from_config(TrainConfig(algorithm="rmaac"), RewardArgs(), {}, critic=None)
    record = {"coefficients": {k: [0.5] * 3 for k in ("alpha", "beta", "gamma", "lambda_", "eta")}}
    config = TrainConfig(clip_eps=0.3, kl_loss="k2")
    udpo = UDPO.from_config(config.group(AlgorithmArgs), config.group(RewardArgs), record)
    assert udpo.adversary_stage(None) is None and (udpo.settings.clip_eps, udpo.settings.kl_loss) == (
        0.3,
        "k2",
    )
