"""Training configuration: one dataclass (:class:`TrainConfig`) of six field groups
(:mod:`.groups`), every field documented, parsed with TRL's
``TrlParser``.

A recipe is a YAML file of ``field: value`` lines; command-line flags override it::

    python train_udpo.py --config recipes/quickstart.yaml --learning_rate 2e-5

Unknown keys (in the file or on the command line) and incompatible settings raise :class:`ConfigError`
naming the key, the file and what to do. ``python -m udpo.config`` prints the reference table that
docs/training.md embeds.

The package: :mod:`.groups` (the field groups), :mod:`.train` (``TrainConfig`` and the cross-group rules),
:mod:`.recipes` (YAML recipes, the command line, the reference tables).
"""

from .groups import (
    ABLATIONS,
    ALGORITHMS,
    COEFFICIENTS,
    TRACKERS,
    AlgorithmArgs,
    AlgorithmName,
    ConfigError,
    DebateArgs,
    ModelArgs,
    OptimizerArgs,
    RewardArgs,
    RunArgs,
    _f,
)
from .recipes import apply_env, load_yaml, parse_config, read_yaml, reference_markdown, unknown_key_error
from .train import GROUPS, TrainConfig

__all__ = [
    "ABLATIONS",
    "ALGORITHMS",
    "COEFFICIENTS",
    "GROUPS",
    "TRACKERS",
    "AlgorithmArgs",
    "AlgorithmName",
    "ConfigError",
    "DebateArgs",
    "ModelArgs",
    "OptimizerArgs",
    "RewardArgs",
    "RunArgs",
    "TrainConfig",
    "_f",
    "apply_env",
    "load_yaml",
    "parse_config",
    "read_yaml",
    "reference_markdown",
    "unknown_key_error",
]
