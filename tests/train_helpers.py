"""Tiny training settings shared by the trainer tests (real SmolLM2: seconds per iteration on 2 cores; a
tiny model of ``tiny_models``: a fraction of a second), and a tiny model that answers numbers."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

#: N=2 agents, T=1 round, 16 new tokens, 2 one-digit additions per iteration, one debate each
TINY = {
    "task": "arithmetic",
    "task_options": {"difficulty": 1, "n_questions": 30},
    "n_agents": 2,
    "rounds": 1,
    "max_tokens": 16,
    "questions_per_iteration": 2,
    "debates_per_question": 1,
    "debate_batch_size": 4,
    "learning_rate": 1e-3,
    "warmup_steps": 0,
    "lr_scheduler_type": "constant",
    "eval_questions": 2,
    "save_steps": 1,
    "progress": False,
}
#: explicit coefficients: no warm-up calibration debates
EXPLICIT = {
    "warmup_fraction": 0.0,
    "alpha": [0.3],
    "beta": [0.3],
    "gamma": [0.3],
    "lambda_": [1.0],
    "eta": [0.01],
}


#: one digit-answering model per tokenizer folder and test session (see :func:`digit_model`)
_DIGIT_MODELS: dict[str, str] = {}


def digit_model(tokenizer_path: str, tmp_path_factory) -> str:
    """The tiny random Llama of ``tiny_models`` biased to answer one digit and end its turn
    (``favour=DIGITS``, ``stop_after_favoured=DIGITS_STOP``), built once per session: on one-digit
    additions its agents agree now and then and are sometimes right, so UDPO's rewards, the baselines'
    team rewards and RMAAC's adversary (which swaps parsed answers) have something to work with, where
    the plain tiny model's replies never parse (an all-silent team earns the same reward in every debate).
    """
    if tokenizer_path not in _DIGIT_MODELS:
        from tiny_models import DIGITS, DIGITS_STOP, build_tiny_llama

        _DIGIT_MODELS[tokenizer_path] = build_tiny_llama(
            tmp_path_factory.mktemp("digit_model"),
            tokenizer_path,
            initializer_range=0.3,
            favour=DIGITS,
            stop_after_favoured=DIGITS_STOP,
        )
    return _DIGIT_MODELS[tokenizer_path]


def tiny_config(model_path: str, output_dir: Path, **overrides):
    from udpo.config import TrainConfig

    return TrainConfig(**{**TINY, "model": model_path, "output_dir": str(output_dir), **overrides})


def write_recipe(path: Path, model_path: str, **overrides) -> Path:
    path.write_text(yaml.safe_dump({**TINY, "model": model_path, **overrides}))
    return path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def start(recipe: Path, *extra: str) -> subprocess.Popen:
    """``python train_udpo.py --config recipe ...`` in the background, stdout and stderr together."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, str(REPO / "train_udpo.py"), "--config", str(recipe), *extra]
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@contextlib.contextmanager
def threads_as_started() -> Iterator[None]:
    """torch on as many intra-op threads as ``train_udpo.py`` takes under :func:`start` (UDPO_NUM_THREADS
    when set, else OMP_NUM_THREADS=1): a run in this process then computes the same numbers, to the bit,
    as one started there."""
    import torch

    from udpo.threads import ENV

    before = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get(ENV, "1")))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_here(recipe: Path, *extra: str) -> dict:
    """What ``start(recipe, *extra)`` runs (``train_udpo.py``: the config parsed from the same arguments,
    then ``udpo.training.trainer.train``), in this process (on the same threads) without its imports'
    seconds: for the parts of a test that need no process of their own (a SIGKILL does)."""
    from udpo.config import parse_config
    from udpo.training.trainer import train

    with threads_as_started():
        return train(parse_config(["--config", str(recipe), *extra], require_config=True))


#: the reward function :func:`question_digest`, as a recipe names it
QUESTION_DIGEST = "train_helpers:question_digest"


def question_digest(trajectory, agent: int) -> float:
    """A reward in [0, 1) fixed by the question alone (a digest of its id): different for every question
    of a batch, whatever the team says, so the advantages are never all zero and an update must move
    every adapter. Without it whether a tiny model's debates earn different rewards is luck: its sampled
    answers differ between the fp32 and bf16 paths, and on one of them the two debates of each iteration
    may fall into one reward class (issue 48: both iterations' debates split and wrong under bf16)."""
    return zlib.crc32(trajectory.question_id.encode()) / 2**32


def token_parity(trajectory, agent: int) -> float:
    """Share of even token ids in the agent's last completion: a reward that differs between debates even
    for a tiny random model that never answers right (tests of the update's mechanics use it)."""
    ids = trajectory.turns[agent][-1].completion_ids
    return sum(1 for t in ids if t % 2 == 0) / max(len(ids), 1)


def parity_on_half(trajectory, agent: int) -> float:
    """:func:`token_parity` on the questions whose id has an even digest, 0 on the others: half the
    questions give their debates different rewards, the other half the same (an uninformative group)."""
    return token_parity(trajectory, agent) if informative_question(trajectory.question_id) else 0.0


def informative_question(question_id: str) -> bool:
    """Whether :func:`parity_on_half` can give a question's debates different rewards."""
    return zlib.crc32(question_id.encode()) % 2 == 0
