"""Code a recipe, a flag or the API names as ``package.module:name`` (``task``, ``reward_functions``,
``eval_callbacks``, ``--task``) goes through one resolver, :mod:`udpo.env.imports` (issue 41): a hostile
name is refused with one line naming the field, before anything it names is called. Whatever would run
writes ``MARKER`` into the working directory (or deletes the ``victim`` folder): its absence is the proof.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_hostile_config import one_line, train_udpo_main
from train_helpers import TINY

from udpo.algorithms.reward_functions import load_reward_functions
from udpo.cli import main as udpo_main
from udpo.config import ConfigError, TrainConfig
from udpo.env.imports import SpecError, in_stdlib, load_callable
from udpo.env.tasks import Question, Task, get_task, register_task, task_parameters
from udpo.training.callbacks import load_callbacks

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
THIS = __name__
HARM = "echo recipe-code-ran > MARKER"

#: names that must never be called, with the task_options that would do harm if they were
HOSTILE = {
    "os:system": {"command": HARM},
    "subprocess:call": {"args": HARM, "shell": True},
    "builtins:exec": {},
    "builtins:eval": {},
    "shutil:rmtree": {"path": "victim"},
    "importlib:import_module": {"package": "untrusted_code"},
    "untrusted_code:WritesMarker": {},  # a class whose __init__ writes MARKER, not a task
    "untrusted_code:system": {"command": HARM},  # os.system imported into a module outside the stdlib
    "untrusted_code:call": {"args": HARM, "shell": True},  # subprocess.call, likewise
}
FIELDS = ("task", "reward_functions", "eval_callbacks")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """The working directory of a hostile run: MARKER would land here, ``victim`` must survive it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "keep.txt").write_text("mine")
    return tmp_path


def untouched(folder: Path) -> bool:
    return not (folder / "MARKER").exists() and (folder / "victim" / "keep.txt").is_file()


def hostile_recipe(folder: Path, field: str, spec: str) -> Path:
    """The tiny recipe with ``spec`` in ``field``; the model is a decoy folder no library can load."""
    decoy = folder / "decoy_model"
    decoy.mkdir(exist_ok=True)
    (decoy / "config.json").write_text("{}")
    named = {"task": spec, "task_options": HOSTILE[spec]} if field == "task" else {field: [spec]}
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump({**TINY, "model": str(decoy), **named}))
    return path


# --- through both training entry points, in this process --------------------------------------------
@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("spec", sorted(HOSTILE))
def test_hostile_names_are_refused_by_both_training_entry_points(workdir, monkeypatch, capsys, field, spec):
    path = hostile_recipe(workdir, field, spec)
    out = str(workdir / "run")
    assert udpo_main(["train", "--config", str(path), "--output_dir", out]) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"udpo train: error: {field}: ") and repr(spec) in line and "refused" in line, line
    monkeypatch.setattr(sys, "argv", ["train_udpo.py", "--config", str(path), "--output_dir", out])
    assert train_udpo_main()() == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"train_udpo.py: error: {field}: ") and repr(spec) in line, line
    assert untouched(workdir) and not (workdir / "run").exists()


# --- through the library and the commands' --task ---------------------------------------------------
@pytest.mark.parametrize("spec", sorted(HOSTILE))
def test_hostile_names_are_refused_by_every_loader(workdir, spec):
    loaders = {
        "task": [
            lambda: get_task(spec, **HOSTILE[spec]),
            lambda: task_parameters(spec),
            lambda: TrainConfig(task=spec, task_options=HOSTILE[spec], output_dir="run"),
        ],
        "reward_functions": [lambda: load_reward_functions([spec])],
        "eval_callbacks": [lambda: load_callbacks([spec])],
    }
    for field, calls in loaders.items():
        for call in calls:
            with pytest.raises(ValueError) as e:
                call()
            assert isinstance(e.value, SpecError | ConfigError)
            assert str(e.value).startswith(f"{field}: ") and "\n" not in str(e.value), str(e.value)
    assert untouched(workdir)


