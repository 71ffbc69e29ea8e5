"""One vocabulary for the ``udpo`` flags and the config fields (issue 25; docs/cli.md): an option that
sets what a config field (or protocol option) sets is named after it, in both spellings, with the field
as its dest; every option of every command is either tied to a field or listed here as having none. Also
the one backend builder the commands and training share."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from udpo.cli import build_parser
from udpo.cli.common import PROTOCOL_FLAGS, protocol_config_from_args
from udpo.config import TrainConfig
from udpo.env.protocols import ProtocolConfig

ROOT = Path(__file__).resolve().parents[1]
FIELDS = {f.name for f in dataclasses.fields(TrainConfig)}
PROTOCOL_OPTIONS = {f.name for f in dataclasses.fields(ProtocolConfig)} - {"name"}

#: what a command needs on its command line to parse
BASE = {
    "debate": ["debate", "--task", "arithmetic", "--protocol", "digra"],
    "eval": ["eval", "--task", "arithmetic", "--protocol", "digra"],
    "detect": ["detect"],
    "uncertainty": ["uncertainty", "--task", "commonsenseqa"],
    "diagnose": ["diagnose", "RUN", "--out", "d"],
    "export": ["export", "CKPT", "--out", "e"],
}
#: (command, dest) of the options no config field or protocol option sets, and why
NO_COUNTERPART = {
    **dict.fromkeys(
        [(c, "split") for c in ("debate", "eval", "detect", "uncertainty")],
        "one split; the config has train_split and eval_split",
    ),
    **dict.fromkeys(
        [
            (c, d)
            for c in ("debate", "eval", "detect", "uncertainty")
            for d in ("limit", "device", "api_key_file")
        ],
        "the first K questions / the hf device / the key file: training has no such setting",
    ),
    **dict.fromkeys([(c, "api_key") for c in ("debate", "eval", "detect", "uncertainty")], "refused"),
    **dict.fromkeys(
        [("debate", "early_stop"), ("eval", "early_stop")], "training never stops a debate early"
    ),
    ("eval", "checkpoint"): "the team to evaluate",
    **dict.fromkeys(
        [
            ("eval", d)
            for d in (
                "agent_sets",
                "attacker_backend",
                "attacker_base_url",
                "attack_seed",
                "p_message",
                "p_sentence",
                "attacker_temperature",
                "attacker_max_tokens",
                "attack_cache",
            )
        ],
        "training's attack evaluation uses their defaults",
    ),
    **dict.fromkeys(
        [("detect", d) for d in ("word_limit", "debater_models", "judge_model", "compare")], "detection only"
    ),
    **dict.fromkeys(
        [
            ("uncertainty", d)
            for d in (
                "method",
                "max_rounds",
                "aspects",
                "per_aspect",
                "samples",
                "min_votes",
                "cluster_judge",
            )
        ],
        "uncertainty estimation only",
    ),
    **dict.fromkeys(
        [("diagnose", d) for d in ("runs", "out", "labels", "baseline_run", "no_plots", "regrade_forms")],
        "analysis",
    ),
    **dict.fromkeys(
        [("export", d) for d in ("checkpoint", "out", "merge", "overwrite", "base_model")], "not a run folder"
    ),
    **dict.fromkeys([("report", d) for d in ("run", "run_b", "out")], "an HTML page"),
    **dict.fromkeys(
        [
            (c, d)
            for c in ("compare", "study")
            for d in (
                "plan",
                "status",
                "tables_only",
                "workers",
                "ray",
                "threads",
                "gpu_memory_share",
                "sample_size",
                "second_stage",
                "headroom_check",
                "grader",
            )
        ],
        "a study plan (a compare config) and how many processes run it",
    ),
    **dict.fromkeys([("train", "args"), ("calibrate", "args")], "every config field, by the config's parser"),
}


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


def test_the_help_shows_both_spellings(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["debate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--n-agents N, --n_agents N" in text
    assert "--digra-alpha" in text and "not UDPO's reward coefficient alpha" in text


def test_every_option_is_named_after_its_config_field_or_has_none():
    seen = {(name, a.dest) for name, parser in commands().items() for a in options(parser)}
    assert set(NO_COUNTERPART) <= seen, set(NO_COUNTERPART) - seen  # the list names options that exist
    for name, parser in commands().items():
        for action in options(parser):
            if (name, action.dest) in NO_COUNTERPART:
                continue
            dest = action.dest
            assert dest in FIELDS or dest in PROTOCOL_FLAGS, (name, action.option_strings, dest)
            if not action.option_strings:
                continue
            dash, under = f"--{dest.replace('_', '-')}", f"--{dest}"
            if isinstance(action, argparse._StoreFalseAction):  # --no-progress sets progress
                dash, under = f"--no-{dest.replace('_', '-')}", f"--no_{dest}"
            assert dash in action.option_strings and under in action.option_strings, (
                name,
                action.option_strings,
            )


def test_protocol_flags_are_protocol_options_and_digras_alpha_is_not_udpos():
    assert set(PROTOCOL_FLAGS.values()) <= PROTOCOL_OPTIONS
    assert all(dest == option for dest, option in PROTOCOL_FLAGS.items() if dest != "digra_alpha")
    assert PROTOCOL_FLAGS["digra_alpha"] == "alpha"
    for command in ("debate", "eval"):
        for flag in ("--digra-alpha", "--digra_alpha"):
            args = build_parser().parse_args([*BASE[command], flag, "0.3"])
            assert not hasattr(args, "alpha")  # nothing in a command's namespace reads as UDPO's alpha_i
            assert protocol_config_from_args(args).alpha == 0.3


def test_a_boolean_protocol_option_takes_both_spellings_and_their_negations():
    parse = build_parser().parse_args
    for argv, want in (
        ([], None),
        (["--stop-stable-agents"], True),
        (["--stop_stable_agents"], True),
        (["--no-stop-stable-agents"], False),
        (["--no_stop_stable_agents"], False),
    ):
        assert parse([*BASE["debate"], *argv]).stop_stable_agents is want, argv


def test_progress_and_output_dir_as_udpo_train_spells_them():
    parse = build_parser().parse_args
    for command in ("debate", "eval"):
        assert parse(BASE[command]).progress is True
        assert parse([*BASE[command], "--no_progress"]).progress is False
        assert parse([*BASE[command], "--no-progress"]).progress is False
    compare = ["compare", "--config", "c.yaml"]
    assert (
        parse([*compare, "--output-dir", "x"]).output_dir == parse([*compare, "--output_dir", "x"]).output_dir
    )
    assert parse([*compare, "--no_progress"]).progress is False


def test_the_docs_table_names_every_flag():
    text = (ROOT / "docs" / "cli.md").read_text()
    for name, parser in commands().items():
        for action in options(parser):
            if (
                action.help is argparse.SUPPRESS
                or not action.option_strings
                or name in ("train", "calibrate")
            ):
                continue
            flag = action.option_strings[0]
            assert f"`{flag}`" in text or f"`{flag} " in text, (name, flag)


# --- one backend builder ---------------------------------------------------------------------------------
@pytest.fixture
def built(monkeypatch):
    """The (name, kwargs) make_backend receives."""
    import udpo.env.backends as backends

    calls = []
    monkeypatch.setattr(backends, "make_backend", lambda name, **kw: calls.append((name, kw)) or object())
    return calls


def test_backend_from_settings_gives_each_backend_the_settings_it_takes(built):
    from udpo.env.backends import backend_from_settings

    shared = {
        "model": "m",
        "dtype": "bf16",
        "device": "cpu",
        "seed": 3,
        "base_url": "http://h/v1",
        "api_key": "k",
        "chat_template_kwargs": {"enable_thinking": False},
    }
    for name in ("hf", "vllm", "openai"):
        backend_from_settings(name, **shared)
    backend_from_settings("vllm", model="m", max_loras=2)  # options pass through; None leaves defaults
    backend_from_settings("openai", base_url="http://h/v1", model=None)
    template = {"chat_template_kwargs": {"enable_thinking": False}}
    assert built == [
        ("hf", {"model": "m", "dtype": "bf16", "device": "cpu", **template}),
        ("vllm", {"model": "m", "dtype": "bf16", "seed": 3, **template}),
        ("openai", {"model": "m", "base_url": "http://h/v1", "api_key": "k", **template}),
        ("vllm", {"model": "m", "max_loras": 2}),
        ("openai", {"base_url": "http://h/v1"}),
    ]


def test_the_commands_build_their_backend_as_before(built):
    """What ``backend_from_args`` gives each backend (a setting left None leaves the backend's default)."""
    from udpo.cli.common import backend_from_args

    parse = build_parser().parse_args
    for backend in ("hf", "vllm", "openai"):
        backend_from_args(parse([*BASE["debate"], "--backend", backend, "--seed", "5", "--dtype", "fp32"]))
    hf, vllm, openai = (kw for _, kw in built)
    assert hf == {"model": "smollm2-135m-instruct", "dtype": "fp32"}  # device None: the backend picks
    assert vllm == {"model": "smollm2-135m-instruct", "dtype": "fp32", "seed": 5}
    assert openai == {"model": "smollm2-135m-instruct"}  # base_url None: the backend's default address


@pytest.mark.parametrize("old", ["--compromised", "--baseline", "--out", "--agents"])
def test_a_removed_flag_is_refused_not_read_as_the_start_of_another(old, capsys):
    command = "diagnose" if old == "--baseline" else "eval"
    with pytest.raises(SystemExit):
        build_parser().parse_args([*BASE[command], old, "1"])
    assert f"unrecognized arguments: {old} 1" in capsys.readouterr().err


# --- backend capabilities ---------------------------------------------------------------------------------
def test_each_backend_class_declares_the_capabilities_its_name_gives():
    import importlib

    import udpo.env.backends as backends

    for name, (module, cls, _) in backends._BACKENDS.items():
        assert getattr(importlib.import_module(module), cls).capabilities is backends.backend_capabilities(
            name
        )
    assert backends.backend_capabilities("hf").serves_live_model
    assert backends.backend_capabilities("openai").remote
    with pytest.raises(ValueError, match="unknown backend 'tgi'"):
        backends.backend_capabilities("tgi")


def test_only_the_backends_compare_a_backend_name():
    """Engine knowledge stays in udpo.env.backends: elsewhere code asks what a backend can do."""
    name = r"""["'](?:hf|vllm|openai|scripted)["']"""
    compare = re.compile(rf"(?:==|!=)\s*{name}|{name}\s*(?:==|!=)|backend\s+(?:not\s+)?in\s+[(\[{{]")
    found = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for folder in ("udpo", "env", "rewards")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "backends" not in path.relative_to(ROOT).parts
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if compare.search(line)
    ]
    assert not found, "ask backend_capabilities(name) instead:\n" + "\n".join(found)


