"""``udpo detect``: error detection with ColMAD, CopMAD, Ensemble or a single agent; per-task F1/F2 tables."""

from __future__ import annotations

import argparse
import json

from udpo.analysis.detection import comparison_table, format_table, load_summary, summarize_detection
from udpo.env.backends import SamplingParams, backend_capabilities
from udpo.env.debate import AgentSpec
from udpo.env.protocols.error_detection import PROTOCOLS, DetectionConfig, binary_labels, make_detector
from udpo.env.runs import previous_debates, run_to_folder
from udpo.env.seeds import seed_everything

from .argtypes import existing_path, field_option, positive_int
from .common import (
    add_backend_args,
    add_sampling_args,
    add_task_args,
    backend_from_args,
    check_run_args,
    debate_option,
    load_questions,
    resolve_max_tokens,
    say,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "detect",
        help="detect errors in LLM responses with ColMAD or a baseline protocol",
        description="Run an error-detection protocol (ColMAD: two collaborating debaters and a judge, with "
        "the agreement shortcut; CopMAD: zero-sum debate with assigned sides; ensemble; single agent) and "
        "write OUTPUT_DIR/trajectories.jsonl and OUTPUT_DIR/summary.json with precision, recall, F1 and F2 ('error' "
        "positive) per task and their mean. With --compare, print the table of finished runs instead.",
    )
    p.add_argument("--protocol", default="colmad", choices=list(PROTOCOLS), help="(default: colmad)")
    add_task_args(p, default_task="realmistake")
    add_backend_args(p)
    g = p.add_argument_group("protocol")
    debate_option(g, "rounds", default=DetectionConfig.rounds)
    add_sampling_args(g)
    g.add_argument(
        "--word-limit",
        type=positive_int,
        default=DetectionConfig.word_limit,
        help="words asked per debate turn (default: %(default)s)",
    )
    debate_option(g, "debate_batch_size", default=DetectionConfig.batch_size)
    g.add_argument(
        "--debater-models",
        default=None,
        help="openai backend: served models of debaters A,B (default: --model for both)",
    )
    g.add_argument("--judge-model", default=None, help="openai backend: served model of the judge")
    field_option(p, "output_dir", default="runs/detect", help="output folder (default: runs/detect)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in --output-dir")
    p.add_argument(
        "--compare",
        nargs="+",
        type=existing_path,
        metavar="RUN",
        default=None,
        help="print a Markdown table of the F1/F2 of finished run folders and exit",
    )
    p.set_defaults(func=run, check=check)


def role_models(args: argparse.Namespace) -> list[str | None]:
    """The debaters' served models (per-role models only with the openai backend); ValueError otherwise."""
    models = [m.strip() for m in args.debater_models.split(",")] if args.debater_models else [None, None]
    if len(models) != 2:
        raise ValueError(f"--debater-models needs two comma-separated names, got {args.debater_models!r}")
    if (args.debater_models or args.judge_model) and not backend_capabilities(
        args.backend
    ).serves_several_models:
        raise ValueError(
            f"--debater-models and --judge-model need a backend that serves several models, such as openai "
            f"(the {args.backend} backend serves one)"
        )
    return models


def config_from_args(args: argparse.Namespace) -> DetectionConfig:
    """The protocol settings of the command line (``--max-tokens`` resolved: :func:`resolve_max_tokens`)."""
    models = role_models(args)
    return DetectionConfig(
        rounds=args.rounds,
        sampling=SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens),
        debaters=[AgentSpec(model=m) for m in models],
        judge=AgentSpec(model=args.judge_model),
        word_limit=args.word_limit,
        batch_size=args.debate_batch_size,
        seed=args.seed,
    )


def check(args: argparse.Namespace) -> None:
    """The checks made before torch and the model load (the CLI runs it first; ``run`` repeats it)."""
    if args.compare:
        return
    check_run_args(args)
    role_models(args)
    previous_debates(args.output_dir, args.resume)  # refused before the model loads


def run(args: argparse.Namespace) -> int:
    if args.compare:
        print(comparison_table([load_summary(r) for r in args.compare], labels=args.compare))
        return 0
    check(args)
    note = resolve_max_tokens(args)
    config = config_from_args(args)
    seed_everything(args.seed)
    task, questions = load_questions(args)
    positive, _ = binary_labels(task)
    meta = {
        "protocol": args.protocol,
        "task": args.task,
        "model": args.model,
        "backend": args.backend,
        "split": args.split,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
    }
    say(note)  # the default chosen, now that nothing is refused early
    with backend_from_args(args) as backend:
        detector = make_detector(args.protocol, task, backend, config, meta=meta)
        _, summary = run_to_folder(
            detector.run,
            questions,
            lambda ts: summarize_detection(ts, positive),
            out_dir=args.output_dir,
            meta=meta,
            resume=args.resume,
        )
    print(format_table(summary))
    print(json.dumps({k: summary[k] for k in ("n_items", "judge_calls")}))
    print(f"wrote {args.output_dir}/trajectories.jsonl and {args.output_dir}/summary.json")
    return 0
