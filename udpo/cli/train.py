"""``udpo train --config recipes/x.yaml [--field value ...]``: the same as ``python train_udpo.py``.

Everything after ``train`` goes to :func:`udpo.config.parse_config` (TRL's parser: YAML recipe plus
command-line overrides), so ``udpo train --help`` lists every config field.
"""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a team of debating agents (UDPO) from a YAML recipe",
        description="Train per-agent LoRA adapters with UDPO. Arguments are config fields: "
        "--config RECIPE.yaml, then --field value overrides. Run `udpo train --help` for the fields.",
        add_help=False,  # --help is answered by the config parser, which knows every field
        prefix_chars="\0",  # take every argument as it is and hand it on
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="--config FILE and --field value overrides")
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace) -> None:
    """Read and check the config (recipe, overrides, paths) before torch is imported and threads are
    chosen: a mistake answers at once, and a recipe's ``env:`` (e.g. OMP_NUM_THREADS) is set in time."""
    from udpo.config import parse_config

    args.config = parse_config(args.args, prog="udpo train", require_config=True)


def run(args: argparse.Namespace) -> int:
    from udpo.training.trainer import train

    if getattr(args, "config", None) is None:
        check(args)
    train(args.config)
    return 0
