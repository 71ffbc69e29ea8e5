"""``udpo compare``: train and evaluate several methods on the same questions, budget and seeds, then
tabulate them as the UDPO paper's Table 1 and plot the gains over Standard MAD by difficulty (its
Figure 5, through ``udpo diagnose``).

Methods (:data:`METHODS`): ``standard_mad`` (the untrained team), ``mappo``, ``rmaac``, ``udpo``,
``udpo_floor`` (UDPO with ``correctness_floor``: each ``lambda_i`` raised until a correct split out-earns a
unanimous wrong debate; on a shared ``calibration_file`` it floors the coefficients ``udpo`` trains with),
the ablations ``udpo_wo_intra``, ``udpo_wo_inter``, ``udpo_wo_sys``, and ``task_only``: UDPO's trainer on
the plain correctness reward (:data:`TASK_ONLY`: alpha = beta = gamma = 0, lambda = 1 for every agent; eta
as UDPO's). Every trained method runs the same training recipe with the same seed, so it debates the same
training questions in the same order for the same number of iterations, takes the same optimizer steps and
is evaluated on the same held-out questions with the same ``eval_seed``; only the settings that define the
method differ (a method's own settings win over ``settings:``). Standard MAD is the iteration-0 evaluation:
every method starts from the same adapters (LoRA's B = 0: the base model), evaluated on the same draws, so
with ``shared_start`` (default) only the first trained method of each seed evaluates iteration 0; with
``shared_start: false`` every method does and compare checks that the debates agree. UDPO's warm-up
calibration debates are the one extra cost, reported in the budget table.

Layout of ``output_dir`` (the run folders, on the machine that trains)::

    <method>/seed_<s>/        a training run (resumable: a killed compare resumes it from its checkpoint)
    <method>/seed_<s>/done.json   written when the run finished

and of ``results_dir`` (default: ``output_dir``; a study's is a folder meant to be committed)::

    runs/<method>_seed<s>/    the run's record, written as it finishes (:mod:`udpo.analysis.run_record`):
                              its evaluations, metrics and calibration, compressed. A run with a record is
                              done, whether or not its run folder is still there; the tables read the
                              records alone
    table.md, table.csv       accuracy, U_intra / U_inter / U_sys and the consensus-on-wrong guard per method:
                              mean over seeds [95% CI, each seed's questions resampled]; when the seeds share
                              their test problems, each metric's change per seed with the t-interval and the
                              seeds x problems bootstrap; per run, the training diagnostics
    seed_changes.png          that second table as a picture (only when the seeds share their problems)
    budget.csv                debates, optimizer steps, generated tokens, warm-up debates per run
    results.json              everything above, with the change of each metric over Standard MAD
    diagnosis/                ``udpo diagnose`` of the final evaluations: gains by U_sys level (Figure 5)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from udpo.analysis.results import eval_iterations
from udpo.analysis.run_record import RUN, record_name, write_record
from udpo.config import ConfigError, TrainConfig, apply_env, load_yaml, read_yaml, unknown_key_error
from udpo.env.jsonl import write_json
from udpo.env.trajectory import Trajectory
from udpo.rewards import collapse_rate

#: the correctness-reward baseline of UDPO's trainer (SPEC section 3): its reward coefficients, one value
#: for every agent
TASK_ONLY = {"alpha": [0.0], "beta": [0.0], "gamma": [0.0], "lambda_": [1.0]}
#: method -> the training settings that define it (None: not trained)
METHODS: dict[str, dict[str, Any] | None] = {
    "standard_mad": None,
    "mappo": {"algorithm": "mappo"},
    "rmaac": {"algorithm": "rmaac"},
    "udpo": {"algorithm": "udpo", "ablations": []},
    "udpo_floor": {"algorithm": "udpo", "ablations": [], "correctness_floor": True},
    "udpo_wo_intra": {"algorithm": "udpo", "ablations": ["intra"]},
    "udpo_wo_inter": {"algorithm": "udpo", "ablations": ["inter"]},
    "udpo_wo_sys": {"algorithm": "udpo", "ablations": ["sys"]},
    "task_only": {"algorithm": "udpo", "ablations": [], **TASK_ONLY},
    "coin_control": {"algorithm": "udpo", "ablations": [], **TASK_ONLY, "task_reward": "coin"},
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
    "max_iterations",
    "num_train_epochs",
    "update_epochs",
    "gradient_accumulation_steps",
    "seed",
)
#: the metrics of the tables and of the seed analysis: the unparsed rate beside the guard, since an agent that
#: stops answering lowers ``wrong_majority`` (unparsed answers never count there) and the U terms alike
TABLE_METRICS = (
    "accuracy",
    "u_intra",
    "u_inter",
    "u_sys",
    "wrong_majority",
    "wrong_unanimous",
    "unparsed_rate",
)
#: metrics of a whole evaluation, not of one question: analysed over seeds (one value per seed and evaluation)
RUN_METRICS: dict[str, Callable[[Sequence[Trajectory]], float]] = {
    "collapse_rate": lambda debates: collapse_rate([t.answers for t in debates]),
}
#: training diagnostics of each run, ``metrics.jsonl`` key -> name: the mean over the run's iterations
TRAINING_DIAGNOSTICS = {
    "update/clip_frac": "clip_frac",
    "update/dual_clip_frac": "dual_clip_frac",
    "update/kl": "kl",
    "mismatch/abs_mean": "mismatch_abs_mean",
    "mismatch/kl": "mismatch_kl",
}
DONE = "done.json"
#: the figure of the seeds' changes over Standard MAD (written when the seeds share their problems)
SEED_CHANGES_PLOT = "seed_changes.png"
#: seconds a process waits for another one writing the tables before giving up
TABLES_PATIENCE = 600.0


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
    on the same draws (paired), and the seeds' draws differ (false: one ``eval_seed`` for every seed)."""

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

    def __post_init__(self) -> None:
        unknown = [m for m in [*self.methods, *self.method_settings] if m not in METHODS]
        if unknown:
            raise ConfigError(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
        if not any(METHODS[m] is not None for m in self.methods):
            raise ConfigError("compare needs at least one trained method (standard_mad is their iteration 0)")
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
        config = TrainConfig(**values)
        if self.eval_seed_per_seed:
            config = replace(config, eval_seed=config.eval_seed + seed)
        return config


def check_budgets(configs: dict[str, TrainConfig]) -> None:
    """Refuse configs whose budget fields differ between methods (ConfigError naming them)."""
    first_name, first = next(iter(configs.items()))
    for name, config in configs.items():
        differ = [f for f in BUDGET_FIELDS if getattr(config, f) != getattr(first, f)]
        if differ:
            raise ConfigError(f"methods {first_name} and {name} differ in budget settings {differ}")


def run_compare(
    config: CompareConfig,
    train: Callable[[TrainConfig], Any] | None = None,
    progress: bool = True,
    seeds: Sequence[int] | None = None,
) -> dict[str, Any] | None:
    """Train every (method, seed) not yet done (resuming an interrupted one from its latest checkpoint),
    write each run's record as it finishes, then write the tables, the budget and the diagnosis from the
    records. ``train``: how one run trains (default :func:`udpo.training.trainer.train`). ``seeds``: train
    only these (e.g. one process per seed, side by side). A run with a record is done, even where its run
    folder is gone (trained on another machine). Started runs go first. Several compare processes may
    share the work (one per core): a run another process is training (its folder is locked,
    :mod:`udpo.training.run_lock`) is left to it. Returns the results, or None while some runs are not
    done (other seeds, other processes) and when ``tables_when_done`` is false."""
    from tqdm.auto import tqdm

    from udpo.training import checkpoint_store as ckpt
    from udpo.training.run_lock import RunBusyError

    chosen = config.seeds if seeds is None else list(seeds)
    unknown = [s for s in chosen if s not in config.seeds]
    if unknown:
        raise ConfigError(f"seed(s) {unknown} are not among the config's seeds {config.seeds}")
    jobs = [(m, s) for s in chosen for m in config.trained()]
    jobs.sort(key=lambda job: not ckpt.list_checkpoints(config.run_dir(*job)))  # stable: started first
    for seed in config.seeds:
        check_budgets({m: config.train_config(m, seed) for m in config.trained()})
    if train is None:
        from udpo.training.trainer import train
    bar = tqdm(jobs, desc="compare", unit="run", disable=not progress)
    for i, (method, seed) in enumerate(bar, 1):
        run = config.run_dir(method, seed)
        bar.set_postfix_str(f"{method} seed {seed}")
        if record_finished(config, method, seed):
            continue
        tc = config.train_config(method, seed)
        resumable = bool(ckpt.list_checkpoints(run))
        if resumable:
            tc.resume = "latest"
        bar.write(
            f"[{i}/{len(jobs)}] {method}, seed {seed}"
            f"{' (resuming its latest checkpoint)' if resumable else ''}: {run}"
        )
        try:
            train(tc)
        except RunBusyError as e:
            bar.write(f"[{i}/{len(jobs)}] left to the process that trains it: {e}")
            continue
        last = max(eval_iterations(run), default=0)
        write_json(run / DONE, {"method": method, "seed": seed, "final_eval": last})
        record_finished(config, method, seed)
        bar.write(f"[{i}/{len(jobs)}] recorded: {config.record_dir(method, seed)}")
    bar.close()
    if not config.tables_when_done or not all(
        config.recorded(m, s) for s in config.seeds for m in config.trained()
    ):
        return None
    return write_results(config)


def record_finished(config: CompareConfig, method: str, seed: int) -> bool:
    """Whether the run is done: its record exists, or its run folder finished (done.json) and its record
    is written now (a run that finished before records existed, or was stopped between the two)."""
    if config.recorded(method, seed):
        return True
    run = config.run_dir(method, seed)
    if not (run / DONE).exists():
        return False
    write_record(run, config.record_dir(method, seed), method, seed)
    return True


def write_results(config: CompareConfig) -> dict[str, Any]:
    """Tables, budget, results.json and the diagnosis, from the runs' records
    (:func:`udpo.analysis.study_tables.write_tables`). Where the run folders are (``output_dir``), one
    process writes at a time (two compare processes can finish their last runs together): the output
    folder's lock, waited for up to :data:`TABLES_PATIENCE` seconds, and finished runs without a record get
    theirs first; from a committed results folder alone nothing else writes."""
    from udpo.analysis.study_tables import write_tables
    from udpo.training import run_lock

    if not Path(config.output_dir).is_dir():
        return write_tables(config)
    with run_lock.held(config.output_dir, resume="udpo study --tables-only", patience=TABLES_PATIENCE):
        for seed in config.seeds:
            for method in config.trained():
                record_finished(config, method, seed)
        return write_tables(config)


def format_progress(config: CompareConfig) -> Sequence[str]:
    """One line per (method, seed): done, started (with its latest checkpoint and last iteration; at
    the last one, in its final evaluation) or waiting, and which process trains it now."""
    from udpo.training import checkpoint_store as ckpt
    from udpo.training import run_lock

    lines = []
    for seed in config.seeds:
        for method in config.trained():
            run = config.run_dir(method, seed)
            if config.recorded(method, seed):
                state = "done"
            elif (run / DONE).exists():
                state = "done, its record not written yet"
            elif ckpt.list_checkpoints(run):
                state = f"started, latest checkpoint {ckpt.resolve(run, 'latest').name}"
                k, total = last_iteration(run), config.train_config(method, seed).max_iterations
                if k is not None:
                    state += f", iteration {k}" + (f" of {total}" if total else "")
                    state += ", final evaluation" if k == total else ""
            else:
                state = "waiting"
            if state != "done" and run_lock.locked(run):
                state += f" (training now: {run_lock.holder(run)})"
            lines.append(f"{method:14s} seed {seed}: {state}")
    return lines


def last_iteration(run: Path) -> int | None:
    """The last training iteration a run's metrics.jsonl records, read while it trains (a line being
    written is skipped); None before the first."""
    from udpo.training.tracking import METRICS_FILE

    try:
        lines = (run / METRICS_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if (
            isinstance(record, dict)
            and record.get("kind") == "train"
            and isinstance(record.get("iteration"), int)
        ):
            return record["iteration"]
    return None
