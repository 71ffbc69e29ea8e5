"""The Python API (``from udpo import UDPOConfig, UDPOTrainer``): user datasets and tasks, reward callables,
a PEFT LoraConfig, model objects, callbacks, the context manager; and the examples/ script, run for real."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import udpo
from udpo.algorithms.reward_functions import function_name, load_reward_functions
from udpo.config import ConfigError, TrainConfig
from udpo.env.tasks import Question, Task, get_task, register_task, task_names
from udpo.env.tasks.custom import DatasetTask, infer_answer_format, normalize_text
from udpo.env.tasks.data import DataError
from udpo.training.callbacks import UDPOCallback, split_callbacks

ROOT = Path(__file__).resolve().parents[1]

TRAIN = [{"question": f"What is {a} + {a + 1}?", "answer": str(2 * a + 1)} for a in range(1, 9)]
TEST = [{"question": f"What is {a} + {a}?", "answer": 2 * a} for a in range(1, 4)]


def brevity(trajectory, agent: int) -> float:
    """A user reward: minus the last reply's length in hundreds of characters."""
    return -len(trajectory.turns[agent][-1].text) / 100


# --- exports ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_public_names_are_exported_lazily():
    code = "import sys, udpo; assert 'torch' not in sys.modules; print(sorted(udpo.__all__))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    names = set(eval(done.stdout))  # noqa: S307 - our own printed list
    assert {
        "UDPOConfig",
        "UDPOTrainer",
        "MAPPOConfig",
        "RMAACConfig",
        "DatasetTask",
        "UDPOCallback",
    } <= names
    for name in names - {"__version__"}:
        assert getattr(udpo, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        udpo.Nope  # noqa: B018
    with pytest.raises(AttributeError, match="udpo.TrainerCallback was renamed: use udpo.UDPOCallback"):
        udpo.TrainerCallback  # noqa: B018


def test_configs_pick_the_algorithm(tmp_path):
    assert udpo.UDPOConfig(output_dir=str(tmp_path)).algorithm == "udpo"
    assert udpo.MAPPOConfig(output_dir=str(tmp_path)).algorithm == "mappo"
    assert udpo.RMAACConfig(output_dir=str(tmp_path)).algorithm == "rmaac"
    assert isinstance(udpo.UDPOConfig(), TrainConfig)
    with pytest.raises(ConfigError, match="n_agents"):
        udpo.UDPOConfig(n_agents=0)


# --- user tasks ------------------------------------------------------------------------------------
def test_dataset_task_numbers():
    task = DatasetTask("sums", train=TRAIN, test=TEST)
    train, test = task.load("train"), task.load("test", limit=2)
    assert [q.gold for q in train[:3]] == ["3", "5", "7"] and [q.gold for q in test] == ["2", "4"]
    assert train[0].id == "sums-train-0" and task.splits == ("train", "test")
    q = train[0]
    assert task.prompt(q).startswith("What is 1 + 2?") and "\\boxed{}" in task.prompt(q)
    assert task.parse("1 + 2 = 3, so \\boxed{3}", q) == "3" and task.is_correct(
        task.parse("\\boxed{3.0}", q), q
    )
    assert DatasetTask(train=[{"question": "q", "answer": "1,000"}]).load("train")[0].gold == "1000"


def test_dataset_task_choice_and_text():
    records = [
        {"id": "a", "question": "Sky colour?", "options": ["red", "blue"], "answer": "B"},
        {"id": "b", "question": "Grass colour?", "options": ["green", "pink"], "answer": 0},
        {"id": "c", "question": "Snow colour?", "options": ["black", "white"], "answer": "white"},
    ]
    task = DatasetTask("colours", answer_format="choice", splits={"dev": records})
    qs = task.load("dev")
    assert [q.gold for q in qs] == ["B", "A", "B"] and "(A) red\n(B) blue" in qs[0].text
    assert task.parse("Answer: (B)", qs[0]) == "B" and task.parse("I pick (C)", qs[0]) is None
    text = DatasetTask(
        "capitals", answer_format="text", train=[{"question": "Capital of France?", "answer": "Paris."}]
    )
    q = text.load("train")[0]
    assert q.gold == "paris" and text.parse("It is \\boxed{ PARIS }", q) == "paris"
    assert text.parse("It might be Lyon or Paris, I am not sure at all", q) is None
    assert normalize_text("  New   York. ") == "new york"


def test_dataset_task_own_parser_and_instruction():
    task = DatasetTask(
        train=TRAIN,
        instruction="End with 'ANSWER: n'.",
        parse=lambda text, q: text.rsplit("ANSWER:", 1)[-1].strip() if "ANSWER:" in text else None,
    )
    q = task.load("train")[0]
    assert task.prompt(q).endswith("End with 'ANSWER: n'.") and task.parse("so ANSWER: 3", q) == "3"
    bad = DatasetTask(train=TRAIN, parse=lambda text, q: 3)
    with pytest.raises(TypeError, match="not a string"):
        bad.parse("x", q)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"train": [{"question": "q"}]}, "record 0: no 'answer' field (fields: question)"),
        (
            {"answer_format": "number", "train": [{"question": "q", "answer": "seven"}]},
            "is not a number, as answer_format 'number' needs; pass answer_format=",
        ),
        ({"answer_format": "text", "train": [{"question": "q", "answer": "?!"}]}, "no letter or digit"),
        (
            {"train": [{"id": 1, "question": "q", "answer": 1}, {"id": 1, "question": "r", "answer": 2}]},
            "id '1'",
        ),
        ({"train": [{"question": "", "answer": 1}]}, "non-empty string"),
        ({"train": ["not a dict"]}, "must be a dict"),
        ({"train": []}, "has no records"),
        ({"train": {"question": "q", "answer": 1}}, "not one dict"),
        (
            {"answer_format": "choice", "train": [{"question": "q", "options": ["a", "b"], "answer": "C"}]},
            "not a letter",
        ),
        ({"answer_format": "choice", "train": [{"question": "q", "answer": "A"}]}, "list of at least two"),
    ],
)
def test_dataset_task_bad_records_are_named(kwargs, needle):
    with pytest.raises(DataError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        DatasetTask(**kwargs)


def test_datasets_dataset_records_and_a_task_as_train_dataset(tmp_path):
    from datasets import Dataset

    from udpo.api import _task_settings

    task = DatasetTask("hub-like", train=Dataset.from_list(TRAIN), test=Dataset.from_list(TEST))
    assert [q.gold for q in task.load("test")] == ["2", "4", "6"]
    args = udpo.UDPOConfig(output_dir=str(tmp_path))
    settings = _task_settings(args, None, task, None)
    assert settings["task"] == "hub-like" and get_task("hub-like") is task
    assert (settings["train_split"], settings["eval_split"]) == ("train", "test")
    with pytest.raises(ValueError, match="train_dataset is a Task"):
        _task_settings(args, None, task, TEST)


def test_dataset_task_from_jsonl_and_template(tmp_path):
    from udpo.api import _task_settings

    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in TRAIN))
    template = DatasetTask("filed", answer_format="number")
    with pytest.raises(ValueError, match="holds no records"):
        template.load("train")
    task = template.with_splits(train=str(path), test=None)
    assert task.splits == ("train",) and len(task.load("train")) == len(TRAIN) and template.splits == ()
    with pytest.raises(ValueError, match="already holds records"):
        _task_settings(udpo.UDPOConfig(output_dir=str(tmp_path)), task, TRAIN, None)
    with pytest.raises(ValueError, match="answer_format"):
        DatasetTask(answer_format="essay")


