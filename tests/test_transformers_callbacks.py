"""``transformers.TrainerCallback`` objects in a UDPO run (issue 51), on the tiny model: the events both
trainers have, a real ``TrainerState`` (global_step, log_history, is_world_process_zero, best_metric), and
``control.should_training_stop`` ending the run at the iteration's end with a checkpoint, from
transformers' own ``EarlyStoppingCallback`` and from a user's ``on_step_end``."""

from __future__ import annotations

import pytest
from transformers import (
    EarlyStoppingCallback,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)

import udpo
from udpo.training.callbacks import TransformersCallbacks, split_callbacks

TRAIN = [{"question": f"What is {a} + {a + 1}?", "answer": str(2 * a + 1)} for a in range(1, 9)]
TEST = [{"question": f"What is {a} + {a}?", "answer": 2 * a} for a in range(1, 3)]


class Recorder(TrainerCallback):
    """Records each event with the step and what it was given; stops at ``stop_at`` (on_step_end)."""

    def __init__(self, stop_at: int | None = None):
        self.events: list[tuple] = []
        self.stop_at = stop_at
        self.history_at_begin: list[dict] = []

    def _record(self, event, args, state, control, **kwargs):
        assert isinstance(args, TrainingArguments) and isinstance(state, TrainerState)
        assert isinstance(control, TrainerControl) and state.is_world_process_zero
        assert kwargs["model"] is not None and kwargs["optimizer"] is not None
        self.events.append((event, state.global_step))

    def on_train_begin(self, args, state, control, **kwargs):
        self._record("train_begin", args, state, control, **kwargs)
        self.history_at_begin = list(state.log_history)

    def on_step_end(self, args, state, control, **kwargs):
        self._record("step_end", args, state, control, **kwargs)
        if state.global_step == self.stop_at:
            control.should_training_stop = True
            return control
        return None

    def on_log(self, args, state, control, logs=None, **kwargs):
        self._record("log", args, state, control, **kwargs)
        assert state.log_history[-1] == {**logs, "step": state.global_step}
        key = "eval_accuracy" if "eval_accuracy" in logs else "reward/mean"
        self.events[-1] += (key, logs["epoch"] >= 0)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self._record("evaluate", args, state, control, **kwargs)
        assert metrics["eval_accuracy"] == 0.0 and "eval_u_sys" in metrics

    def on_save(self, args, state, control, **kwargs):
        self._record("save", args, state, control, **kwargs)

    def on_train_end(self, args, state, control, **kwargs):
        self._record("train_end", args, state, control, **kwargs)
        self.state = state


def config(tmp_path, **changes) -> udpo.UDPOConfig:
    values = dict(
        output_dir=str(tmp_path / "run"),
        n_agents=2,
        rounds=1,
        max_tokens=8,
        questions_per_iteration=2,
        max_iterations=4,
        debates_per_question=1,
        eval_questions=2,
        eval_steps=1,
        save_steps=10,  # only the last iteration, or where a callback stops the run
        progress=False,
        metric_for_best_model="accuracy",
        **{k: [0.5, 0.5] for k in ("alpha", "beta", "gamma", "lambda_", "eta")},  # no calibration
    )
    return udpo.UDPOConfig(**{**values, **changes})


def run(tiny_model, args, callbacks) -> dict:
    with udpo.UDPOTrainer(
        model=tiny_model, args=args, train_dataset=TRAIN, eval_dataset=TEST, callbacks=callbacks
    ) as trainer:
        return trainer.train()


def test_transformers_callbacks_are_one_hook_beside_ours():
    early, recorder = EarlyStoppingCallback(), Recorder()
    hooks, evals = split_callbacks([early, udpo.UDPOCallback(), recorder])
    assert evals == [] and isinstance(hooks[1], TransformersCallbacks)
    assert hooks[1].callbacks == [early, recorder]
    with pytest.raises(TypeError, match="instance of EarlyStoppingCallback, not the class"):
        split_callbacks([EarlyStoppingCallback])


def test_early_stopping_stops_with_a_checkpoint_and_a_resumed_run_keeps_its_state(tiny_model, tmp_path):
    """The tiny model never answers right: accuracy 0 at iteration 0 and 1, no improvement, so transformers'
    EarlyStoppingCallback (patience 1) stops the run after iteration 1's evaluation, which checkpoints it
    though save_steps is 10. Resumed, the run's log_history comes back and a user's on_step_end stops it."""
    recorder = Recorder()
    result = run(tiny_model, config(tmp_path), [EarlyStoppingCallback(early_stopping_patience=1), recorder])
    assert result["iterations"] == 1 and result["after"]["accuracy"] == 0.0
    checkpoints = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("iter_*")) == ["iter_000000", "iter_000001"]
    assert recorder.events == [
        ("train_begin", 0),
        ("log", 0, "eval_accuracy", True),
        ("evaluate", 0),
        ("save", 0),
        ("step_end", 1),
        ("log", 1, "reward/mean", True),
        ("log", 1, "eval_accuracy", True),
        ("evaluate", 1),
        ("save", 1),
        ("train_end", 1),
    ]
    state = recorder.state
    assert (state.global_step, state.max_steps, state.best_metric, state.best_global_step) == (1, 4, 0.0, 0)
    assert state.best_model_checkpoint == str(checkpoints / "iter_000000")
    assert [(log["step"], "eval_accuracy" in log) for log in state.log_history] == [
        (0, True),
        (1, False),
        (1, True),
    ]

    again = Recorder(stop_at=2)
    result = run(tiny_model, config(tmp_path, resume="latest"), [again])
    assert result["iterations"] == 2 and (checkpoints / "iter_000002").is_dir()
    assert again.history_at_begin == state.log_history  # read back from metrics.jsonl
    assert again.events[0] == ("train_begin", 1) and again.events[-1] == ("train_end", 2)
    assert ("evaluate", 2) in again.events and again.state.best_metric == 0.0


@pytest.mark.slow
def test_the_trl_example_trains_on_the_tiny_model(tiny_model, tmp_path):
    """examples/train_with_trl_reward.py, run as a user would (on the tiny model, 2 iterations): its TRL-form
    rewards are logged every iteration, its transformers callback prints every step and the evaluation."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "example"
    script = Path(__file__).resolve().parents[1] / "examples" / "train_with_trl_reward.py"
    done = subprocess.run(
        [sys.executable, str(script), "--model", tiny_model, "--output-dir", str(out), "--iterations", "2"],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 1/2: reward" in done.stdout and "step 2/2: reward" in done.stdout
    assert "step 0: held-out accuracy" in done.stdout and "step 2: held-out accuracy" in done.stdout
    assert "answer format 'number'" in done.stderr  # the '#### N' answers read as numbers, and said so
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["iteration"] for r in train] == [1, 2]
    assert all(f"reward/__main__:{name}" in r for r in train for name in ("boxed_once", "matches_reference"))
    assert (out / "checkpoints" / "iter_000002").is_dir()
