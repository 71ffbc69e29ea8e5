"""A study plan (``udpo study PLAN.yaml``; ``udpo compare --config PLAN.yaml`` by its earlier name): several
methods trained and evaluated on the same questions, budget and seeds.

Methods (:data:`METHODS`): ``standard_mad`` (the untrained team), ``mappo``, ``rmaac``, ``udpo``,
``udpo_floor`` (UDPO with ``correctness_floor``: each ``lambda_i`` raised until a correct split out-earns a
unanimous wrong debate; on a shared ``calibration_file`` it floors the coefficients ``udpo`` trains with),
the ablations ``udpo_wo_intra``, ``udpo_wo_inter``, ``udpo_wo_sys``, ``task_only``: UDPO's trainer on
the plain correctness reward (:data:`TASK_ONLY`: alpha = beta = gamma = 0, lambda = 1 for every agent; eta
as UDPO's), and ``coin_control``: task_only on a coin that ignores the answer. Every trained method runs
the same training recipe with the same seed, so it debates the same training questions in the same order
for the same number of iterations, takes the same optimizer steps and is evaluated on the same held-out
questions with the same ``eval_seed``; only the settings that define the method differ (a method's own
settings win over ``settings:``). Standard MAD is the iteration-0 evaluation: every method starts from the
same adapters (LoRA's B = 0: the base model), evaluated on the same draws, so with ``shared_start``
(default) only the first trained method of each seed evaluates iteration 0; with ``shared_start: false``
every method does and the tables check that the debates agree. UDPO's warm-up calibration debates are the
one extra cost, reported in the budget table.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from udpo.config import (
    AlgorithmName,
    ConfigError,
    TrainConfig,
    apply_env,
    load_yaml,
    read_yaml,
    unknown_key_error,
)
from udpo.study.record import RUN, record_name

#: TrainConfig's own eval_seed, which eval_seed_per_seed offsets when neither recipe nor plan sets one
EVAL_SEED_DEFAULT: int = next(f.default for f in fields(TrainConfig) if f.name == "eval_seed")

#: the correctness-reward baseline of UDPO's trainer (SPEC section 3): its reward coefficients, one value
#: for every agent
TASK_ONLY = {"alpha": [0.0], "beta": [0.0], "gamma": [0.0], "lambda_": [1.0]}


def trains(algorithm: AlgorithmName, **settings: Any) -> dict[str, Any]:
    """The training settings of a method that trains ``algorithm`` (a name of the config's one list, which
    the type checker holds every method to), with its own ``settings``."""
    return {"algorithm": algorithm, **settings}


#: method -> the training settings that define it (None: not trained)
METHODS: dict[str, dict[str, Any] | None] = {
    "standard_mad": None,
    "mappo": trains("mappo"),
    "rmaac": trains("rmaac"),
    "udpo": trains("udpo", ablations=[]),
    "udpo_floor": trains("udpo", ablations=[], correctness_floor=True),
    "udpo_wo_intra": trains("udpo", ablations=["intra"]),
    "udpo_wo_inter": trains("udpo", ablations=["inter"]),
    "udpo_wo_sys": trains("udpo", ablations=["sys"]),
    "task_only": trains("udpo", ablations=[], **TASK_ONLY),
    "coin_control": trains("udpo", ablations=[], **TASK_ONLY, task_reward="coin"),
}
#: settings that fix a run's budget and questions: one value for every method
BUDGET_FIELDS = (
    "model",
    "task",
    "task_options",
    "train_split",
    "eval_split",
    "data_path",
    "max_train_questions",
    "eval_questions",
    "eval_debates_per_question",
    "eval_seed",
    "eval_question_seed",
    "calibration_file",
    "warmup_fraction",
    "n_agents",
    "rounds",
    "max_tokens",
    "temperature",
    "top_p",
    "questions_per_iteration",
    "debates_per_question",
    "dynamic_sampling",
    "dynamic_sampling_max_extra",
    "max_iterations",
    "num_train_epochs",
    "update_epochs",
    "gradient_accumulation_steps",
    "seed",
)


#: what one run asks of a Ray cluster unless the plan says otherwise: one core, no GPU
RESOURCES: dict[str, float] = {"num_cpus": 1, "num_gpus": 0}


def check_resources(resources: Any) -> dict[str, float]:
    """A plan's ``resources`` with the defaults filled in, or a ConfigError: ``num_cpus`` > 0, ``num_gpus`` a
    fraction in [0, 1) or a whole number of cards (as Ray places them)."""
    if not isinstance(resources, dict) or set(resources) - set(RESOURCES):
        raise ConfigError(f"resources: a mapping of {' and '.join(RESOURCES)}, got {resources!r}")
    values = {**RESOURCES, **resources}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"resources.{name} must be a number >= 0, got {value!r}")
    cpus, gpus = values["num_cpus"], values["num_gpus"]
    if cpus <= 0:
        raise ConfigError(f"resources.num_cpus must be > 0, got {cpus!r}")
    if gpus >= 1 and gpus != int(gpus):
        raise ConfigError(f"resources.num_gpus: a fraction below 1 or a whole number of GPUs, got {gpus!r}")
    return values


@dataclass
class CompareConfig:
    """recipe: the training recipe every method shares (YAML, as for train_udpo.py). methods: which of
    :data:`METHODS` to run (at least one trained). seeds: training seeds (each method runs once per seed).
    output_dir: where the run folders go. settings: training settings applied over the recipe for every
    method. method_settings: extra settings per method (never a budget field). shared_start: only the
    first trained method evaluates iteration 0 (Standard MAD); false: every method does, and they are
    checked to agree. results_dir: where each finished run's record and the tables go, a folder meant to
    be committed (default: output_dir). bootstrap_resamples: resamples of every bootstrap interval of the
    tables (10,000 as pre-registered; fewer only to try the machinery). tables_when_done: write the tables
    when the last run is recorded (false: records only, for a pilot that stays blind to its arms until its
    sample-size rule is recorded; ``--tables-only`` writes them). eval_seed_per_seed: each seed's
    evaluations sample with ``eval_seed + seed``, so every method of a seed is evaluated, before and after,
    on the same draws (paired), and the seeds' draws differ (false: one ``eval_seed`` for every seed).
    comparisons: pairs ``[A, B]`` of methods whose difference A - B the tables analyse seed by seed (the
    pre-registered primary comparisons). second_stage: the blind rule that sets the seeds per arm after the
    first ones are recorded (``udpo study PLAN --second-stage``): ``effect`` (the difference to detect),
    ``fallback_effect`` (used when ``effect`` would need more than ``most_seeds``) and ``most_seeds``.
    resources: what each run asks of a Ray cluster (``udpo study PLAN --ray``): ``num_cpus`` (its torch
    threads too) and ``num_gpus`` (a fraction below 1 shares a card: that share of its memory), default
    :data:`RESOURCES`; the local executor ignores them.
    headroom: what ``udpo study PLAN --check`` debates and the bounds the plan needs before it trains
    (:class:`udpo.study.headroom.HeadroomSpec`: questions, debates, seed, min_mixed_share, min_ceiling_gain,
    max_cut, max_unparsed)."""

    recipe: str
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    seeds: list[int] = field(default_factory=lambda: [0, 1])
    output_dir: str = "runs/compare"
    settings: dict[str, Any] = field(default_factory=dict)
    method_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    shared_start: bool = True
    results_dir: str | None = None
    bootstrap_resamples: int = 10_000
    tables_when_done: bool = True
    eval_seed_per_seed: bool = False
    comparisons: list[list[str]] = field(default_factory=list)
    second_stage: dict[str, Any] | None = None
    resources: dict[str, float] = field(default_factory=lambda: dict(RESOURCES))
    headroom: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.resources = check_resources(self.resources)
        if self.headroom is not None:
            from udpo.study.headroom import HeadroomSpec

            HeadroomSpec.from_plan(self.headroom)  # a ConfigError naming what is wrong
        unknown = [m for m in [*self.methods, *self.method_settings] if m not in METHODS]
        if unknown:
            raise ConfigError(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
        if not any(METHODS[m] is not None for m in self.methods):
            raise ConfigError("compare needs at least one trained method (standard_mad is their iteration 0)")
        for pair in self.comparisons:
            if not (isinstance(pair, list) and len(pair) == 2 and all(m in self.methods for m in pair)):
                raise ConfigError(
                    f"comparisons: each entry is [A, B], two of the plan's methods; got {pair!r}"
                )
        if self.second_stage is not None:
            rule = self.second_stage
            keys = {"effect", "fallback_effect", "most_seeds"}
            if not isinstance(rule, dict) or set(rule) != keys:
                raise ConfigError(f"second_stage needs exactly {sorted(keys)}, got {rule!r}")
            if not (0 < rule["effect"] <= rule["fallback_effect"]) or int(rule["most_seeds"]) < len(
                self.seeds
            ):
                raise ConfigError(
                    "second_stage: 0 < effect <= fallback_effect and most_seeds >= the plan's seeds, "
                    f"got {rule!r}"
                )
        if len(set(self.methods)) != len(self.methods) or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"methods and seeds must not repeat, got {self.methods} and {self.seeds}")
        if not self.seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in self.seeds):
            raise ConfigError(f"seeds must be a non-empty list of integers, got {self.seeds}")
        if not isinstance(self.bootstrap_resamples, int) or self.bootstrap_resamples < 100:
            raise ConfigError(
                f"bootstrap_resamples must be an integer >= 100, got {self.bootstrap_resamples!r}"
            )
        for method, extra in self.method_settings.items():
            defining = {"algorithm", "ablations", "output_dir", *(METHODS[method] or {})}
            fixed = [k for k in extra if k in BUDGET_FIELDS or k in defining]
            if fixed:
                raise ConfigError(
                    f"method_settings.{method} sets {fixed}: those fix the method or its budget and must be "
                    f"the same for every method (put budget settings under settings:)"
                )
        for name in ("seed", "output_dir", "resume", "algorithm", "ablations", "correctness_floor"):
            if name in self.settings:
                raise ConfigError(
                    f"settings: {name} is set by compare itself (seeds:, output_dir:, methods:)"
                )
        known = {f.name for f in fields(TrainConfig)}
        for where, values in [
            ("settings", self.settings),
            *((f"method_settings.{m}", v) for m, v in self.method_settings.items()),
        ]:
            if not isinstance(values, dict):
                raise ConfigError(f"{where} must be a mapping of training settings, got {values!r:.80}")
            if "env" in values:
                raise ConfigError(f"{where}: env: belongs in the recipe (set once, for every run)")
            unknown = [k for k in values if k not in known]
            if unknown:
                raise unknown_key_error(unknown, where)  # as training names an unknown key

    @classmethod
    def load(cls, path: str | Path) -> CompareConfig:
        """Read a compare YAML file (keys: the fields of this class) and its recipe as training reads
        them, and set the recipe's ``env:`` variables in this process as training does.

        The file is parsed by the recipe parser (:func:`udpo.config.load_yaml`'s: YAML aliases refused,
        a byte-order mark accepted); the recipe by :func:`udpo.config.load_yaml` itself (unknown keys
        named, values checked), so a recipe error answers here, before anything loads. Every run of a
        compare trains in this process, so the recipe's ``env:`` (e.g. ``OMP_NUM_THREADS``) is set once,
        now, as ``udpo train`` sets it when it reads the recipe: call this before torch is imported (the
        ``udpo compare`` command does) for thread settings to take effect. The recipe path is relative to
        the current directory, or to the file's folder when it is not found there."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"compare config not found: {path}")
        data = read_yaml(path, "a compare config") or {}
        known = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or "recipe" not in data:
            raise ConfigError(
                f"{path}: a compare config is a mapping with at least recipe: (a training recipe)"
            )
        unknown = [k for k in data if k not in known]
        if unknown:
            raise ConfigError(f"{path}: unknown key(s) {unknown}; known: {', '.join(sorted(known))}")
        recipe = Path(data["recipe"])
        if not recipe.is_file() and (path.parent / recipe).is_file():
            data["recipe"] = str(path.parent / recipe)
        config = cls(**data)
        apply_env(load_yaml(config.recipe))  # as udpo.config.parse_config does with a training recipe
        return config

    def run_dir(self, method: str, seed: int) -> Path:
        return Path(self.output_dir) / method / f"seed_{seed}"

    def results_path(self) -> Path:
        return Path(self.results_dir or self.output_dir)

    def record_dir(self, method: str, seed: int) -> Path:
        return self.results_path() / "runs" / record_name(method, seed)

    def recorded(self, method: str, seed: int) -> bool:
        """Whether the run's record is written: the run is done, wherever it trained."""
        return (self.record_dir(method, seed) / RUN).is_file()

    def trained(self) -> list[str]:
        return [m for m in self.methods if METHODS[m] is not None]

    def all_recorded(self) -> bool:
        """Whether every trained run of every seed has its record."""
        return all(self.recorded(m, s) for s in self.seeds for m in self.trained())

    def train_config(self, method: str, seed: int) -> TrainConfig:
        """The training config of one (method, seed): recipe, then ``settings``, the method's own settings,
        the seed and the run folder. (The recipe's ``env:`` is no training field: :meth:`load` set it.)"""
        recipe = load_yaml(self.recipe)
        recipe.pop("env", None)
        values = {
            **recipe,
            **self.settings,
            **self.method_settings.get(method, {}),
            **METHODS[method],
            "seed": seed,
            "output_dir": str(self.run_dir(method, seed)),
            "run_name": f"{method}-seed{seed}",
        }
        if self.shared_start and method != self.trained()[0]:
            values["eval_at_start"] = False  # Standard MAD is the first method's iteration 0
        if self.eval_seed_per_seed:
            values["eval_seed"] = values.get("eval_seed", EVAL_SEED_DEFAULT) + seed
        return TrainConfig(**values)


def check_budgets(configs: dict[str, TrainConfig]) -> None:
    """Refuse configs whose budget fields differ between methods (ConfigError naming them)."""
    first_name, first = next(iter(configs.items()))
    for name, config in configs.items():
        differ = [f for f in BUDGET_FIELDS if getattr(config, f) != getattr(first, f)]
        if differ:
            raise ConfigError(f"methods {first_name} and {name} differ in budget settings {differ}")


def load_plan(path: str | Path, output_dir: str | None = None) -> CompareConfig:
    """Read a plan (:meth:`CompareConfig.load`; ``output_dir`` instead of its own) and check it before torch
    loads: every method's training config, the budgets of each seed's methods, and Standard MAD's
    iteration-0 evaluation (``eval_questions > 0``, ``eval_at_start``)."""
    config = CompareConfig.load(path)
    if output_dir:
        config.output_dir = output_dir
    for seed in config.seeds:
        configs = {m: config.train_config(m, seed) for m in config.trained()}
        check_budgets(configs)
        first = configs[config.trained()[0]]
        if not (first.eval_questions and first.eval_at_start):
            raise ValueError(
                "a study needs eval_questions > 0 and eval_at_start: true (Standard MAD is iteration 0)"
            )
    return config
