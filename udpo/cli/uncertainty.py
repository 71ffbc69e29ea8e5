"""``udpo uncertainty``: DiverseAgentEntropy or self-consistency uncertainty, with abstention, on a QA task."""

from __future__ import annotations

import argparse

from udpo.analysis.uncertainty_eval import format_table, summarize_uncertainty
from udpo.env.backends import SamplingParams
from udpo.env.protocols.diverse_agent_entropy import DAEConfig, DiverseAgentEntropy, SCConfig, SelfConsistency
from udpo.env.runs import previous_debates, run_to_folder
from udpo.env.seeds import seed_everything

from .argtypes import field_option, positive_int
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

METHODS = ("diverse-agent-entropy", "self-consistency")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "uncertainty",
        help="estimate answer uncertainty (DiverseAgentEntropy or self-consistency) and abstain",
        description="Estimate the model's uncertainty per question and write OUTPUT_DIR/trajectories.jsonl and "
        "OUTPUT_DIR/summary.json: AUROC of the entropy against wrong answers, and accuracy, abstention rate, "
        "correctness and truthfulness under the strict and loose thresholds (and SC(3/5) for "
        "self-consistency).",
    )
    p.add_argument(
        "--method", default="diverse-agent-entropy", choices=METHODS, help="(default: %(default)s)"
    )
    add_task_args(p)
    add_backend_args(p)
    g = p.add_argument_group("method")
    debate_option(g, "n_agents", default=DAEConfig.n_agents, help="DiverseAgentEntropy: agents n")
    g.add_argument(
        "--max-rounds",
        type=positive_int,
        default=DAEConfig.max_rounds,
        help="DiverseAgentEntropy: round cap R* (default: %(default)s)",
    )
    g.add_argument(
        "--aspects",
        type=positive_int,
        default=DAEConfig.n_aspects,
        help="DiverseAgentEntropy: perspectives asked for (default: %(default)s)",
    )
    g.add_argument(
        "--per-aspect",
        type=positive_int,
        default=DAEConfig.per_aspect,
        help="DiverseAgentEntropy: questions per perspective (default: %(default)s)",
    )
    g.add_argument(
        "--samples",
        type=positive_int,
        default=SCConfig.samples,
        help="self-consistency: samples k (default: %(default)s)",
    )
    g.add_argument(
        "--min-votes",
        type=positive_int,
        default=SCConfig.min_votes,
        help="self-consistency: SC(m/k) majority m (default: %(default)s)",
    )
    g.add_argument("--cluster-judge", action="store_true", help="also merge answers an LLM judges equivalent")
    add_sampling_args(g)
    debate_option(g, "debate_batch_size", default=DAEConfig.batch_size)
    field_option(
        p, "output_dir", default="runs/uncertainty", help="output folder (default: runs/uncertainty)"
    )
    p.add_argument("--resume", action="store_true", help="continue an interrupted run in --output-dir")
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace) -> None:
    """The checks made before torch and the model load (the CLI runs it first; ``run`` repeats it)."""
    check_run_args(args)
    if args.method == "self-consistency" and args.min_votes > args.samples:
        raise ValueError(f"--min-votes {args.min_votes} cannot exceed --samples {args.samples}")
    previous_debates(args.output_dir, args.resume)  # refused before the model loads


def run(args: argparse.Namespace) -> int:
    check(args)
    note = resolve_max_tokens(args)
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens)
    common = {
        "sampling": sampling,
        "cluster_judge": args.cluster_judge,
        "batch_size": args.debate_batch_size,
        "seed": args.seed,
    }
    if args.method == "diverse-agent-entropy":
        config = DAEConfig(
            n_agents=args.n_agents,
            max_rounds=args.max_rounds,
            n_aspects=args.aspects,
            per_aspect=args.per_aspect,
            **common,
        )
        method_args = {"agents": args.n_agents, "max_rounds": args.max_rounds}  # summary keys as before
    else:
        config = SCConfig(samples=args.samples, min_votes=args.min_votes, **common)
        method_args = {"samples": args.samples, "min_votes": args.min_votes}
    seed_everything(args.seed)
    task, questions = load_questions(args)
    meta = {
        "method": args.method.replace("-", "_"),
        "task": args.task,
        "model": args.model,
        "backend": args.backend,
        "split": args.split,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
        **method_args,
    }
    say(note)  # the default chosen, now that nothing is refused early
    with backend_from_args(args) as backend:
        cls = DiverseAgentEntropy if args.method == "diverse-agent-entropy" else SelfConsistency
        procedure = cls(task, backend, config, meta=meta)
        _, summary = run_to_folder(
            procedure.run,
            questions,
            summarize_uncertainty,
            out_dir=args.output_dir,
            meta=meta,
            resume=args.resume,
        )
    print(format_table(summary))
    print(f"wrote {args.output_dir}/trajectories.jsonl and {args.output_dir}/summary.json")
    return 0
