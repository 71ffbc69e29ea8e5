"""The training loop on a tiny random model (tests/tiny_models.py; the one that answers digits where the
rewards must differ between debates): a tiny run end to end, the update improving its objective, and the
failure paths (missing model, used run directory, NaN loss, out of memory)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re

import pytest
import torch
import train_helpers
from safetensors.torch import load_file
from train_helpers import EXPLICIT, QUESTION_DIGEST, read_jsonl, tiny_config

from udpo.algorithms.base import record_behavior
from udpo.config import ConfigError
from udpo.env.tasks.base import Question
from udpo.env.tasks.parsing import FORMS
from udpo.training import checkpoint_store as ckpt
from udpo.training.memory import reset_resident_peak
from udpo.training.run_lock import RunBusyError
from udpo.training.team import TeamManifest
from udpo.training.trainer import QuestionSchedule, Trainer, TrainingError, explain_oom, split_warmup


def count_eval(trainer, iteration: int) -> dict:
    """An eval callback, as an attack evaluation would plug in."""
    return {"questions": len(trainer.eval_set), "iteration": iteration}


@pytest.fixture(scope="module")
def digit_model(tokenizer_path, tmp_path_factory) -> str:
    """The tiny model that answers one digit: rewards that differ between debates, so adapters move."""
    return train_helpers.digit_model(tokenizer_path, tmp_path_factory)


@pytest.fixture(scope="module")
def trained(digit_model, tmp_path_factory):
    """Two iterations of 2 questions, N=2, T=1, with warm-up calibration and evaluations, natural and
    with agent 1 compromised by AutoTransform (the built-in profile: no attacker call); progress drawn
    to a captured stderr. dtype auto (UDPO_DTYPE picks the path); a reward term fixed by the question
    (train_helpers.question_digest) makes every iteration's advantages non-zero on either path."""
    out = tmp_path_factory.mktemp("run") / "run"
    attack = {"attack_eval": "autotransform", "attack_eval_attacker": "builtin"}
    config = tiny_config(
        digit_model, out, max_iterations=2, progress=True, reward_functions=[QUESTION_DIGEST], **attack
    )
    trainer = Trainer(config, eval_callbacks=[count_eval])
    initial = [p.detach().clone() for p in trainer.params]
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        result = trainer.train()
    trainer.stderr = stderr.getvalue()
    yield trainer, result, initial
    trainer.close()


def test_every_evaluation_draws_the_same_random_numbers_and_training_keeps_its_own(trained):
    trainer, _, _ = trained
    state = torch.random.get_rng_state()
    texts = []
    for k in (90, 91):
        trainer.evaluate(k)
        lines = read_jsonl(trainer.run_dir / "eval" / f"iter_{k:06d}" / "trajectories.jsonl")
        texts.append([[turn["text"] for agent in t["turns"] for turn in agent] for t in lines])
    assert texts[0] == texts[1]  # sampled at temperature 0.7, yet the same draws
    assert torch.equal(torch.random.get_rng_state(), state)


def test_a_run_resumed_at_a_checkpoint_where_it_now_ends_evaluates_there(trained, digit_model):
    """Checkpoint 1 of a 2-iteration run had no evaluation due; resumed with max_iterations 1 (a run
    stopped early), it is the end, so the run evaluates it and records that in the checkpoint."""
    import shutil

    trainer, _, _ = trained
    stopped = trainer.run_dir.with_name("stopped")
    shutil.copytree(trainer.run_dir, stopped)
    checkpoint = stopped / "checkpoints" / "iter_000001"
    assert ckpt.read_state(checkpoint)["last_evaluation"] == 0
    again = Trainer(tiny_config(digit_model, stopped, max_iterations=1, resume=str(checkpoint)))
    try:
        result = again.train()
    finally:
        again.close()
    assert result["iterations"] == 1 and result["after"]["n_questions"] == 2
    assert (stopped / "eval" / "iter_000001" / "summary.json").exists()
    assert not (stopped / "eval" / "iter_000002").exists()
    records = read_jsonl(stopped / "metrics.jsonl")
    kinds = [(r["kind"], r["iteration"]) for r in records if r["kind"] in ("train", "eval")]
    assert kinds == [("eval", 0), ("train", 1), ("eval", 1)]
    assert ckpt.read_state(checkpoint)["last_evaluation"] == 1


