"""``udpo export``: a checkpoint's adapters (and optionally merged models) plus a team manifest."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from udpo.training.export import export_team, find_checkpoint


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export a trained team's adapters (or merged models) for serving",
        description="Write OUT/adapters/<name> (PEFT adapters, loadable by PeftModel and vLLM LoRARequest) "
        "with a model card each, and OUT/team.json; with --merge also OUT/merged/<name> (full models for "
        "AutoModelForCausalLM). The adapters name their base as other machines find it: a Hub id, a folder as "
        "given, the packaged SmolLM2 by its Hub id (the card says it was trained on the de-quantized GGUF).",
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
    p.add_argument(
        "--base-model",
        "--base_model",
        action="append",
        metavar="[MODEL=]NAME",
        help="the base model the adapters and cards name (a folder or Hub id where they are loaded); "
        "MODEL=NAME for one base of a team with several (repeat); team.json keeps the base trained on",
    )
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace) -> None:
    """The checks made before torch loads (the CLI runs it first): the checkpoint holds a team, and
    ``--base-model`` is one name or MODEL=NAME pairs."""
    find_checkpoint(args.checkpoint)
    base_models(args.base_model)


def base_models(given: list[str] | None) -> str | dict[str, str] | None:
    """``--base-model`` values: one plain NAME, or MODEL=NAME pairs."""
    if not given:
        return None
    pairs = [g.partition("=") for g in given]
    if len(given) == 1 and not pairs[0][1]:
        return given[0]
    if any(not sep or not model or not name for model, sep, name in pairs):
        raise ValueError("--base-model: give one NAME, or MODEL=NAME for each base model it renames")
    return {model: name for model, _, name in pairs}


def run(args: argparse.Namespace) -> int:
    team = export_team(
        args.checkpoint,
        args.out,
        merge=args.merge,
        dtype=args.dtype,
        overwrite=args.overwrite,
        base_models=base_models(args.base_model),
    )
    for agent in team.agents:
        print(f"{agent.name}: {os.path.join(args.out, agent.merged or agent.adapter)}")
    configs = {Path(args.out, a.adapter, "adapter_config.json") for a in team.agents}
    named = dict.fromkeys(json.loads(c.read_text())["base_model_name_or_path"] for c in sorted(configs))
    print(
        f"wrote {os.path.join(args.out, 'team.json')} ({team.n_agents} agents, base model {team.base_model}; "
        f"the adapters name {', '.join(named)})"
    )
    return 0