# --- one home per default ---------------------------------------------------------------------------------
#: the options of ``udpo debate`` generated from config fields (their help and default the field's)
GENERATED = (
    "data_path",
    "model",
    "backend",
    "dtype",
    "base_url",
    "chat_template_kwargs",
    "n_agents",
    "rounds",
    "temperature",
    "top_p",
    "max_tokens",
    "debate_batch_size",
)


def test_debate_and_backend_flags_take_their_defaults_and_help_from_the_config_fields():
    from udpo.config import DebateArgs, ModelArgs
    from udpo.env.backends import SamplingParams
    from udpo.env.debate import DebateConfig
    from udpo.env.models import DEFAULT_MODEL

    assert (DebateArgs.n_agents, DebateArgs.rounds, DebateArgs.debate_batch_size) == (
        DebateConfig.n_agents,
        DebateConfig.rounds,
        DebateConfig.debate_batch_size,
    )
    sampling = (SamplingParams.temperature, SamplingParams.top_p, SamplingParams.max_tokens)
    assert (DebateArgs.temperature, DebateArgs.top_p, DebateArgs.max_tokens) == sampling
    assert ModelArgs.model == DEFAULT_MODEL
    args = build_parser().parse_args(BASE["debate"])
    fields = {f.name: f for group in (DebateArgs, ModelArgs) for f in dataclasses.fields(group)}
    generated = [a for a in options(commands()["debate"]) if a.dest in GENERATED]
    assert sorted(a.dest for a in generated) == sorted(GENERATED)
    for action in generated:
        field = fields[action.dest]
        assert action.help.startswith(field.metadata["help"]), action.dest
        if action.dest not in ("base_url", "max_tokens"):  # the openai backend's address; by device and task
            assert getattr(args, action.dest) == field.default, action.dest