def test_progress_moves_through_every_debate_of_the_run(trained):
    """The iteration bar and, below it, one debate line relabelled for the warm-up, each evaluation and
    each iteration's rollout, counting turns as they finish (N=2, T=1: 4 turns a question)."""
    text = trained[0].stderr
    assert re.search(r"train: 100%\|[^|]*\| 2/2 ", text)
    for label in ("warmup", "eval 0", "train 1", "train 2", "eval 2"):
        done = re.findall(rf"{label}: 100%\|[^|]*\| (\d+)/(\d+) turns", text)
        assert done and done[-1][0] == done[-1][1] != "0", (label, text[-2000:])
    assert text.index("eval 0: ") < text.index("train 1: ") < text.index("train 2: ") < text.index("eval 2: ")


def test_run_logs_every_metric_and_file(trained):
    trainer, result, _ = trained
    run = trainer.run_dir
    records = read_jsonl(run / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    assert [r["iteration"] for r in train] == [1, 2]
    expected = [
        "reward/r_intra", "reward/r_inter", "reward/r_sys", "reward/r_task", "reward/mean", "reward/agent_1",
        "train/accuracy", "train/u_intra", "train/u_inter", "train/u_sys", "update/kl", "update/clip_frac",
        "update/ratio_mean", "update/ratio_max", "update/loss", "grad_norm/agent_0", "grad_norm/agent_1",
        "lr", "tokens_per_s", "time/rollout", "time/reward", "time/update", "time/sync", "memory/rss_gib",
    ]  # fmt: skip
    if reset_resident_peak():  # the kernel lets a process restart its resident peak: each phase's is logged
        expected += ["memory/rollout_rss_peak_gib", "memory/update_rss_peak_gib"]
    for r in train:
        missing = [k for k in expected if k not in r]
        assert not missing, missing
        assert r["tokens"] > 0 and r["debates"] == 2
        for i in (0, 1):  # each agent's answer forms over its turns of the iteration (2 debates, 2 rounds)
            shares = [r[f"train/forms/agent_{i}/{form}"] for form in FORMS]
            assert r[f"train/forms/agent_{i}/turns"] == 4 and sum(shares) == pytest.approx(1.0)
            assert (
                0 <= r[f"train/forms/agent_{i}/echo_rate"] <= 1 and r[f"train/forms/agent_{i}/unknown"] == 0
            )
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["iteration"] for r in evals] == [0, 2]
    for r in evals:
        assert 0 <= r["accuracy"] <= 1 and {"u_intra", "u_inter", "u_sys"} <= set(r)
        assert r["count_eval/questions"] == 2 and r["count_eval/iteration"] == r["iteration"]
        assert r["forms/agent_0/turns"] == r["forms/agent_1/turns"] == 4 and "forms/agent_1/echo_rate" in r
        attacked = {k: r[f"attack_autotransform/m1/{k}"] for k in ("accuracy", "u_intra", "u_inter", "u_sys")}
        assert all(0 <= v <= 1 for v in attacked.values()), attacked
        assert r["attack_autotransform/m1/accuracy_drop"] == pytest.approx(
            r["accuracy"] - attacked["accuracy"]
        )
    assert result["before"]["n_questions"] == result["after"]["n_questions"] == 2
    saved = json.loads((run / "config.json").read_text())  # the auto update sizes, as a CPU resolves them
    assert (saved["logprob_token_budget"], saved["gradient_checkpointing"]) == (4096, False)

    calibration = json.loads((run / "calibration.json").read_text())
    assert calibration["warmup"]["n_debates"] == 3  # 10% of 30 training questions
    assert all(len(v) == 2 for v in calibration["coefficients"].values())
    assert len(read_jsonl(run / "trajectories" / "warmup.jsonl")) == 3
    train_lines = read_jsonl(run / "trajectories" / "train.jsonl")
    assert [t["meta"]["iteration"] for t in train_lines] == [1] * 2 + [2] * 2
    assert not {t["question_id"] for t in train_lines} & {
        t["question_id"] for t in read_jsonl(run / "trajectories" / "warmup.jsonl")
    }
    assert json.loads((run / "eval" / "iter_000002" / "summary.json").read_text())["n_questions"] == 2
    for k in (0, 2):
        attacked = read_jsonl(
            run / "eval" / "attack" / f"iter_{k:06d}" / "m1-agents-1" / "trajectories.jsonl"
        )
        assert len(attacked) == 2
        assert all(t["meta"]["compromised"] == [1] and t["meta"]["iteration"] == k for t in attacked)
        assert all(
            t["meta"]["attack"] == {"name": "autotransform", "attacker": "builtin", "seed": 0}
            for t in attacked
        )


