"""The ``udpo`` command: one subcommand per module in ``udpo.cli``.

Each command module defines ``add_parser(subparsers)`` (registering its arguments and setting
``func``, and ``check`` for the argument checks argparse cannot make alone); the CLI only parses and
calls library functions. Order: parse (``type=`` checks), ``check(args)``, choose threads (imports
torch), ``func(args)``: a mistake on the command line is answered before anything heavy is imported.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from udpo.threads import configure_threads

COMMANDS = (
    "debate",
    "detect",
    "uncertainty",
    "diagnose",
    "train",
    "calibrate",
    "eval",
    "compare",
    "study",
    "export",
    "report",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="udpo", description="Train and evaluate teams of debating LLM agents."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"udpo.cli.{name}").add_parser(sub)
    for command in sub.choices.values():  # whole flags only: a removed name such as --compromised must not
        command.allow_abbrev = False  # be read as the start of another (--compromised-agents)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check = getattr(args, "check", None)  # a command's cheap checks, before torch and models load
        if check is not None:
            check(args)
        if getattr(args, "uses_torch", True):  # a command that never imports torch sets uses_torch=False
            configure_threads()
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted; trajectories written so far are complete", file=sys.stderr)
        return 130
    except (ValueError, OSError, RuntimeError) as e:
        print(f"udpo {args.command}: error: {e}", file=sys.stderr)
        return 2
