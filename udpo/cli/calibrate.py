"""``udpo calibrate --config recipes/x.yaml [--field value ...]``: the warm-up calibration of a recipe alone.

Debates the recipe's warm-up questions, calibrates the per-agent reward coefficients (docs/metrics.md,
"Agent-tailored coefficients") and writes ``OUTPUT_DIR/calibration.json`` and
``OUTPUT_DIR/trajectories/warmup.jsonl``, without training.
Other runs then share that one calibration with ``calibration_file: OUTPUT_DIR/calibration.json``
(a study's runs differ in their trained weights, not in coefficients drawn from a few noisy warm-up
debates). Arguments are config fields, as for ``udpo train``. With ``--correctness_floor true`` it also prints
``lambda*`` and each ``lambda_`` before and after the floor (docs/metrics.md, "The correctness floor"); such a
file is no ``calibration_file`` (the runs set the floor themselves).
"""

from __future__ import annotations

import argparse
import sys


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate",
        help="calibrate a recipe's reward coefficients on its warm-up debates, without training",
        description="Warm-up calibration alone: writes OUTPUT_DIR/calibration.json for calibration_file. "
        "Arguments are config fields: --config RECIPE.yaml, then --field value overrides.",
        add_help=False,
        prefix_chars="\0",
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="--config FILE and --field value overrides")
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace) -> None:
    from udpo.config import ConfigError, parse_config

    args.config = parse_config(args.args, prog="udpo calibrate", require_config=True)
    if args.config.algorithm != "udpo" or args.config.calibration_file is not None:
        raise ConfigError(
            "udpo calibrate calibrates udpo's coefficients: algorithm udpo, no calibration_file"
        )


def run(args: argparse.Namespace) -> int:
    from udpo.env.jsonl import write_json
    from udpo.env.run_folder import RunFolder
    from udpo.training import calibration
    from udpo.training.trainer import Trainer

    trainer = Trainer(args.config)
    try:
        trainer.run_dir.mkdir(parents=True, exist_ok=True)
        trainer.rollouts.sync_adapters(0)
        record, _ = trainer.calibrate()
        if trainer.main:
            path = RunFolder(trainer.run_dir).calibration
            write_json(path, record)
            print(calibration.describe(record), file=sys.stderr)
            print(f"wrote {path}")
    finally:
        trainer.close()
    return 0