#: a new user's first data set: one-word text answers
COLOURS = [
    {"question": f"Which colour do you get by mixing {x} and {y} paint?", "answer": gold}
    for x, y, gold in [
        ("blue", "yellow", "green"),
        ("red", "yellow", "Orange"),
        ("red", "blue", "purple"),
        ("red", "white", "pink"),
        ("black", "white", "grey"),
        ("blue", "white", "light blue"),
        ("red", "green", "brown"),
        ("purple", "white", "lavender"),
        ("red", "black", "maroon"),
        ("yellow", "white", "cream"),
    ]
]


def test_the_answer_format_is_inferred_from_the_gold_answers():
    assert infer_answer_format(TRAIN) == "number" and infer_answer_format(COLOURS) == "text"
    assert infer_answer_format([{"answer": 3}, {"answer": "3 apples"}]) == "text"
    assert infer_answer_format([{"answer": True}]) == "text"  # a boolean is no number
    assert infer_answer_format([{"answer": 1, "options": ["x", "y"]}, {"answer": 0}]) == "choice"
    assert infer_answer_format(["not a record", {"question": "q"}]) == "number"  # left to the checks
    mixed = DatasetTask(train=TRAIN[:2], test=COLOURS[:3])  # all splits decide
    assert mixed.answer_format == "text" and mixed.load("train")[0].gold == "3"
    with pytest.raises(DataError, match="split test, record 0: answer 'teal' is not a number, though 8 of"):
        DatasetTask(train=TRAIN, test=[{"question": "Name a colour.", "answer": "teal"}])
    numbers = DatasetTask(train=TRAIN)
    assert numbers.answer_format == "number" and numbers.with_splits(train=COLOURS).answer_format == "text"
    with pytest.raises(DataError, match="answer 'green' is not a number.*answer_format="):
        DatasetTask(answer_format="number").with_splits(train=COLOURS)
    with pytest.raises(DataError, match="'options' must be a list.*answer_format 'choice'"):
        DatasetTask(
            train=[{"question": "q", "answer": 0, "options": ["a", "b"]}, {"question": "r", "answer": 1}]
        )
    template = DatasetTask()
    assert template.answer_format is None
    with pytest.raises(ValueError, match="no answer format yet"):
        template.parse("\\boxed{1}", Question(id="q", text="q", gold="1"))


