"""``TrainConfig``: the six field groups joined, the rules that span them, and the type coercion of
values read from YAML or the command line."""

from __future__ import annotations

import json
import types
import typing
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal, TypeVar

from .groups import (
    COEFFICIENTS,
    AlgorithmArgs,
    ConfigError,
    DebateArgs,
    ModelArgs,
    OptimizerArgs,
    RewardArgs,
    RunArgs,
)

Group = TypeVar("Group", ModelArgs, DebateArgs, RewardArgs, AlgorithmArgs, OptimizerArgs, RunArgs)


@dataclass
class TrainConfig(RunArgs, OptimizerArgs, AlgorithmArgs, RewardArgs, DebateArgs, ModelArgs):
    """Everything a training run needs (every field of ``udpo train --help`` and of a recipe), in six
    groups, each a dataclass that checks its own fields (``check``): :class:`ModelArgs`,
    :class:`DebateArgs`, :class:`RewardArgs`, :class:`AlgorithmArgs`, :class:`OptimizerArgs`,
    :class:`RunArgs`. :meth:`validate` runs the six checks, then the rules that span groups.

    Defaults follow the paper (appendix A.1) where it says something: AdamW, lr 1e-5, 32 debates
    per update, cosine decay, gradient-norm clip 1.0, 10 epochs; the warm-up is 10% of the run's steps
    (``warmup_ratio``: the paper's 500 steps exceed a whole run of some tasks).
    """

    def __post_init__(self) -> None:
        _coerce_types(self)
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError for out-of-range values and incompatible combinations."""
        for group in GROUPS:
            group.check(self)
        self._check_across()

    def _check_across(self) -> None:
        """The rules that span groups: per-agent lists against ``n_agents``, what an algorithm,
        backend or protocol cannot do, what calibration and evaluation need."""
        n = self.n_agents
        if self.max_iterations is not None:
            self.warmup_for(self.max_iterations * self.update_epochs)  # a warm-up as long as the run
        for name in COEFFICIENTS:
            value = getattr(self, name)
            if value is not None and len(value) not in (1, n):
                raise ConfigError(
                    f"{name} needs 1 value (all agents) or n_agents={n} values, got {len(value)}"
                )
        if self.agent_models is not None and len(self.agent_models) != n:
            raise ConfigError(f"agent_models needs n_agents={n} entries, got {len(self.agent_models)}")
        if self.algorithm != "udpo":
            udpo_only = {
                "replay": self.replay,
                "ablations": self.ablations,
                "correctness_floor": self.correctness_floor,
                "reward_functions": self.reward_functions,
                "ratio_level: token": self.ratio_level == "token",
                "task_reward: coin": self.task_reward == "coin",
            }
            given = [name for name, on in udpo_only.items() if on]
            if given:
                raise ConfigError(
                    f"algorithm: {self.algorithm} trains on the team reward with per-token ratios and GAE; "
                    f"{', '.join(given)} belong to udpo"
                )
            if self.eta is not None and len(self.eta) != 1:
                raise ConfigError(
                    f"algorithm: {self.algorithm} takes one eta (its KL weight), got {self.eta}"
                )
        if self.adversary_budget < 0 or (self.algorithm == "rmaac" and self.adversary_budget >= max(n, 1)):
            raise ConfigError(
                f"adversary_budget must be in 0..n_agents-1 = 0..{n - 1}, got {self.adversary_budget}"
            )
        minimum = self.max_tokens * (self.rounds * n + 1)
        if self.backend_capabilities.fixed_context and minimum > self.vllm_max_model_len:
            raise ConfigError(
                f"vllm_max_model_len={self.vllm_max_model_len} cannot hold a debate of n_agents={n}, "
                f"rounds={self.rounds}, max_tokens={self.max_tokens}: the last round's prompt carries the "
                f"agent's {self.rounds} earlier answers and {self.rounds} x {n - 1} peer answers "
                f"({minimum} tokens at max_tokens each, before the question); raise vllm_max_model_len or "
                f"lower max_tokens"
            )
        if self.critic_warmup_epochs > 0 and self.warmup_fraction == 0:
            raise ConfigError(
                "critic_warmup_epochs > 0 fits the critic on warm-up debates: set warmup_fraction > 0"
            )
        if (
            self.warmup_fraction == 0
            and not self.coefficients_explicit
            and self.algorithm == "udpo"
            and self.calibration_file is None
        ):
            missing = ", ".join(k for k in COEFFICIENTS if getattr(self, k) is None)
            raise ConfigError(
                f"warmup_fraction: 0 leaves no warm-up debates to calibrate {missing}; "
                f"set warmup_fraction > 0 or give all of {', '.join(COEFFICIENTS)}"
            )
        if self.train_split == self.eval_split and self.eval_questions > 0:
            raise ConfigError(
                f"train_split and eval_split are both {self.train_split!r}: evaluation must be held out; "
                f"pick another eval_split (or eval_questions: 0)"
            )
        if self.baseline == "group" and self.debates_per_question < 2:
            raise ConfigError(
                "baseline: group averages over the debates of one question; "
                "set debates_per_question >= 2 or use baseline: batch"
            )
        protocol = self.protocol_config()
        logits = self.backend_capabilities.returns_logits
        if protocol.name in ("dig", "digra") and not logits and protocol.entropy_model is None:
            raise ConfigError(
                f"protocol: {protocol.name} scores entropies from logits, which backend {self.backend!r} "
                f"does not give; set protocol_options: {{entropy_model: <hf model>}} or backend: hf"
            )
        if self.attack_eval != "none":
            bad = [m for m in self.attack_eval_m if not 1 <= m < n]
            if bad or not self.attack_eval_m:
                raise ConfigError(
                    f"attack_eval_m: each m must be in 1..n_agents-1 = 1..{n - 1} (one agent stays honest), "
                    f"got {self.attack_eval_m}"
                )

    def check_paths(self) -> None:
        """Check the settings that name things on disk, before anything loads: ``output_dir`` can be a
        run folder, ``resume`` names a checkpoint (``latest``: output_dir holds one), and every model name
        can name a model (:func:`udpo.env.models.check_model`). Raises ConfigError naming the setting.

        Called by :func:`parse_config` and by the trainer before it loads a model (the disk can change
        between the two)."""
        from udpo.env.models import ModelNotFoundError, check_model
        from udpo.training import checkpoint_store as ckpt

        out = Path(self.output_dir).expanduser()
        for folder in (out, *out.parents):
            if folder.exists():
                if not folder.is_dir():
                    raise ConfigError(f"output_dir {self.output_dir}: {folder} is a file, not a folder")
                break
        if self.resume is not None:
            try:
                ckpt.resolve(out, self.resume)
            except ckpt.CheckpointError as e:
                raise ConfigError(f"resume: {e}") from None
        if self.calibration_file is not None and not Path(self.calibration_file).expanduser().is_file():
            raise ConfigError(
                f"calibration_file {self.calibration_file}: no such file (a run's RUN/calibration.json)"
            )
        models = {
            "model": self.model,
            **{f"agent_models[{i}]": m for i, m in enumerate(self.agent_models or [])},
        }
        if self.attack_eval != "none" and self.attack_eval_attacker not in ("base", "builtin"):
            models["attack_eval_attacker"] = self.attack_eval_attacker
        for name, model in models.items():
            try:
                check_model(model)
            except ModelNotFoundError as e:
                raise ConfigError(f"{name}: {e}") from None

    def check_imports(self) -> None:
        """Import the ``reward_functions`` and ``eval_callbacks`` named by ``package.module:function`` and
        check each is a function or a callable class from outside the standard library
        (:func:`udpo.env.imports.resolve`), calling none of them. Raises ConfigError naming the field.

        Called by :func:`parse_config` (recipes and the command line), not by :meth:`validate`: the API
        names the callables it is given by qualname (``module:f.<locals>.g``), which need not import."""
        from udpo.env.imports import SpecError, not_a_user_callable, resolve

        try:
            for name in ("reward_functions", "eval_callbacks"):
                for spec in getattr(self, name):
                    resolve(name, spec, not_a_user_callable)
        except SpecError as e:
            raise ConfigError(str(e)) from None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def group(self, cls: type[Group]) -> Group:
        """The fields of one group (``config.group(OptimizerArgs)``), as that group's own dataclass: what
        the trainer hands each part, so that a part reads only the settings its signature names."""
        return cls(**{f.name: getattr(self, f.name) for f in fields(cls)})


#: the field groups, in the order their checks run (and their fields are listed)
GROUPS = (ModelArgs, DebateArgs, RewardArgs, AlgorithmArgs, OptimizerArgs, RunArgs)


def _types() -> dict[str, Any]:
    return typing.get_type_hints(TrainConfig)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """(inner type, whether None is allowed) of ``X | None``."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(tp))
    return tp, False