@pytest.mark.parametrize("spec", ["os:system", "untrusted_code:WritesMarker"])
def test_a_commands_task_flag_is_refused(workdir, capsys, spec):
    with pytest.raises(SystemExit) as e:
        udpo_main(["debate", "--task", spec, "--output-dir", str(workdir / "run")])
    assert e.value.code == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith("udpo debate: error: argument --task: task: ") and repr(spec) in line, line
    assert untouched(workdir)


def test_a_standard_library_module_is_refused_before_it_is_imported():
    assert "this" not in sys.modules  # importing it prints the Zen of Python
    with pytest.raises(
        SpecError, match="reward_functions: 'this:s' names the standard library module 'this'"
    ):
        load_callable("reward_functions", "this:s")
    assert "this" not in sys.modules
    assert in_stdlib("os.path") and in_stdlib("posix") and in_stdlib("builtins") and in_stdlib(None)
    assert not in_stdlib("udpo.env") and not in_stdlib(THIS)


# --- what stays allowed ------------------------------------------------------------------------------
class Doubled:
    """A reward term as a class: built without arguments, its instances called."""

    def __init__(self) -> None:
        self.factor = 2.0

    def __call__(self, trajectory, agent: int) -> float:
        return self.factor * agent


class Listen:
    """An eval callback as a class."""

    def __call__(self, trainer, iteration: int) -> dict:
        return {"listened": iteration}


class Tiny(Task):
    name = "tiny"

    def load(self, split="test", data_path=None, limit=None, seed=0):
        return [Question(id="q", text="1+1?", gold="2")]

    def format_instruction(self, question):
        return "Answer."

    def parse(self, text, question):
        return text.strip() or None


TINY_TASK = Tiny()


def make_tiny(**options) -> Tiny:
    return Tiny()


def test_functions_callable_classes_and_tasks_still_load():
    (term,) = load_reward_functions([f"{THIS}:Doubled"])
    assert isinstance(term.fn, Doubled) and term.name == f"{THIS}:Doubled" and term.fn(None, 3) == 6.0
    (callback,) = load_callbacks([f"{THIS}:Listen"])
    assert callback(None, 4) == {"listened": 4}
    assert load_callbacks(["udpo.algorithms.reward_functions:concise"])[0].__name__ == "concise"
    assert isinstance(get_task(f"{THIS}:Tiny"), Tiny)
    assert get_task(f"{THIS}:TINY_TASK") is TINY_TASK
    with pytest.raises(SpecError, match="is a function, not a subclass of udpo.env.tasks.Task"):
        get_task(f"{THIS}:make_tiny")  # a factory by import path would be a function called with options
    register_task("tiny-factory", make_tiny)  # registered in Python, it is trusted
    assert isinstance(get_task("tiny-factory"), Tiny)


# --- real processes ----------------------------------------------------------------------------------
MINIMAL = 'task: os:system\ntask_options: {command: "echo recipe-code-ran > MARKER"}\n'  # the recipe


@pytest.mark.slow
@pytest.mark.parametrize(
    ("text", "field"),
    [
        (MINIMAL, "task"),
        ("task: untrusted_code:WritesMarker\ntask_options: {}\n", "task"),
        ("reward_functions: [untrusted_code:WritesMarker]\n", "reward_functions"),
    ],
)
@pytest.mark.parametrize("entry", ["udpo", "script"])
def test_entry_points_in_a_real_process(workdir, text, field, entry):
    (workdir / "minimal.yaml").write_text(text)
    udpo = [str(Path(sys.executable).with_name("udpo")), "train"]  # the console script of this environment
    cmd = udpo if entry == "udpo" else [sys.executable, str(REPO / "train_udpo.py")]
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "UDPO_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [*cmd, "--config", "minimal.yaml", "--output_dir", "run"],
        capture_output=True,
        text=True,
        env=env,
        cwd=workdir,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    line = one_line(result.stderr)
    prog = "udpo train" if entry == "udpo" else "train_udpo.py"
    assert line.startswith(f"{prog}: error: {field}: ") and "refused" in line, line
    assert untouched(workdir) and not (workdir / "run").exists()