def test_colour_questions_through_the_api_are_text_and_the_models_replies_are_read(tmp_path):
    """Issue 40: ten colour-mixing rows given to the trainer as a new user would: the format is inferred
    (text, not "answer 'green' is not a number") and SmolLM2's ways of answering parse to the gold."""
    import dataclasses

    from udpo.api import _task_settings

    args = udpo.UDPOConfig(output_dir=str(tmp_path), n_agents=2, rounds=1, max_tokens=32)
    config = dataclasses.replace(args, **_task_settings(args, None, COLOURS[:8], COLOURS[8:]))
    task = get_task(config.task)  # as the trainer finds it (udpo.training.data.load_training_data)
    assert task.answer_format == "text"
    loaded = [*task.load(config.train_split), *task.load(config.eval_split)]
    questions = {q.gold: q for q in loaded}
    assert set(questions) == {normalize_text(r["answer"]) for r in COLOURS}
    green, orange, light_blue = questions["green"], questions["orange"], questions["light blue"]
    for reply in ("The answer is green.", "Mixing blue and yellow gives **green**.", "\\boxed{Green}"):
        assert task.is_correct(task.parse(reply, green), green), reply
    assert task.is_correct(task.parse("You get orange paint.\n\nOrange.", orange), orange)
    assert task.is_correct(task.parse("The answer is a light blue, a pastel.", light_blue), light_blue)
    assert not task.is_correct(task.parse("The answer is green.", orange), orange)
    assert task.parse("When you mix them you get a nice colour for walls.", green) is None


class Echo(Task):
    """A user's Task subclass: the answer is the question's last word."""

    name = "echo"
    splits = ("train", "test")

    def __init__(self, n: int = 3):
        self.n = n

    def load(self, split="test", data_path=None, limit=None, seed=0):
        return [Question(id=f"{split}-{k}", text=f"say w{k}", gold=f"w{k}") for k in range(self.n)][:limit]

    def format_instruction(self, question):
        return "Repeat the last word."

    def parse(self, text, question):
        return text.split()[-1] if text.split() else None


def test_registered_and_imported_tasks_reach_the_config(tmp_path):
    register_task("echo-test", Echo)
    assert "echo-test" in task_names() and get_task("echo-test", n=2).n == 2
    config = TrainConfig(task="echo-test", task_options={"n": 5}, output_dir=str(tmp_path))
    assert config.task == "echo-test"
    with pytest.raises(ConfigError, match="task echo-test takes n, not m"):
        TrainConfig(task="echo-test", task_options={"m": 1}, output_dir=str(tmp_path))
    assert isinstance(get_task(f"{__name__}:Echo"), Echo)  # a class named by its import path
    register_task("echo-object", Echo(n=1))
    with pytest.raises(ValueError, match="takes no options"):
        get_task("echo-object", n=2)
    with pytest.raises(ConfigError, match="task: cannot import 'no.such.module:X'"):
        TrainConfig(task="no.such.module:X", output_dir=str(tmp_path))
    with pytest.raises(ValueError, match="built-in task"):
        register_task("gsm8k", Echo)
    with pytest.raises(TypeError, match="needs a Task subclass"):
        register_task("bad", 3)


# --- rewards, LoRA, callbacks ----------------------------------------------------------------------
def test_reward_callables_and_names():
    fns = load_reward_functions([brevity, "udpo.algorithms.reward_functions:concise"], [0.5, 2.0])
    assert [f.name for f in fns] == [f"{__name__}:brevity", "udpo.algorithms.reward_functions:concise"]
    assert [f.weight for f in fns] == [0.5, 2.0] and fns[0].fn is brevity
    assert function_name(lambda t, i: 0.0) == f"{__name__}:test_reward_callables_and_names.<locals>.<lambda>"
    with pytest.raises(ValueError, match="share a name"):
        load_reward_functions([brevity, brevity])
    with pytest.raises(ValueError, match="neither a module:function name nor a callable"):
        load_reward_functions([3])


def test_trainer_refuses_weights_that_do_not_fit_before_loading(tmp_path):
    args = udpo.UDPOConfig(output_dir=str(tmp_path / "run"), reward_weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="2 reward_weights for 1 reward_functions"):
        udpo.UDPOTrainer(args=args, train_dataset=TRAIN, reward_funcs=[brevity])
    assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="eval_dataset without train_dataset"):
        udpo.UDPOTrainer(args=udpo.UDPOConfig(output_dir=str(tmp_path / "run")), eval_dataset=TEST)
    with pytest.raises(TypeError, match="Echo loads its own questions"):
        udpo.UDPOTrainer(
            args=udpo.UDPOConfig(output_dir=str(tmp_path / "run")), train_dataset=TRAIN, task=Echo()
        )


