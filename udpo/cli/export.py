"""``udpo export``: a checkpoint's adapters (and optionally merged models) plus a team manifest."""

from __future__ import annotations

import argparse

from udpo.training.export import export_team, find_checkpoint


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export a trained team's adapters (or merged models) for serving",
        description="Write OUT/adapters/<name> (PEFT adapters, loadable by PeftModel and vLLM LoRARequest) "
        "and OUT/team.json; with --merge also OUT/merged/<name> (full models for AutoModelForCausalLM).",
    )
    p.add_argument(
        "checkpoint",
        help="checkpoint folder (with team.json) or run directory (latest checkpoint)",
    )
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--merge", action="store_true", help="also write one merged full model per adapter")
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "fp32", "bf16", "fp16"],
        help="dtype of merged models (default: auto, the base model's stored dtype)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace) -> None:
    """The checks made before torch loads (the CLI runs it first): the checkpoint holds a team."""
    find_checkpoint(args.checkpoint)


def run(args: argparse.Namespace) -> int:
    team = export_team(
        args.checkpoint, args.out, merge=args.merge, dtype=args.dtype, overwrite=args.overwrite
    )
    for agent in team.agents:
        where = agent.merged or agent.adapter
        print(f"{agent.name}: {args.out}/{where}")
    print(f"wrote {args.out}/team.json ({team.n_agents} agents, base model {team.base_model})")
    return 0
