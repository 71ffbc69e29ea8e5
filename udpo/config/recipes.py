"""Recipes and the command line: a YAML file of ``field: value`` lines (aliases refused, ``env:`` set in
the process), ``--field value`` overrides (:func:`config_parser`), and the reference tables of
docs/training.md."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Sequence
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from .groups import ConfigError
from .train import GROUPS, TrainConfig, _coerce, _types, _unwrap_optional


def unknown_key_error(keys: Sequence[str], where: str) -> ConfigError:
    known = [f.name for f in fields(TrainConfig)]
    parts = []
    for key in keys:
        close = difflib.get_close_matches(key, known, n=1)
        parts.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return ConfigError(
        f"{where}: unknown config key(s) {', '.join(parts)}; "
        f"see `udpo train --help` or docs/training.md for the fields"
    )


class _NoAliases(Exception):
    """A YAML alias (``*name``) in a recipe; carries where it is."""


def _recipe_loader():
    """PyYAML's safe loader without aliases: ``*name`` can expand a few lines into billions of values
    (a "billion laughs" recipe would hang the parser), and a recipe never needs them."""
    import yaml

    class RecipeLoader(yaml.SafeLoader):
        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                raise _NoAliases(self.peek_event().start_mark)
            return super().compose_node(parent, index)

    return RecipeLoader


def read_yaml(path: str | Path, what: str = "a recipe") -> Any:
    """The YAML of a recipe (or a compare config: ``what``), parsed with aliases refused (see
    ``_recipe_loader``) and a byte-order mark accepted; a ConfigError names the file and line."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        return yaml.load(path.read_text(encoding="utf-8-sig"), Loader=_recipe_loader())
    except _NoAliases as e:
        raise ConfigError(
            f"{path}:{e.args[0].line + 1}: YAML aliases (*name) are not allowed in {what}; write the "
            f"value out"
        ) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        what = " ".join(str(x) for x in (e.context, e.problem) if x)
        raise ConfigError(f"{where}: not valid YAML ({what})") from None
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as e:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(e).split())[:300]})") from None


def apply_env(recipe: dict[str, Any]) -> None:
    """Set the recipe's ``env:`` variables in this process (before torch reads them)."""
    for key, value in recipe.get("env", {}).items():
        os.environ[key] = str(value)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping of a recipe file, with unknown keys reported by name (``env:`` sets variables, see
    :func:`apply_env`). An empty file means all defaults."""
    path = Path(path)
    data = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a recipe must be a mapping of field: value, got {type(data).__name__}")
    known = {f.name for f in fields(TrainConfig)} | {"env"}
    unknown = [k for k in data if k not in known]
    if unknown:
        raise unknown_key_error(unknown, str(path))
    hints = _types()
    for key, value in data.items():
        if key != "env":
            _coerce(f"{path}: {key}", value, hints[key])
    env = data.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str | int | float | bool) for k, v in env.items()
    ):
        raise ConfigError(f"{path}: env must be a mapping of variable names to values, got {env!r:.80}")
    return data


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a field's default once: only where its help does not already say it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default is None or isinstance(action, argparse._StoreFalseAction):
            return text  # a --no_FIELD switch: its default is that of --FIELD
        return super()._get_help_string(action)


def parse_config(
    argv: Sequence[str] | None = None, prog: str | None = None, require_config: bool = False
) -> TrainConfig:
    """``--config FILE`` plus ``--field value`` overrides (the command line wins) -> TrainConfig.

    The recipe is read once, by :func:`load_yaml`; its ``env:`` variables are set, its values become the
    parser's defaults. The result is validated (``TrainConfig.validate``), the functions it names checked
    (``TrainConfig.check_imports``) and its paths checked (``TrainConfig.check_paths``) before anything
    loads. ``--help`` prints every field and exits.
    ``require_config``: refuse to run without ``--config`` (the training entry points: a run of every
    default is rarely what was meant).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    recipe: dict[str, Any] = {}
    given = "--config" in args
    if given:
        at = args.index("--config")
        if at + 1 >= len(args):
            raise ConfigError("--config needs a YAML file path")
        recipe = load_yaml(args[at + 1])
        del args[at : at + 2]
    flags = [a.split("=", 1)[0][2:].replace("-", "_") for a in args if a.startswith("--")]
    known = {f.name for f in fields(TrainConfig)} | {"help"} | {f"no_{f.name}" for f in fields(TrainConfig)}
    unknown = [f for f in flags if f not in known]
    if unknown:
        raise unknown_key_error(unknown, "command line")
    if require_config and not given and "help" not in flags and "-h" not in args:
        raise ConfigError(
            "no --config given: name a recipe, e.g. --config recipes/quickstart.yaml, then --field value "
            "overrides (an empty recipe file trains with every default)"
        )
    apply_env(recipe)
    recipe.pop("env", None)
    parser = config_parser(prog)
    parser.set_defaults(**recipe)  # the recipe's values become the defaults the command line overrides
    values = {k: v for k, v in vars(parser.parse_args(args)).items() if k != "config"}
    try:
        config = TrainConfig(**values)
    except ConfigError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if config.reward_weights and not config.reward_functions:
        raise ConfigError(
            f"reward_weights needs one weight per reward_functions entry (0), got {len(config.reward_weights)}"
        )
    config.check_imports()
    config.check_paths()
    return config


def config_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The command line of a training config: ``--config RECIPE.yaml``, then ``--FIELD VALUE`` (also spelled
    ``--FIELD-NAME``) for every field. A list field takes one or more values; a true/false field alone means
    true, and one that defaults to true has ``--no_FIELD``. Values stay text here: ``TrainConfig`` coerces
    and checks them as it does a recipe's, so a bad value fails before torch or transformers load."""
    parser = argparse.ArgumentParser(prog=prog, formatter_class=_HelpFormatter)
    parser.add_argument(
        "--config",
        metavar="RECIPE.yaml",
        help="YAML recipe of config fields (recipes/); the --field options below override it",
    )
    hints = _types()
    for f in fields(TrainConfig):
        inner, _ = _unwrap_optional(hints[f.name])
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        names = [f"--{f.name}", *([f"--{f.name.replace('_', '-')}"] if "_" in f.name else [])]
        options: dict[str, Any] = {"dest": f.name, "default": default, "help": f.metadata.get("help")}
        if get_origin(inner) is list:
            options.update(nargs="+", metavar=f.name.upper())
        elif inner is bool:
            options.update(nargs="?", const="true", metavar="true|false")
            if default is True:
                parser.add_argument(
                    f"--no_{f.name}",
                    f"--no-{f.name.replace('_', '-')}",
                    dest=f.name,
                    action="store_const",
                    const="false",
                    default=argparse.SUPPRESS,  # the field's default is --FIELD's
                    help=f"turn --{f.name} off",
                )
        elif get_origin(inner) is Literal:
            options.update(choices=[str(c) for c in get_args(inner)])
        else:
            options.update(metavar=f.name.upper())
        parser.add_argument(*names, **options)
    return parser


def reference_markdown() -> str:
    """The config reference (field, default, meaning) generated from the dataclasses, one table per group."""
    parts = []
    for group in GROUPS:
        rows = [
            f"**`{group.__name__}`**: {group.__doc__}",
            "",
            "| field | default | meaning |",
            "|---|---|---|",
        ]
        for f in fields(group):
            default = f.default_factory() if f.default_factory is not MISSING else f.default
            shown = "null" if default is None else default
            rows.append(f"| `{f.name}` | `{shown}` | {f.metadata['help']} |")
        parts.append("\n".join(rows))
    return "\n\n".join(parts)
