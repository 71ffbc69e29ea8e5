"""Argument groups shared by the commands that run debates (``debate``, ``eval``, ...)."""

from __future__ import annotations

import argparse
import random

import numpy as np

from udpo.env.backends import BACKEND_NAMES, Backend, SamplingParams, make_backend
from udpo.env.debate import DebateConfig
from udpo.env.models import DEFAULT_MODEL
from udpo.env.tasks import TASK_NAMES, Question, Task, get_task


def add_task_args(p: argparse.ArgumentParser, default_task: str | None = None) -> None:
    g = p.add_argument_group("task")
    g.add_argument(
        "--task",
        required=default_task is None,
        default=default_task,
        choices=TASK_NAMES,
        help="benchmark" + (f" (default: {default_task})" if default_task else ""),
    )
    g.add_argument("--split", default="test", help="data split (default: test)")
    g.add_argument("--data", default=None, help="data file, folder in the shared/data layout, or Hub name")
    g.add_argument("--limit", type=int, default=None, help="debate only the first K questions")
    g.add_argument("--seed", type=int, default=0, help="seed for data shuffles and sampling (default: 0)")


def add_backend_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and backend")
    g.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"alias, folder or Hub id (default: {DEFAULT_MODEL})"
    )
    g.add_argument("--backend", default="hf", choices=[b for b in BACKEND_NAMES if b != "scripted"])
    g.add_argument("--device", default=None, help="hf: torch device (default: cuda if available, else cpu)")
    g.add_argument("--dtype", default="auto", help="auto | bf16 | fp16 | fp32 (default: auto)")
    g.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="openai: server URL")
    g.add_argument("--api-key", default=None, help="openai: API key (default: $OPENAI_API_KEY or none)")


def add_debate_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("debate")
    g.add_argument("--agents", type=int, default=3, help="number of agents N (default: 3)")
    g.add_argument(
        "--rounds", type=int, default=2, help="debate rounds T after the initial answer (default: 2)"
    )
    g.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default: 0.7)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default: 1.0)")
    g.add_argument("--max-tokens", type=int, default=256, help="completion length cap (default: 256)")
    g.add_argument("--batch-size", type=int, default=16, help="questions debated together (default: 16)")
    g.add_argument("--early-stop", action="store_true", help="stop a debate once all agents agree")


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_questions(args: argparse.Namespace) -> tuple[Task, list[Question]]:
    task = get_task(args.task)
    questions = task.load(split=args.split, data_path=args.data, limit=args.limit, seed=args.seed)
    if not questions:
        raise ValueError(f"no questions in split {args.split!r} of task {args.task!r}")
    return task, questions


def backend_from_args(args: argparse.Namespace) -> Backend:
    if args.backend == "openai":
        return make_backend("openai", base_url=args.base_url, model=args.model, api_key=args.api_key)
    model = args.model or DEFAULT_MODEL
    if args.backend == "hf":
        return make_backend("hf", model=model, device=args.device, dtype=args.dtype)
    return make_backend("vllm", model=model, seed=args.seed, dtype=args.dtype)


def model_name(args: argparse.Namespace) -> str | None:
    """The model a run used, for its metadata (None: the openai server's default)."""
    return args.model or (None if args.backend == "openai" else DEFAULT_MODEL)


def debate_config_from_args(args: argparse.Namespace) -> DebateConfig:
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens)
    return DebateConfig(
        n_agents=args.agents,
        rounds=args.rounds,
        sampling=sampling,
        early_stop=args.early_stop,
        batch_size=args.batch_size,
    )
