"""Argument groups shared by the commands that run debates (``debate``, ``eval``, ...)."""

from __future__ import annotations

import argparse
import json
import sys

from udpo.config.groups import DebateArgs, ModelArgs
from udpo.env.backends import (
    Backend,
    SamplingParams,
    backend_capabilities,
    backend_from_settings,
)
from udpo.env.backends.base import DTYPE_NAMES
from udpo.env.backends.openai import DEFAULT_BASE_URL, read_api_key_file
from udpo.env.debate import DebateConfig
from udpo.env.models import DEFAULT_MODEL
from udpo.env.protocols import PROTOCOL_NAMES, ProtocolConfig
from udpo.env.tasks import TASK_NAMES, Question, Task, get_task

from .argtypes import (
    config_option,
    existing_file,
    field_option,
    finite_float,
    nonnegative_float,
    nonnegative_int,
    positive_int,
    probability,
    seed,
    top_p,
)

#: completion cap per reply when the model runs on this machine's CPU and ``--max-tokens`` is not given:
#: enough for SmolLM2's step-by-step answer to a short question (arithmetic, multiple choice), more for
#: GSM8K's word problems and ReaLMistake's critiques; a 2-core CPU generates about 10-40 tokens/s
CPU_MAX_TOKENS = {
    "arithmetic": 96,
    "du-arithmetic": 96,
    "commonsenseqa": 96,
    "truthfulqa": 96,
    "gsm8k": 192,
    "realmistake": 128,
}
#: CPU cap of a task not listed above
CPU_MAX_TOKENS_OTHER = 128
#: completion cap on a GPU or an OpenAI-compatible server when ``--max-tokens`` is not given
GPU_MAX_TOKENS = SamplingParams.max_tokens
#: what ``--max-tokens`` defaults to when a command picks it by device and task
MAX_TOKENS_DEFAULT = (
    f"{GPU_MAX_TOKENS} on a GPU or server; on CPU 96 for arithmetic, du-arithmetic, commonsenseqa and "
    f"truthfulqa, 192 for gsm8k, 128 for realmistake"
)


