"""Issue 24's training options in a real (tiny-model) run: the critic's own learning rate, its warm start on
the warm-up debates and several passes per iteration, the sampler/trainer mismatch logged under the
default ``behavior_logprobs: recompute``, one calibration (``udpo calibrate``) shared by several runs, and a test set that is the
same for every training seed."""

from __future__ import annotations

import json

import pytest
from tiny_models import build_tiny_llama
from train_helpers import EXPLICIT, read_jsonl, tiny_config, write_recipe

from udpo.cli import main
from udpo.config import ConfigError
from udpo.training.trainer import Trainer


@pytest.fixture(scope="module")
def tiny_path(tokenizer_path, tmp_path_factory) -> str:
    return build_tiny_llama(tmp_path_factory.mktemp("tiny"), tokenizer_path)


def run(config) -> tuple[list[dict], dict[str, dict]]:
    """Train ``config``; its metrics lines and its optimizer's parameter groups by adapter."""
    trainer = Trainer(config)
    try:
        trainer.train()
        groups = {g["adapter"]: g for g in trainer.updater.optimizer.param_groups}
    finally:
        trainer.close()
    return read_jsonl(config.output_dir + "/metrics.jsonl"), groups


def test_mappo_critic_warm_start_epochs_learning_rate_and_mismatch(tiny_path, tmp_path):
    config = tiny_config(
        tiny_path,
        tmp_path / "mappo",
        algorithm="mappo",
        max_iterations=1,
        eval_questions=0,
        warmup_fraction=0.1,
        debates_per_question=2,
        baseline="group",
        dynamic_sampling=False,  # the tiny model never answers: every group's rewards are equal
        critic_learning_rate=0.05,
        critic_epochs=3,
        critic_warmup_epochs=2,
        max_tokens=8,
    )
    lines, groups = run(config)
    warm = [x for x in lines if x["kind"] == "critic_warmup"]
    assert len(warm) == 1 and warm[0]["critic_warmup/value_loss_first"] >= 0
    (train,) = [x for x in lines if x["kind"] == "train"]
    # three critic passes, each a step of the critic's group alone (logged as means)
    assert "critic/value_loss" in train and "critic/explained_variance" in train
    # constant schedule: the critic's group keeps its own peak rate beside the actors'
    assert groups["critic"]["lr"] == pytest.approx(0.05)
    assert groups["agent_0"]["lr"] == pytest.approx(config.learning_rate)
    # the hf engine records log-probs: the mismatch with the trainer's recomputed ones is logged
    assert train["mismatch/tokens"] > 0 and train["mismatch/abs_max"] >= train["mismatch/abs_mean"] >= 0
    warmup = (tmp_path / "mappo" / "trajectories" / "warmup.jsonl").read_text().splitlines()
    assert len(warmup) == 3  # 10% of 30 training questions


@pytest.mark.slow
def test_runs_share_one_calibration_file_and_one_test_set(tiny_path, tmp_path):
    # udpo calibrate: the warm-up debates and calibration.json, no training
    recipe = write_recipe(tmp_path / "recipe.yaml", tiny_path, max_iterations=1, warmup_fraction=0.1)
    assert main(["calibrate", "--config", str(recipe), "--output_dir", str(tmp_path / "cal")]) == 0
    shared = tmp_path / "cal" / "calibration.json"
    record = json.loads(shared.read_text())
    assert len(record["coefficients"]["alpha"]) == 2 and record["warmup"]["n_debates"] == 3
    assert not (tmp_path / "cal" / "checkpoints").exists()
    first = tiny_config(
        tiny_path,
        tmp_path / "a",
        max_iterations=1,
        eval_questions=3,
        warmup_fraction=0.1,
        calibration_file=str(shared),
    )
    run(first)
    # a second run, another seed: the same coefficients without warm-up debates, the importance weights on
    config = tiny_config(
        tiny_path,
        tmp_path / "b",
        seed=1,
        max_iterations=1,
        eval_questions=3,
        warmup_fraction=0.1,
        calibration_file=str(shared),
        is_correction="tis",
        eval_question_seed=0,
    )
    lines, _ = run(config)
    second = json.loads((tmp_path / "b" / "calibration.json").read_text())
    assert second["coefficients"] == record["coefficients"]
    assert second["calibration_file"] == str(shared)
    assert not (tmp_path / "b" / "trajectories" / "warmup.jsonl").exists()
    (train,) = [x for x in lines if x["kind"] == "train"]
    assert 0 < train["update/is_weight_mean"] <= 2.0
    # eval_question_seed: 0 gives seed 1 the test questions of seed 0
    questions = [
        [json.loads(x)["question_id"] for x in (tmp_path / r / "eval/iter_000000/trajectories.jsonl").open()]
        for r in ("a", "b")
    ]
    assert questions[0] == questions[1]


def test_a_shared_calibration_must_be_plain_udpo(tiny_path, tmp_path):
    bad = tmp_path / "calibration.json"
    coefficients = {k: [0.1, 0.1] for k in ("alpha", "beta", "gamma", "lambda_", "eta")}
    bad.write_text(json.dumps({"coefficients": coefficients, "explicit": [], "ablations": ["intra"]}))
    trainer = Trainer(tiny_config(tiny_path, tmp_path / "run", calibration_file=str(bad), max_iterations=1))
    try:
        with pytest.raises(ConfigError, match="ablations"):
            trainer.calibrate()
    finally:
        trainer.close()
    with pytest.raises(ConfigError, match="no such file"):
        tiny_config(tiny_path, tmp_path / "x", calibration_file=str(tmp_path / "none.json")).check_paths()
    with pytest.raises(ConfigError, match="only mappo and rmaac"):
        tiny_config(tiny_path, tmp_path / "x", critic_epochs=2)
    with pytest.raises(ConfigError, match="behavior_logprobs: recompute"):
        tiny_config(tiny_path, tmp_path / "x", is_correction="tis", behavior_logprobs="rollout", **EXPLICIT)


def test_eval_debates_per_question_repeats_each_problem_with_its_own_ids():
    from udpo.config import TrainConfig
    from udpo.training.data import load_training_data

    def eval_set(k: int):
        config = TrainConfig(
            task="arithmetic", eval_questions=5, eval_question_seed=3, eval_debates_per_question=k
        )
        return load_training_data(config, config, config, calibrates=True).eval_set

    once, thrice = eval_set(1), eval_set(3)
    assert [q.text for q in thrice] == [q.text for q in once for _ in range(3)]
    assert [q.id for q in thrice[:3]] == [once[0].id, f"{once[0].id}#d1", f"{once[0].id}#d2"]
    assert len({q.id for q in thrice}) == 15 and [q.gold for q in thrice[::3]] == [q.gold for q in once]
    with pytest.raises(ConfigError, match="eval_debates_per_question"):
        TrainConfig(eval_debates_per_question=0)
