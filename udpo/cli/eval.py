"""``udpo eval``: evaluate a team (a checkpoint or a plain model) with and without attack.

Prints one table (accuracy, U_intra, U_inter, U_sys per number m of compromised agents, the
natural m = 0 row first, and the accuracy drop) and writes OUTPUT_DIR/summary.json, OUTPUT_DIR/table.csv and
one folder of trajectories per row (see ``udpo.analysis.attack_eval``).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from udpo.analysis.attack_eval import check_out_dir, compromised_sets, evaluate_attacks, format_table
from udpo.config.groups import DebateArgs
from udpo.env.attacks import ATTACK_NAMES, AttackConfig
from udpo.env.protocols import ProtocolConfig, build_protocol
from udpo.env.seeds import seed_everything
from udpo.training.run_lock import held

from .argtypes import (
    existing_path,
    field_option,
    int_list,
    nonnegative_float,
    positive_int,
    probability,
    seed,
)
from .common import (
    add_backend_args,
    add_debate_args,
    add_protocol_args,
    add_task_args,
    backend_from_args,
    check_run_args,
    debate_config_from_args,
    debate_settings_from_team,
    load_questions,
    model_name,
    protocol_config_from_args,
    resolve_max_tokens,
    say,
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "eval",
        help="evaluate a team with and without attack (compromised agents)",
        description="Debate a task with no attack and with m compromised agents; print accuracy, "
        "U_intra, U_inter, U_sys per m and the accuracy drop; write OUTPUT_DIR/summary.json, OUTPUT_DIR/table.csv "
        "and one trajectory folder per row. Agent indices are 0-based (agent_0 .. agent_{N-1}).",
    )
    add_task_args(p)
    add_backend_args(p)
    p.add_argument(
        "--checkpoint",
        type=existing_path,
        default=None,
        help="team folder with team.json and adapters/ (e.g. RUN/checkpoints/iter_000100), or a run folder "
        "(its latest checkpoint); its base model "
        "replaces --model and its agents (adapters, profiles) are evaluated",
    )
    add_debate_args(p, from_team=True)  # rounds, temperature, top_p, max tokens: the team's, else defaults
    add_protocol_args(p)

    g = p.add_argument_group("attack")
    field_option(
        g,
        "attack_eval",
        default="none",
        choices=ATTACK_NAMES,
        help="attack on the compromised agents (default: none, the natural evaluation only)",
    )
    field_option(
        g,
        "attack_eval_m",
        type=int_list(minimum=1),
        default=None,
        metavar="M[,M...]",
        help="numbers of compromised agents to sweep, one attacked row per m, the last m agents each "
        "time (default: 1)",
    )
    g.add_argument(
        "--compromised-agents",
        dest="agent_sets",
        type=int_list(minimum=0),
        action="append",
        default=None,
        metavar="I[,J...]",
        help="0-based indices of the compromised agents for one attacked row, instead of the last m; "
        "repeat for more rows",
    )
    field_option(
        g,
        "attack_eval_attacker",
        default="base",
        metavar="ATTACKER",
        help="'base' (the team's base model, default), 'builtin' (fixed profile / rule-based "
        "corruption, no LLM) or a model alias, folder or Hub id",
    )
    g.add_argument(
        "--attacker-backend", default="hf", help="backend for a separate attacker model (default: hf)"
    )
    g.add_argument(
        "--attacker-base-url",
        default=None,
        help="server of an openai attacker backend (default: http://127.0.0.1:8000/v1; key from "
        "UDPO_API_KEY or OPENAI_API_KEY)",
    )
    g.add_argument("--attack-seed", type=seed, default=0, help="seed of the attack (default: 0)")
    g.add_argument(
        "--p-message", type=probability, default=0.5, help="AutoInject Pm: chance a message is attacked"
    )
    g.add_argument(
        "--p-sentence",
        type=probability,
        default=0.5,
        help="AutoInject Pe: chance a sentence of an attacked message is rewritten",
    )
    g.add_argument(
        "--attacker-temperature",
        type=nonnegative_float,
        default=None,
        help="attacker sampling temperature (default: 0.7 AutoTransform, 0 AutoInject)",
    )
    g.add_argument(
        "--attacker-max-tokens", type=positive_int, default=256, help="attacker completion cap (default: 256)"
    )
    g.add_argument(
        "--attack-cache",
        default=None,
        help="AutoTransform cache folder (default: $UDPO_CACHE/attacks/autotransform)",
    )

    field_option(p, "output_dir", default="runs/eval", help="output folder (default: runs/eval)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted evaluation in --output-dir")
    p.add_argument(
        "--no-progress",
        "--no_progress",
        dest="progress",
        action="store_false",
        help="hide the progress lines (per row: rounds, agents' turns, tokens, tokens/s, time left)",
    )
    p.set_defaults(func=run, check=check)


def check(args: argparse.Namespace) -> tuple[Any, AttackConfig, list[list[int]], ProtocolConfig]:
    """The checks made before torch and the model load (the CLI runs it first; ``run`` repeats it):
    the checkpoint's team (its base model replaces --model), the agents, the attack and its compromised
    sets, the protocol, the output folder. Returns (team or None, attack, compromised sets, protocol)."""
    team = _load_team(args)
    check_run_args(args)
    n_agents = (
        args.n_agents if args.n_agents is not None else (team.n_agents if team else DebateArgs.n_agents)
    )
    if team is not None and n_agents != team.n_agents:
        raise ValueError(
            f"--n-agents {n_agents} but the checkpoint {args.checkpoint} has {team.n_agents} agents"
        )
    args.n_agents = n_agents
    attack = AttackConfig(
        name=args.attack_eval,
        attacker=args.attack_eval_attacker,
        attacker_backend=args.attacker_backend,
        attacker_base_url=args.attacker_base_url,
        seed=args.attack_seed,
        p_message=args.p_message,
        p_sentence=args.p_sentence,
        temperature=args.attacker_temperature,
        max_tokens=args.attacker_max_tokens,
        cache_dir=args.attack_cache,
    )
    if attack.name == "none" and (args.attack_eval_m or args.agent_sets):
        raise ValueError(
            "--attack-eval-m / --compromised-agents choose the agents to attack; "
            "also pass --attack-eval autotransform|autoinject"
        )
    protocol_config = protocol_config_from_args(args)
    sets = (
        compromised_sets(n_agents, m_values=args.attack_eval_m, compromised=args.agent_sets)
        if attack.name != "none"
        else []
    )
    check_out_dir(Path(args.output_dir), args.resume)
    return team, attack, sets, protocol_config


def run(args: argparse.Namespace) -> int:
    with held(args.output_dir, resume="--resume"):  # one process writes --output-dir at a time
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    team, attack, sets, protocol_config = check(args)
    n_agents = args.n_agents
    trained_as = debate_settings_from_team(args, team)
    note = resolve_max_tokens(args)  # may import torch to ask for a GPU: after the cheap checks
    config = debate_config_from_args(args)
    if team is not None:
        config = dataclasses.replace(config, agents=team.agent_specs())
    seed_everything(args.seed)
    task, questions = load_questions(args)
    meta = {
        "task": args.task,
        "model": model_name(args),
        "checkpoint": args.checkpoint,
        "backend": args.backend,
        "split": args.split,
        "n_agents": n_agents,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "seed": args.seed,
    }
    say(trained_as)  # the settings chosen, now that nothing is refused early
    say(note)
    with backend_from_args(args) as backend, build_protocol(protocol_config, task, backend) as protocol:
        meta["protocol"] = protocol.describe()
        if team is not None:
            team.register(backend, args.checkpoint)
        summary = evaluate_attacks(
            task,
            backend,
            questions,
            config,
            attack,
            sets,
            base_model=model_name(args) or getattr(backend, "model", None),  # openai: the server's model
            out_dir=args.output_dir,
            meta=meta,
            resume=args.resume,
            progress=args.progress,
            protocol=protocol,
        )
    print(
        f"{args.task}: N={n_agents} agents, T={args.rounds} rounds, protocol={args.protocol}, "
        f"attack={args.attack_eval}"
    )
    print(format_table(summary))
    print(
        f"wrote {Path(args.output_dir) / 'summary.json'}, {Path(args.output_dir) / 'table.csv'} and one trajectory "
        "folder per row"
    )
    return 0


def _load_team(args: argparse.Namespace):
    """The checkpoint's TeamManifest (its base model replaces --model), or None."""
    if args.checkpoint is None:
        return None
    from udpo.training.export import find_checkpoint
    from udpo.training.team import TeamManifest

    args.checkpoint = str(find_checkpoint(args.checkpoint))  # a team folder, or a run's latest checkpoint
    team = TeamManifest.load(args.checkpoint)
    team.check_adapters(args.checkpoint)  # before a model loads
    args.model = team.base_model
    return team