def task_name(text: str) -> str:
    """argparse ``type=`` of ``--task``: a built-in or registered task, or ``package.module:TaskClass``."""
    from udpo.env.tasks import task_parameters

    try:
        task_parameters(text)
    except (TypeError, ValueError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add_task_args(p: argparse.ArgumentParser, default_task: str | None = None) -> None:
    g = p.add_argument_group("task")
    g.add_argument(
        "--task",
        required=default_task is None,
        default=default_task,
        type=task_name,
        help=f"benchmark: {', '.join(TASK_NAMES)}, or package.module:TaskClass"
        + (f" (default: {default_task})" if default_task else ""),
    )
    g.add_argument("--split", default="test", help="data split (default: test)")
    config_option(g, DebateArgs, "data_path")
    g.add_argument("--limit", type=positive_int, default=None, help="debate only the first K questions")
    g.add_argument("--seed", type=seed, default=0, help="seed for data shuffles and sampling (default: 0)")


def add_backend_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model and backend")
    config_option(g, ModelArgs, "model")
    config_option(g, ModelArgs, "backend")
    g.add_argument("--device", default=None, help="hf: torch device (default: cuda if available, else cpu)")
    config_option(g, ModelArgs, "dtype", choices=("auto", *DTYPE_NAMES), metavar="DTYPE")
    config_option(g, ModelArgs, "base_url", default_text=DEFAULT_BASE_URL)
    g.add_argument(
        "--api-key-file",
        type=existing_file,
        default=None,
        metavar="FILE",
        help="openai: file whose first line is the API key (default: $UDPO_API_KEY, else $OPENAI_API_KEY)",
    )
    g.add_argument("--api-key", nargs="?", action=RefuseSecret, help=argparse.SUPPRESS)
    config_option(g, DebateArgs, "chat_template_kwargs", type=json_object, metavar="JSON")


class RefuseSecret(argparse.Action):
    """``--api-key KEY`` is refused: every user of the machine can read a command line (``ps``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(
            f"{option_string} would show the key to every user of this machine (process list); set "
            f"UDPO_API_KEY or OPENAI_API_KEY, or pass --api-key-file FILE"
        )


def json_object(text: str) -> dict:
    """argparse type: a JSON object given on the command line."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


#: the check of each debate flag, made as the command line is parsed (the range its field allows)
DEBATE_FLAG_TYPES = {
    "n_agents": positive_int,
    "rounds": nonnegative_int,
    "temperature": nonnegative_float,
    "top_p": top_p,
    "max_tokens": positive_int,
    "debate_batch_size": positive_int,
}


def debate_option(g: argparse._ArgumentGroup, name: str, from_team: bool = False, **kwargs) -> None:
    """The flag of the debate setting ``name`` (a field of ``DebateArgs``: its name, default and help).
    ``from_team``: it defaults to None, filled from a trained team (its size, its training settings)."""
    if from_team:
        shown = kwargs.pop("default_text", getattr(DebateArgs, name))
        kwargs |= {"default": None, "default_text": f"the trained team's, else {shown}"}
    config_option(g, DebateArgs, name, type=DEBATE_FLAG_TYPES[name], **kwargs)


def add_debate_args(p: argparse.ArgumentParser, from_team: bool = False) -> None:
    """The debate flags, generated from the fields of ``DebateArgs`` (``from_team``: rounds and sampling
    default to a trained team's settings, :func:`debate_settings_from_team`)."""
    g = p.add_argument_group("debate")
    debate_option(g, "n_agents", from_team, metavar="N")
    debate_option(g, "rounds", from_team)
    add_sampling_args(g, from_team)
    debate_option(g, "debate_batch_size")
    g.add_argument("--early-stop", action="store_true", help="stop a debate once all agents agree")


def add_sampling_args(g: argparse._ArgumentGroup, from_team: bool = False) -> None:
    """--temperature, --top-p and --max-tokens (default None: :func:`resolve_max_tokens` picks one by
    device and task); ``from_team`` as for :func:`add_debate_args`."""
    debate_option(g, "temperature", from_team)
    debate_option(g, "top_p", from_team)
    debate_option(g, "max_tokens", from_team, default=None, default_text=MAX_TOKENS_DEFAULT, metavar="N")


def debate_settings_from_team(args: argparse.Namespace, team) -> str | None:
    """Fill the debate flags left unset (None) from the trained team's ``debate`` settings (team.json),
    the rest from their fields' defaults (max tokens: :func:`resolve_max_tokens`); returns the line that
    says what came from the team (None when nothing did)."""
    taken = []
    for key, value in (team.debate if team is not None else {}).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
            taken.append(f"{key} {value}")
    for key in ("rounds", "temperature", "top_p"):
        if getattr(args, key) is None:
            setattr(args, key, getattr(DebateArgs, key))
    if not taken:
        return None
    return f"as the team was trained: {', '.join(taken)} (flags override)"


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


#: the dest of each protocol flag -> its ProtocolConfig option (a flag left out keeps the option's
#: default); every flag is named after its option but DIGRA's alpha (``--digra-alpha``), which is not
#: UDPO's reward coefficient alpha (the config field)
PROTOCOL_FLAGS = {
    "degree": "degree",
    "digra_alpha": "alpha",
    "entropy_model": "entropy_model",
    "stop_stable_agents": "stop_stable_agents",
    "unanimity_stop": "unanimity_stop",
    "interventions": "interventions",
    "qp_fraction": "qp_fraction",
    "dp_k": "dp_k",
    "mr_max_tokens": "mr_max_tokens",
    "embedding_model": "embedding_model",
    "inject": "inject",
    "inject_file": "inject_file",
}


def protocol_option(g: argparse._ArgumentGroup, dest: str, **kwargs) -> None:
    """The flag of the protocol option ``PROTOCOL_FLAGS[dest]``."""
    field_option(g, dest, **kwargs)


def add_protocol_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("protocol (who reads whom; docs/protocols.md)")
    g.add_argument(
        "--protocol",
        default="standard",
        choices=PROTOCOL_NAMES,
        help="standard: every agent reads all peers (default); sparse: a ring of degree D; random: random "
        "peers each round (seeded by --seed); dig / digra: peers chosen by information gain (ratio); "
        "interventions: pruning and misconception refutation of the pool of past responses",
    )
    protocol_option(
        g, "degree", type=finite_float, default=None, help="sparse: D, the fraction of peers read (0.5)"
    )
    protocol_option(
        g,
        "digra_alpha",
        type=finite_float,
        default=None,
        help="digra: alpha of the information-gain ratio (0.2); not UDPO's reward coefficient alpha",
    )
    protocol_option(
        g,
        "entropy_model",
        default=None,
        help="dig/digra: an hf model that scores entropies (default: the team's hf backend and adapters)",
    )
    protocol_option(
        g,
        "stop_stable_agents",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="dig/digra: an agent whose answer held two rounds stops (default: on)",
    )
    protocol_option(
        g,
        "unanimity_stop",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="dig/digra: end a debate once all agents agree (default: on)",
    )
    protocol_option(
        g,
        "interventions",
        type=_names,
        default=None,
        metavar="OP[,OP...]",
        help="interventions: qp, dp and/or mr in the order applied (default: qp,dp,mr)",
    )
    protocol_option(
        g, "qp_fraction", type=probability, default=None, help="share of candidates QP keeps (0.5)"
    )
    protocol_option(
        g, "dp_k", type=positive_int, default=None, help="responses DP keeps (default: the number of agents)"
    )
    protocol_option(
        g, "mr_max_tokens", type=positive_int, default=None, help="completion cap of each MR call (256)"
    )
    protocol_option(
        g, "embedding_model", default=None, help="sentence-transformers folder (default: packaged MiniLM)"
    )
    protocol_option(
        g,
        "inject",
        type=_names,
        default=None,
        metavar="KIND[,KIND...]",
        help="controlled injection: per agent, correct, wrong or own (its own round-0 answer), e.g. "
        "wrong,correct,correct",
    )
    protocol_option(
        g,
        "inject_file",
        type=existing_file,
        default=None,
        help="JSONL of injected responses ({question_id, correct, wrong}); default: written from the gold",
    )


def protocol_config_from_args(args: argparse.Namespace) -> ProtocolConfig:
    options = {
        option: getattr(args, dest)
        for dest, option in PROTOCOL_FLAGS.items()
        if getattr(args, dest) is not None
    }
    return ProtocolConfig.from_options(args.protocol, {**options, "seed": args.seed})


def check_run_args(args: argparse.Namespace) -> None:
    """The checks that need more than one argument, or a look at the disk, made right after parsing and
    before anything heavy loads: the task has ``--split``, ``--model`` can name a model (hf and vllm;
    an openai server names its own). Raises ValueError (the CLI prints it and exits with 2)."""
    from udpo.env.models import check_model

    get_task(args.task).check_split(args.split)
    if not on_server(args):
        check_model(args.model or DEFAULT_MODEL)


def on_server(args: argparse.Namespace) -> bool:
    """Whether ``--backend`` is a server (openai): it names its own model and runs nothing here."""
    return backend_capabilities(args.backend).remote


def runs_on_cpu(args: argparse.Namespace) -> bool:
    """Whether the model of this command runs on this machine's CPU: the hf backend on ``--device cpu``
    or, without ``--device``, on a machine torch sees no GPU on; vllm likewise (its CPU build). A server
    (openai) is taken to have a GPU. Imports torch when it has to ask."""
    if on_server(args):
        return False
    device = getattr(args, "device", None)
    if device is not None:
        return str(device).startswith("cpu")
    import torch

    return not torch.cuda.is_available()


def default_max_tokens(task: str, on_cpu: bool) -> int:
    """The completion cap when ``--max-tokens`` is not given (see ``CPU_MAX_TOKENS``)."""
    return CPU_MAX_TOKENS.get(task, CPU_MAX_TOKENS_OTHER) if on_cpu else GPU_MAX_TOKENS


def resolve_max_tokens(args: argparse.Namespace) -> str | None:
    """Set ``args.max_tokens`` to the device's default for the task when it was not given; returns the
    line that says so (None when the user chose), for the command to print once nothing can fail early."""
    if args.max_tokens is not None:
        return None
    on_cpu = runs_on_cpu(args)
    args.max_tokens = default_max_tokens(args.task, on_cpu)
    where = "CPU" if on_cpu else "GPU / server"
    return f"max tokens per reply: {args.max_tokens} ({where} default for {args.task}; --max-tokens N changes it)"


def say(note: str | None) -> None:
    """Print a note about the run's settings on stderr (nothing for None)."""
    if note:
        print(note, file=sys.stderr)


def load_questions(args: argparse.Namespace) -> tuple[Task, list[Question]]:
    task = get_task(args.task)
    questions = task.load(split=args.split, data_path=args.data_path, limit=args.limit, seed=args.seed)
    if not questions:
        raise ValueError(f"no questions in split {args.split!r} of task {args.task!r}")
    return task, questions


def backend_from_args(args: argparse.Namespace) -> Backend:
    """The backend of ``--backend`` with the shared settings (``udpo.env.backends.backend_from_settings``,
    the builder training's rollout engines use too). The hf backend's dtype, and why, is said on stderr
    (``dtype auto = fp32 for generation (probe: ...)``)."""
    server = on_server(args)
    backend = backend_from_settings(
        args.backend,
        model=model_name(args),
        dtype=args.dtype,
        device=args.device,
        seed=args.seed,
        base_url=args.base_url,
        api_key=read_api_key_file(args.api_key_file) if server and args.api_key_file else None,  # None: env
        chat_template_kwargs=args.chat_template_kwargs,
    )
    choice = getattr(backend, "dtype_choice", None)  # the hf backend's: which dtype it loaded, and why
    if choice is not None:
        say(choice.describe())
    return backend


def model_name(args: argparse.Namespace) -> str | None:
    """The model a run uses (None: a server's own default)."""
    return args.model or (None if on_server(args) else DEFAULT_MODEL)


def debate_config_from_args(args: argparse.Namespace) -> DebateConfig:
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens)
    return DebateConfig(
        n_agents=args.n_agents,
        rounds=args.rounds,
        sampling=sampling,
        early_stop=args.early_stop,
        debate_batch_size=args.debate_batch_size,
    )
