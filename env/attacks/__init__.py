"""Attacks on a debate: ``m`` of the N agents are compromised (docs/attacks.md).

- ``autotransform``: each compromised agent runs with a malicious profile (system prompt) that
  an attacker LLM rewrote from its benign one (``autotransform.py``).
- ``autoinject``: the messages compromised agents send to their peers are corrupted sentence by
  sentence (``autoinject.py``).

Compromised agents keep their adapters, so a trained team is attacked as it is deployed.
Agent indices are 0-based (``agent_0`` .. ``agent_{N-1}``, as in ``team.json`` and the answer
matrix); by default the last ``m`` agents are compromised.

``apply_attack`` turns an ``AttackConfig`` plus the compromised indices into debate protocol stages
(``udpo.env.protocols``) that compose with any protocol: AutoTransform assigns the malicious profiles
(``AssignProfiles``), AutoInject rewrites the compromised agents' messages (``MessageRewrite``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..backends import Backend, SamplingParams, backend_capabilities, backend_from_settings
from ..debate import AgentSpec, DebateConfig
from ..protocols.base import Stage
from ..protocols.rewrite import AssignProfiles, MessageRewrite
from ..tasks.base import Task
from .autoinject import AutoInject, split_sentences
from .autotransform import TransformedProfile, builtin_profile, transform_profile
from .errors import AttackError

ATTACK_NAMES = ("none", "autotransform", "autoinject")


@dataclass
class AttackConfig:
    """How to attack a debate.

    name: "none", "autotransform" or "autoinject".
    attacker: who writes the attack. "base" (default): the team's base model, served by the team's
        own backend with no adapter. "builtin": no LLM at all; the fixed malicious profile of the
        task (AutoTransform) or the rule-based sentence corruption (AutoInject). Anything else: a
        model alias, folder or Hub id, loaded with ``attacker_backend``.
    attacker_backend: backend for a separate attacker model ("hf", "vllm", "openai").
    attacker_base_url: server of an "openai" attacker backend (None: the backend's default,
        ``http://127.0.0.1:8000/v1``); the API key is read from ``UDPO_API_KEY`` or ``OPENAI_API_KEY``.
    seed: seeds the attacker's sampling, the AutoTransform cache entry and AutoInject's draws.
    p_message / p_sentence: AutoInject's Pm (a message is attacked) and Pe (a sentence of it is).
    temperature: attacker sampling temperature (None: 0.7 for AutoTransform, greedy for AutoInject).
    max_tokens: attacker completion cap.
    cache_dir: AutoTransform cache root (None: ``$UDPO_CACHE/attacks/autotransform``).
    """

    name: str = "none"
    attacker: str = "base"
    attacker_backend: str = "hf"
    attacker_base_url: str | None = None
    seed: int = 0
    p_message: float = 0.5
    p_sentence: float = 0.5
    temperature: float | None = None
    max_tokens: int = 256
    cache_dir: str | None = None

    def __post_init__(self) -> None:
        if self.name not in ATTACK_NAMES:
            raise ValueError(f"unknown attack {self.name!r}; choose one of {', '.join(ATTACK_NAMES)}")
        for key in ("p_message", "p_sentence"):
            p = getattr(self, key)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"attack {key} must be in [0, 1], got {p}")
        if self.max_tokens < 1:
            raise ValueError(f"attack max_tokens must be >= 1, got {self.max_tokens}")
        if not self.attacker:
            raise ValueError("attack attacker must be 'base', 'builtin' or a model name")
        if self.attacker_base_url and not backend_capabilities(self.attacker_backend).remote:
            raise ValueError(
                f"attacker_base_url is only used by a server backend such as 'openai' (attacker_backend is "
                f"{self.attacker_backend!r})"
            )

    def describe(self) -> dict[str, Any]:
        """The settings that define this attack (for trajectory meta and summaries)."""
        if self.name == "none":
            return {"name": "none"}
        out: dict[str, Any] = {"name": self.name, "attacker": self.attacker, "seed": self.seed}
        if self.attacker not in ("base", "builtin"):
            out["attacker_backend"] = self.attacker_backend
            if self.attacker_base_url:
                out["attacker_base_url"] = self.attacker_base_url
        if self.name == "autoinject":
            out.update(p_message=self.p_message, p_sentence=self.p_sentence)
        return out

    def sampling(self) -> SamplingParams:
        default = 0.7 if self.name == "autotransform" else 0.0
        temperature = default if self.temperature is None else self.temperature
        return SamplingParams(
            temperature=temperature, max_tokens=self.max_tokens, seed=self.seed, logprobs=False
        )


def default_compromised(m: int, n_agents: int) -> list[int]:
    """The last ``m`` agents (validated as ``check_compromised`` does)."""
    if m < 0:
        raise ValueError(f"the number of compromised agents m must be >= 0, got {m}")
    return check_compromised(list(range(n_agents - m, n_agents)), n_agents) if m else []


def check_compromised(indices: Sequence[int], n_agents: int) -> list[int]:
    """Sorted 0-based indices, each in [0, N), no repeats, and at least one honest agent left."""
    indices = list(indices)
    bad = [i for i in indices if not isinstance(i, int) or not 0 <= i < n_agents]
    if bad:
        raise ValueError(
            f"compromised agent index {bad[0]!r} is out of range: agents are 0..{n_agents - 1} (0-based)"
        )
    if len(set(indices)) != len(indices):
        raise ValueError(f"compromised agents {indices} list an agent twice")
    if len(indices) >= n_agents:
        raise ValueError(f"m = {len(indices)} compromised agents of N = {n_agents}: m must be < N")
    return sorted(indices)


@contextmanager
def attacker_backend(config: AttackConfig, team_backend: Backend) -> Iterator[Backend | None]:
    """The backend that writes attacks: the team's (attacker "base"), None ("builtin" or no attack),
    or a separate one for an attacker model, closed on exit."""
    if config.name == "none" or config.attacker == "builtin":
        yield None
    elif config.attacker == "base":
        yield team_backend
    else:
        try:
            backend = backend_from_settings(
                config.attacker_backend, model=config.attacker, base_url=config.attacker_base_url
            )
        except (OSError, ValueError, RuntimeError) as e:
            raise AttackError(
                f"could not start the attacker model {config.attacker!r} ({config.attacker_backend}): {e}"
            ) from e
        try:
            yield backend
        finally:
            backend.close()


@dataclass
class AttackedDebate:
    """An attack ready to run: protocol stages to add to any protocol, and what they do to the team.

    debate_config: the team as attacked (compromised agents' profiles changed, adapters kept).
    stages: the attack's protocol stages, to add with ``protocol.with_stages(*stages)`` (or
        ``DebateEnv(..., protocol=stages)``) over the team's own, unattacked config.
    meta: attack settings and compromised indices, for every trajectory and summary.
    profiles: AutoTransform's malicious profile per compromised agent.
    """

    debate_config: DebateConfig
    stages: list[Stage] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    profiles: dict[int, TransformedProfile] = field(default_factory=dict)

    @property
    def injector(self) -> AutoInject | None:
        """AutoInject's message transform (None for other attacks)."""
        rewrite = next((s for s in self.stages if isinstance(s, MessageRewrite)), None)
        return (
            rewrite.transform if rewrite is not None and isinstance(rewrite.transform, AutoInject) else None
        )

    @property
    def message_transform(self) -> AutoInject | None:
        return self.injector

    def report(self) -> dict[str, Any]:
        """Details for a summary: the malicious profiles used, or AutoInject's counts so far."""
        out: dict[str, Any] = {}
        if self.profiles:
            out["profiles"] = {
                str(i): {"source": p.source, "path": p.path, "profile": p.profile}
                for i, p in self.profiles.items()
            }
        if self.injector is not None:
            out["injections"] = self.injector.stats()
        return out


def apply_attack(
    config: AttackConfig,
    task: Task,
    debate_config: DebateConfig,
    compromised: Sequence[int],
    attacker: Backend | None = None,
    attacker_name: str | None = None,
) -> AttackedDebate:
    """Compromise agents ``compromised`` of ``debate_config`` with the attack ``config``.

    attacker: the backend writing the attack (see ``attacker_backend``); None with attacker
    "builtin". attacker_name: the attacker model's name (for the AutoTransform cache; required
    when an attacker backend is given). Raises AttackError when the attacker fails.
    """
    n = debate_config.n_agents
    compromised = check_compromised(compromised, n) if config.name != "none" else []
    meta = {"attack": config.describe(), "compromised": compromised, "m": len(compromised)}
    if config.name == "none" or not compromised:
        return AttackedDebate(debate_config, [], meta)
    if attacker is not None and not attacker_name:
        raise ValueError(
            "apply_attack needs attacker_name (the attacker model's name) with an attacker backend"
        )
    if attacker is None and config.attacker != "builtin":
        raise ValueError(f"attacker {config.attacker!r} needs an attacker backend (see attacker_backend)")
    if config.name == "autoinject":
        inject = AutoInject(
            compromised,
            attacker=attacker,
            p_message=config.p_message,
            p_sentence=config.p_sentence,
            seed=config.seed,
            sampling=config.sampling(),
        )
        return AttackedDebate(debate_config, [MessageRewrite(inject, name="autoinject")], meta)
    agents = list(debate_config.agents or [AgentSpec() for _ in range(n)])
    by_benign: dict[str, TransformedProfile] = {}
    profiles: dict[int, TransformedProfile] = {}
    for i in compromised:
        benign = agents[i].profile if agents[i].profile is not None else task.default_profile
        if benign not in by_benign:
            if attacker is None:
                by_benign[benign] = TransformedProfile(builtin_profile(task.name), benign, "builtin")
            else:
                by_benign[benign] = transform_profile(
                    benign,
                    task.name,
                    attacker,
                    attacker_name or "",
                    seed=config.seed,
                    sampling=config.sampling(),
                    cache_root=config.cache_dir,
                )
        profiles[i] = by_benign[benign]
    meta["profile_sources"] = {str(i): p.source for i, p in profiles.items()}
    stage = AssignProfiles({i: p.profile for i, p in profiles.items()}, name="autotransform")
    attacked = dataclasses.replace(debate_config, agents=stage.prepare(agents, task))
    return AttackedDebate(attacked, [stage], meta, profiles)


__all__ = [
    "ATTACK_NAMES",
    "AttackConfig",
    "AttackError",
    "AttackedDebate",
    "AutoInject",
    "TransformedProfile",
    "apply_attack",
    "attacker_backend",
    "builtin_profile",
    "check_compromised",
    "default_compromised",
    "split_sentences",
    "transform_profile",
]