def test_command_line_still_refuses_weights_without_functions(tmp_path):
    from udpo.config import parse_config

    with pytest.raises(ConfigError, match="one weight per reward_functions entry"):
        parse_config(["--reward_weights", "1.0", "--output_dir", str(tmp_path / "r")])


def test_lora_settings_from_peft():
    from peft import LoraConfig

    from udpo.training.policy import LoraSettings

    lora = LoraSettings.from_peft(LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", use_rslora=True))
    assert (lora.r, lora.alpha, lora.target_modules) == (4, 8, ["all-linear"])
    built = lora.peft_config()
    assert built.target_modules == "all-linear" and built.use_rslora and built.task_type == "CAUSAL_LM"
    resolved = lora.resolved(["q_proj", "up_proj"])
    assert resolved.target_modules == ["q_proj", "up_proj"] and resolved.peft_config().use_rslora
    assert sorted(resolved.peft_config().target_modules) == ["q_proj", "up_proj"]
    assert lora.to_dict() == {"r": 4, "alpha": 8, "dropout": 0.0, "target_modules": ["all-linear"]}


def test_split_callbacks():
    class Hook(UDPOCallback):
        pass

    def evaluation(trainer, iteration):
        return {}

    hook = Hook()
    assert split_callbacks([hook, evaluation]) == ([hook], [evaluation])
    with pytest.raises(TypeError, match="instance of Hook"):
        split_callbacks([Hook])
    with pytest.raises(TypeError, match="neither a UDPOCallback, a transformers.TrainerCallback nor"):
        split_callbacks([3])


# --- the real thing --------------------------------------------------------------------------------
class Recorder(UDPOCallback):
    def __init__(self):
        self.calls: list[tuple] = []

    def on_train_begin(self, trainer):
        self.calls.append(("begin",))

    def on_iteration_end(self, trainer, iteration, metrics):
        self.calls.append(("iteration", iteration, f"reward/{__name__}:brevity" in metrics))

    def on_evaluate(self, trainer, iteration, summary):
        self.calls.append(("evaluate", iteration, "wrong_majority" in summary))

    def on_save(self, trainer, iteration, checkpoint):
        self.calls.append(("save", iteration, checkpoint.is_dir()))

    def on_train_end(self, trainer, result):
        self.calls.append(("end", result["iterations"]))


def test_trainer_on_a_model_object_with_all_linear_lora(tmp_path, tiny_model):
    """A loaded model (the tiny one) is trained as that very object, "all-linear" reaches the MLP, the hooks
    run in order, the user's reward is logged, and leaving the ``with`` block frees the run folder."""
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from udpo.training import run_lock

    model_path = tiny_model
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    args = udpo.UDPOConfig(
        output_dir=str(tmp_path / "run"),
        n_agents=2,
        rounds=1,
        max_tokens=8,
        questions_per_iteration=2,
        max_iterations=1,
        debates_per_question=1,
        eval_questions=2,
        eval_steps=0,
        save_steps=1,
        progress=False,
        **{k: [0.5, 0.5] for k in ("alpha", "beta", "gamma", "lambda_", "eta")},  # no calibration
    )
    recorder = Recorder()
    with udpo.UDPOTrainer(
        model=model,
        processing_class=AutoTokenizer.from_pretrained(model_path),
        args=args,
        train_dataset=TRAIN,
        eval_dataset=TEST,
        reward_funcs=[brevity],
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"),
        callbacks=[recorder],
    ) as trainer:
        assert trainer.policy.models[model_path].get_base_model() is model
        # PEFT names the modules all-linear matched by their last name (older releases) or full path (0.21)
        matched = {name.rsplit(".", 1)[-1] for name in trainer.policy.lora.target_modules}
        assert {"gate_proj", "up_proj", "down_proj", "q_proj"} <= matched
        assert trainer.config.task == "dataset" and trainer.config.reward_functions == [f"{__name__}:brevity"]
        assert [q.gold for q in trainer.eval_set] == ["2", "4"]
        result = trainer.train()
        assert run_lock.locked(trainer.run_dir)
    assert not run_lock.locked(trainer.run_dir)
    assert recorder.calls == [
        ("begin",),
        ("evaluate", 0, True),
        ("save", 0, True),
        ("iteration", 1, True),
        ("save", 1, True),
        ("evaluate", 1, True),
        ("end", 1),
    ]
    assert result["iterations"] == 1 and "accuracy" in result["after"]
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["lora_target_modules"] == ["all-linear"] and saved["task"] == "dataset"
