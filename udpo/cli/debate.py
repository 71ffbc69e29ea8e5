"""``udpo debate``: run a multi-agent debate (Standard MAD or another protocol) on a task and write
trajectories + summary."""

from __future__ import annotations

import argparse
import json

from udpo.env.protocols import build_protocol
from udpo.env.runs import previous_debates
from udpo.env.seeds import seed_everything
from udpo.env.summary import run_debates
from udpo.training.run_lock import held

from .argtypes import field_option
from .common import (
    add_backend_args,
    add_debate_args,
    add_protocol_args,
    add_task_args,
    backend_from_args,
    check_run_args,
    debate_config_from_args,
    load_questions,
    protocol_config_from_args,
    resolve_max_tokens,
    say,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "debate",
        help="run a multi-agent debate on a task",
        description="Run multi-agent debate (Standard MAD of Du et al., or --protocol sparse, random, dig, "
        "digra, interventions) and write OUTPUT_DIR/trajectories.jsonl and OUTPUT_DIR/summary.json.",
    )
    add_task_args(p)
    add_backend_args(p)
    add_debate_args(p)
    add_protocol_args(p)
    field_option(p, "output_dir", default="runs/debate", help="output folder (default: runs/debate)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in --output-dir")
    p.add_argument(
        "--no-progress",
        "--no_progress",
        dest="progress",
        action="store_false",
        help="hide the progress line (rounds, agents' turns, tokens, tokens/s, time left)",
    )
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace) -> None:
    """The checks made before torch and the model load (the CLI runs it first; ``run`` repeats it)."""
    check_run_args(args)
    protocol_config_from_args(args)
    if not args.resume:
        previous_debates(args.output_dir, resume=False)  # an --output-dir that holds debates is refused


def run(args: argparse.Namespace) -> int:
    with held(args.output_dir, resume="--resume"):  # one process writes --output-dir at a time
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    check(args)
    protocol_config = protocol_config_from_args(args)
    note = resolve_max_tokens(args)
    config = debate_config_from_args(args)
    meta = {
        "task": args.task,
        "model": args.model,
        "backend": args.backend,
        "split": args.split,
        "n_agents": args.n_agents,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "seed": args.seed,
    }
    previous_debates(args.output_dir, args.resume, config, meta)  # refused before the model loads
    seed_everything(args.seed)
    task, questions = load_questions(args)
    say(note)  # the default chosen, now that nothing is refused early
    with backend_from_args(args) as backend, build_protocol(protocol_config, task, backend) as protocol:
        meta["protocol"] = protocol.describe()
        _, summary = run_debates(
            task,
            backend,
            questions,
            config,
            out_dir=args.output_dir,
            meta=meta,
            protocol=protocol,
            resume=args.resume,
            progress=args.progress,
        )
    shown = {
        k: summary[k] for k in ("n_questions", "accuracy", "u_intra", "u_inter", "u_sys", "unparsed_rate")
    }
    print(json.dumps(shown, indent=2))
    print(f"wrote {args.output_dir}/trajectories.jsonl and {args.output_dir}/summary.json")
    return 0