def test_adapters_change_and_checkpoints_hold_them(trained):
    trainer, _, initial = trained
    train = [r for r in read_jsonl(trainer.run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert all(r["advantage/std"] > 0 for r in train), "all debates got the same reward: nothing to learn"
    for before, p in zip(initial, trainer.params, strict=True):
        assert p.shape == before.shape
    for agent in range(2):
        own = trainer.policy.parameters_of(agent)
        ids = {id(p) for p in own}
        moved = [not torch.equal(b, p) for b, p in zip(initial, trainer.params, strict=True) if id(p) in ids]
        assert any(moved), f"agent {agent}'s adapter did not change"
    ckpts = trainer.run_dir / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "iter_000002"
    team = TeamManifest.load(ckpts / "iter_000002")
    assert team.n_agents == 2 and team.iteration == 2 and team.task == "arithmetic"
    for name, folder in team.adapter_paths().items():
        first = load_file(str(ckpts / "iter_000000" / "adapters" / name / "adapter_model.safetensors"))
        last = load_file(f"{folder}/adapter_model.safetensors")
        assert first.keys() == last.keys()
        assert any(not torch.equal(first[k], last[k]) for k in first), name
    for name in (
        "trainer_state.json",
        "optimizer.json",
        "optimizer.safetensors",
        "scheduler.json",
        "rng.json",
    ):
        assert (ckpts / "iter_000002" / name).is_file(), name


def test_updates_increase_the_objective_on_a_fixed_batch(trained):
    trainer, _, _ = trained
    questions = trainer.schedule.for_iteration(3) + trainer.schedule.for_iteration(4)
    batch = trainer.rollout_batch(trainer.debate(questions, {"phase": "test"}))
    advantages = trainer.algorithm.advantages(batch)
    assert advantages.values.abs().sum() > 0, "all debates got the same reward; nothing to learn from"
    objectives = []
    for step in range(3):
        # step 0 measures the behavior log-probs (ratio 1), recorded on the debates; later steps divide
        # by them, so the ratio moves
        result = trainer.update(batch, advantages, fresh_count=len(batch) if step == 0 else 0, iteration=100)
        if step == 0:
            record_behavior(batch.trajectories, result.behavior)
            batch = trainer.rollout_batch(batch.trajectories)
        objectives.append(-result.metrics["update/loss"])  # measured before this step's optimizer update
    assert objectives[1] > objectives[0]
    assert objectives[-1] > objectives[0]


def test_replayed_debates_keep_the_recomputed_behavior_logprobs(tiny_model, tmp_path):
    """behavior_logprobs: recompute with replay on: the update returns the recomputed behavior log-probs
    (at the sampling temperature), the loop records them on the fresh debates as the trainer's log-probs
    before storing them, so a replayed debate gets the same ratio denominator it had when fresh; the
    engine's log-probs stay as recorded (what the trajectory file holds)."""
    config = tiny_config(
        tiny_model, tmp_path / "run", replay=True, replay_fraction=0.5, eval_questions=0, **EXPLICIT
    )
    trainer = Trainer(config)
    temperatures = []
    for name in ("token_logprobs", "reference_logprobs"):
        method = getattr(trainer.policy, name)

        def recording(*args, method=method, **kwargs):
            temperatures.append(kwargs.get("temperature"))
            return method(*args, **kwargs)

        setattr(trainer.policy, name, recording)
    used: dict[int, list] = {
        1: [],
        2: [],
    }  # iteration -> (trajectory, agent, behavior log-probs the loss saw)
    try:
        trainer.use_calibration(trainer.calibrate()[0])
        loss = trainer.algorithm.loss

        def recording_loss(batch, agent, logp, behavior, *args):
            used[trainer.iteration + 1] += [
                (t, agent, b) for t, b in zip(batch.trajectories, behavior.logprobs, strict=True)
            ]
            return loss(batch, agent, logp, behavior, *args)

        trainer.algorithm.loss = recording_loss
        trainer.run_iteration(1)
        trainer.state.iteration = 1
        fresh = {(id(t), agent): b for t, agent, b in used[1]}
        assert len(fresh) == 2 * 2 and len(trainer.replay) == 2
        written = read_jsonl(trainer.run_dir / "trajectories" / "train.jsonl")
        for t, record in zip(trainer.replay.items, written, strict=True):
            for agent in range(2):
                stored = torch.tensor([x for turn in t.turns[agent] for x in turn.trainer_logprobs])
                assert torch.equal(stored, fresh[id(t), agent])
                assert [turn.logprobs for turn in t.turns[agent]] == [
                    turn["logprobs"] for turn in record["turns"][agent]
                ]
        metrics = trainer.run_iteration(2)
    finally:
        trainer.close()
    assert metrics["replayed"] == 2
    replayed = [(t, agent, b) for t, agent, b in used[2] if (id(t), agent) in fresh]
    assert len(replayed) == 2 * 2  # two debates of iteration 1 drawn again, each agent's loss saw them
    for t, agent, behavior in replayed:
        assert torch.equal(behavior, fresh[id(t), agent])  # the same denominator as when fresh
    assert temperatures and set(temperatures) == {config.temperature} == {0.7}


def test_replay_does_not_rely_on_the_buffer_sharing_the_loops_debates(digit_model, tmp_path, monkeypatch):
    """A buffer that stores and hands out deep copies of the debates trains the same run: the same
    losses, ratios and metrics and the same adapters, so nothing reaches a replayed debate through
    objects the buffer shares with the loop."""
    from udpo.training.replay import ReplayBuffer

    def run(name: str) -> tuple[list[dict], list[torch.Tensor]]:
        config = tiny_config(
            digit_model,
            tmp_path / name,
            reward_functions=[QUESTION_DIGEST],  # advantages that differ: the adapters move
            replay=True,
            replay_fraction=0.5,
            update_epochs=2,
            eval_questions=0,
            max_iterations=3,
            **EXPLICIT,
        )
        trainer = Trainer(config)
        try:
            trainer.train()
            params = [p.detach().clone() for p in trainer.params]
        finally:
            trainer.close()
        volatile = ("time", "tokens_per_s", "time/", "memory/")
        records = [
            {k: v for k, v in r.items() if not k.startswith(volatile)}
            for r in read_jsonl(tmp_path / name / "metrics.jsonl")
            if r["kind"] == "train"
        ]
        return records, params

    shared, shared_params = run("shared")
    add, sample = ReplayBuffer.add, ReplayBuffer.sample

    def copying_add(self, trajectories, replace=False):
        add(self, copy.deepcopy(list(trajectories)), replace)

    def copying_sample(self, k, rng=None):
        items, weights = sample(self, k, rng)
        return copy.deepcopy(items), weights

    monkeypatch.setattr(ReplayBuffer, "add", copying_add)
    monkeypatch.setattr(ReplayBuffer, "sample", copying_sample)
    copied, copied_params = run("copied")
    assert [r["replayed"] for r in shared] == [0, 2, 2]
    assert any(r["agent_0/ratio_mean"] != 1.0 for r in shared[1:])  # replayed debates move the ratio
    assert copied == shared
    assert all(torch.equal(a, b) for a, b in zip(shared_params, copied_params, strict=True))


def test_missing_model_is_named(tmp_path):
    with pytest.raises(ConfigError, match="model: unknown model '/no/such/model'"):
        Trainer(tiny_config("/no/such/model", tmp_path / "run"))


@pytest.mark.parametrize(
    ("overrides", "limit"),
    [
        (
            {"backend": "vllm", "vllm_max_model_len": 1024, "max_tokens": 140, "n_agents": 3, "rounds": 2},
            1024,
        ),
        ({"max_tokens": 2048, "n_agents": 3, "rounds": 3}, 8192),  # SmolLM2's max_position_embeddings
    ],
)
def test_a_debate_that_can_outgrow_the_context_is_refused_before_the_model_loads(
    tokenizer_path, tmp_path, monkeypatch, overrides, limit
):
    # 140 x (2 x 3 + 1) = 980 tokens of answers pass the config's own check, but with the question and each
    # round's instructions the last round can exceed 1024 tokens: a mid-run failure, refused up front
    from udpo.config import ConfigError

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("udpo.training.policy.MultiAgentPolicy.__init__", no_model)
    with pytest.raises(ConfigError, match=rf"can reach \d+ tokens .*more than .*={limit}; lower max_tokens"):
        Trainer(tiny_config(tokenizer_path, tmp_path / "run", **overrides))


def test_the_context_check_measures_each_rounds_longest_row_for_the_memory_plan(tokenizer_path, tmp_path):
    """check_context returns each round's longest request, completion included, over the run's longest
    questions (what autosize sizes the update's rows for on a GPU): round 0 the opening through the chat
    template plus one answer at max_tokens (+4 tokens at the seam); each later round adds the agent's own
    answer, its two peers' and the new request."""
    from transformers import AutoTokenizer

    from udpo.config.groups import DebateArgs, ModelArgs, OptimizerArgs, RunArgs
    from udpo.env.backends.chat import chat_prompt_ids
    from udpo.env.debate import AgentSpec, DebateEnv
    from udpo.training.data import agent_profiles, check_context, debate_config, load_training_data

    config = tiny_config(tokenizer_path, tmp_path / "run", n_agents=3, rounds=2, max_tokens=32)
    debate = config.group(DebateArgs)
    data = load_training_data(debate, config.group(OptimizerArgs), config.group(RunArgs), calibrates=False)
    widths = check_context(config.group(ModelArgs), debate, data.task, data.questions)
    assert widths is not None and len(widths) == 3
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    profile = agent_profiles(debate)[0]
    agents = [AgentSpec(profile=p) for p in agent_profiles(debate)]
    env = DebateEnv(data.task, backend=None, config=debate_config(debate, agents))  # type: ignore[arg-type]
    openings = [
        len(chat_prompt_ids(tokenizer, env._opening(q, AgentSpec(profile=profile)))) for q in data.questions
    ]
    assert widths[0] == max(openings) + 32 + 4
    assert widths[1] - widths[0] > 3 * (32 + 4) and widths[2] - widths[1] > 3 * (32 + 4)


def test_ablations_zero_their_terms_after_the_overrides(tiny_model, tmp_path):
    # alpha and beta calibrated on warm-up debates, then zeroed; gamma, lambda_, eta explicit
    explicit = {**EXPLICIT, "warmup_fraction": 0.1, "alpha": None, "beta": None}
    trainer = Trainer(tiny_config(tiny_model, tmp_path / "run", **explicit, ablations=["intra", "inter"]))
    try:
        record, _ = trainer.calibrate()
    finally:
        trainer.close()
    coefficients = record["coefficients"]
    assert coefficients["alpha"] == [0.0, 0.0] and coefficients["beta"] == [0.0, 0.0]
    assert coefficients["gamma"] == [0.3, 0.3] and coefficients["eta"] == [0.01, 0.01]
    assert record["ablations"] == ["intra", "inter"] and record["warmup"]["n_debates"] == 3


def test_a_used_run_directory_needs_resume(trained, digit_model):
    import shutil

    trainer, _, _ = trained
    with pytest.raises(
        RunBusyError, match="is being written by another process"
    ):  # the fixture's, still open
        Trainer(tiny_config(digit_model, trainer.run_dir))
    used = trainer.run_dir.with_name("used")
    shutil.copytree(trainer.run_dir, used)
    with pytest.raises(TrainingError, match="already holds a run.*--resume latest"):
        Trainer(tiny_config(digit_model, used))


def test_nan_loss_stops_with_a_checkpoint(tiny_model, tmp_path, monkeypatch):
    from udpo.algorithms.udpo import UDPO

    real_loss = UDPO.loss

    def nan_loss(self, batch, agent, logp, behavior, ref_logp, advantages):
        loss, info = real_loss(self, batch, agent, logp, behavior, ref_logp, advantages)
        return loss * float("nan"), info

    monkeypatch.setattr(UDPO, "loss", nan_loss)
    out = tmp_path / "run"
    trainer = Trainer(tiny_config(tiny_model, out, eval_questions=0, max_iterations=2, **EXPLICIT))
    try:
        with pytest.raises(TrainingError) as e:
            trainer.train()
    finally:
        trainer.close()
    msg = str(e.value)
    assert "non-finite value at iteration 1" in msg and "loss of agent 0 is nan" in msg
    assert f"--resume {out / 'checkpoints' / 'iter_000000'}" in msg
    assert (out / "checkpoints" / "iter_000000" / "trainer_state.json").is_file()
    assert not any(r["kind"] == "train" for r in read_jsonl(out / "metrics.jsonl"))


def test_out_of_memory_gets_a_hint():
    config = tiny_config("unused", "unused")
    with pytest.raises(TrainingError) as e, explain_oom(config):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    msg = str(e.value)
    assert "Tried to allocate 2.00 GiB" in msg
    for hint in ("questions_per_iteration (now 2)", "max_tokens (now 16)", "gradient_accumulation_steps",
                 "gradient_checkpointing: true"):  # fmt: skip
        assert hint in msg
    assert isinstance(e.value.__cause__, torch.cuda.OutOfMemoryError)


def test_question_schedule_and_warmup_split():
    questions = [Question(id=str(k), text=f"q{k}", gold="1") for k in range(10)]
    warm, train = split_warmup(questions, 0.2, seed=3)
    assert len(warm) == 2 and len(train) == 8 and not {q.id for q in warm} & {q.id for q in train}
    assert split_warmup(questions, 0.2, seed=3) == (warm, train)
    schedule = QuestionSchedule(train, per_iteration=3, seed=5)
    first_epoch = [q.id for k in (1, 2) for q in schedule.for_iteration(k)]
    first_epoch += [q.id for q in schedule.for_iteration(3)[:2]]  # 3 + 3 + 2 = the 8 training questions
    assert sorted(first_epoch, key=int) == sorted((q.id for q in train), key=int)  # each once per epoch
    assert [q.id for q in schedule.for_iteration(7)] == [
        q.id for q in QuestionSchedule(train, 3, 5).for_iteration(7)
    ]
    assert schedule.epoch_of(8) == 3.0
    with pytest.raises(ValueError, match="leaves none to train on"):
        split_warmup(questions[:1], 0.5, seed=0)


def test_tracker_writes_flat_lines_and_checks_tracker_packages(tmp_path, monkeypatch):
    from accelerate import Accelerator

    from udpo.training import tracking

    tracker = tracking.Tracker(tmp_path, Accelerator(cpu=True), ["jsonl"], "run", {})
    timer = tracking.Timer()
    with timer("rollout"):
        pass
    tracker.log({"reward": {"r_task": 0.5}, "time": timer.pop()}, 1)
    tracker.log({"accuracy": 0.25}, 1, kind="eval")
    (train,), (evals,) = tracking.read_metrics(tmp_path, "train"), tracking.read_metrics(tmp_path, "eval")
    assert train["iteration"] == 1 and train["reward/r_task"] == 0.5 and train["time/rollout"] >= 0
    assert evals["accuracy"] == 0.25 and timer.pop() == {}
    assert tracking.accelerate_trackers(["jsonl"]) == []
    # a requested tracker whose package is missing is an error, not a silently dropped logger
    monkeypatch.setattr(tracking.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        ValueError, match=r"report_to: wandb needs the wandb package: pip install 'udpo\[wandb\]'"
    ):
        tracking.accelerate_trackers(["jsonl", "wandb"])