def _coerce(name: str, value: Any, tp: Any) -> Any:
    """``value`` as type ``tp`` (YAML reads 1e-5 as a string; ints stand in for floats) or ConfigError."""
    inner, optional = _unwrap_optional(tp)
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{name} may not be null")
    origin = typing.get_origin(inner)
    if origin is Literal:
        choices = typing.get_args(inner)
        if value not in choices:
            raise ConfigError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
        return value
    if origin is list:
        (item,) = typing.get_args(inner)
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            value = [value]  # a single value where a list is expected
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{name} must be a list, got {type(value).__name__} {value!r}")
        return [_coerce(f"{name}[{k}]", v, item) for k, v in enumerate(value)]
    if inner is dict:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except (json.JSONDecodeError, RecursionError) as e:
                raise ConfigError(f"{name} must be a mapping (JSON on the command line): {e}") from None
        if not isinstance(value, dict):
            raise ConfigError(f"{name} must be a mapping, got {type(value).__name__} {value!r}")
        return value
    if inner is bool:
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")
        return value
    if inner in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"{name} must be a number, got {value!r}")
        try:
            number = float(value) if inner is float else int(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(
                f"{name} must be {'a number' if inner is float else 'an integer'}, got {value!r:.80}"
            ) from None
        if inner is int and isinstance(value, float) and value != number:
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        return number
    if inner is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name} must be a string, got {type(value).__name__} {value!r}")
        return value
    return value


def _coerce_types(config: TrainConfig) -> None:
    hints = _types()
    for f in fields(config):
        setattr(config, f.name, _coerce(f.name, getattr(config, f.name), hints[f.name]))
