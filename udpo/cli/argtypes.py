"""argparse ``type=`` functions: a bad value is refused while the command line is parsed, before any
model, engine or torch is imported (``udpo debate --n-agents 0`` answers at once).

Each function takes the text of one argument and returns the value or raises
``argparse.ArgumentTypeError`` with a message argparse prints as ``argument --x: <message>``.
Also the one vocabulary of the flags (docs/cli.md): :func:`field_option` names an option after its
config field (``--n-agents`` / ``--n_agents``, dest ``n_agents``). Only the standard library is imported
here.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "BooleanOption",
    "at_least",
    "config_option",
    "existing_file",
    "existing_path",
    "field_option",
    "finite_float",
    "gpu_memory_share",
    "int_list",
    "nonnegative_float",
    "nonnegative_int",
    "positive_int",
    "probability",
    "seed",
    "top_p",
]

#: seeds numpy, random and torch all accept
SEED_LIMIT = 2**32


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def at_least(minimum: int) -> Callable[[str], int]:
    """An integer >= ``minimum``."""

    def parse(text: str) -> int:
        value = _int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"  # argparse names the type in some messages
    return parse


positive_int = at_least(1)
nonnegative_int = at_least(0)


def seed(text: str) -> int:
    """A seed in [0, 2**32)."""
    value = _int(text)
    if not 0 <= value < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"must be in [0, 2**32), got {value}")
    return value


def finite_float(text: str) -> float:
    """Any finite number."""
    return _float(text)


def nonnegative_float(text: str) -> float:
    """A finite number >= 0 (temperatures, weights)."""
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value:g}")
    return value


def probability(text: str) -> float:
    """A number in [0, 1]."""
    value = _float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {value:g}")
    return value


def gpu_memory_share(text: str) -> float:
    """A share of a GPU's memory in (0, 1] (:func:`udpo.gpu_share.check_share`)."""
    from udpo.gpu_share import check_share  # the standard library alone, like this module

    try:
        return check_share(_float(text), "the share")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def top_p(text: str) -> float:
    """A nucleus mass in (0, 1]."""
    value = _float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value:g}")
    return value


def int_list(minimum: int = 0) -> Callable[[str], list[int]]:
    """Comma-separated integers, each >= ``minimum`` (``1,2,3``)."""

    def parse(text: str) -> list[int]:
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated integers like 1,2,3, got {text!r}"
            ) from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected at least one integer, got {text!r}")
        low = [v for v in values if v < minimum]
        if low:
            raise argparse.ArgumentTypeError(f"each value must be >= {minimum}, got {low[0]}")
        return values

    parse.__name__ = "integer list"
    return parse


def existing_path(text: str) -> str:
    """A file or folder that exists (returned as given)."""
    if not Path(text).expanduser().exists():
        raise argparse.ArgumentTypeError(f"{text}: no such file or folder")
    return text


def existing_file(text: str) -> str:
    """A file that exists (returned as given)."""
    path = Path(text).expanduser()
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "no such file"
        raise argparse.ArgumentTypeError(f"{text}: {what}")
    return text


def field_option(group, name: str, **kwargs) -> argparse.Action:
    """Add the option called ``name``, a config field's name (``n_agents``), to the parser or group:
    its flags are ``--n-agents`` and ``--n_agents`` (the form the subcommands use and the one
    ``udpo train`` uses), its dest is ``name``. ``kwargs`` go to ``add_argument``."""
    flags = list(dict.fromkeys((f"--{name.replace('_', '-')}", f"--{name}")))
    kwargs.setdefault("dest", name)
    if kwargs.get("action") is argparse.BooleanOptionalAction:
        kwargs["action"] = BooleanOption
    return group.add_argument(*flags, **kwargs)


def config_option(
    group, config: type, name: str, *, default_text: str | None = None, **kwargs
) -> argparse.Action:
    """Add the option of the config field ``name`` of ``config`` (a dataclass of ``udpo.config``): named
    by :func:`field_option`, its default the field's and its help the field's (``metadata["help"]``, what
    ``udpo train --help`` and docs/training.md show), ending "(default: ...)" unless it says so already
    (``default_text``: the words shown instead of the default). A ``Literal`` field's values become its
    choices. ``kwargs`` go to ``add_argument`` and win (a command's own default, a checking ``type=``)."""
    spec = next(f for f in dataclasses.fields(config) if f.name == name)
    kwargs.setdefault("default", spec.default)
    help_text = kwargs.pop("help", spec.metadata["help"])
    shown = default_text if default_text is not None else kwargs["default"]
    if shown is not None and "default" not in help_text:
        help_text = f"{help_text} (default: {shown})"
    hint = typing.get_type_hints(config)[name]
    if typing.get_origin(hint) is typing.Literal:
        kwargs.setdefault("choices", typing.get_args(hint))
    return field_option(group, name, help=help_text.replace("%", "%%"), **kwargs)


class BooleanOption(argparse.BooleanOptionalAction):
    """``--x-y`` / ``--no-x-y`` and, for the underscore spelling, ``--x_y`` / ``--no_x_y`` (as
    ``udpo train`` spells a config field's negation), not argparse's ``--no-x_y``."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.option_strings = [
            "--no_" + s[len("--no-") :] if s.startswith("--no-") and "_" in s else s
            for s in self.option_strings
        ]

    def __call__(self, parser, namespace, values, option_string=None):
        if option_string in self.option_strings:
            setattr(namespace, self.dest, not option_string.startswith(("--no-", "--no_")))
