"""Protocols by name, with their options: what ``udpo debate --protocol``, ``udpo eval`` and training
recipes (``protocol`` + ``protocol_options``) build. See docs/protocols.md."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields
from typing import Any

from ..backends.base import Backend, SamplingParams
from ..tasks.base import Task
from .base import Stage
from .digra import ALPHA, DIGRATopology
from .embeddings import SentenceEmbedder
from .injection import Injection, check_pattern
from .interventions import INTERVENTIONS, Interventions, Refuter
from .protocol import Protocol
from .stopping import StableAgentStop, UnanimityStop
from .topology import RandomTopology, SparseTopology

PROTOCOL_NAMES = ("standard", "sparse", "random", "dig", "digra", "interventions")
_DIG = ("dig", "digra")
#: option -> the protocols it applies to (the injection options and ``seed`` apply to all)
APPLIES_TO: dict[str, tuple[str, ...]] = {
    "degree": ("sparse",),
    "alpha": ("digra",),
    "entropy_model": _DIG,
    "stop_stable_agents": _DIG,
    "unanimity_stop": _DIG,
    "interventions": ("interventions",),
    "qp_fraction": ("interventions",),
    "dp_k": ("interventions",),
    "mr_max_tokens": ("interventions",),
    "embedding_model": ("interventions",),
}


@dataclass
class ProtocolConfig:
    """Who reads whom in a debate, and in what form.

    name: standard (every agent reads all peers), sparse, random, dig, digra or interventions.
    degree: sparse: D, the fraction of the other agents each agent reads (0.5).
    seed: random: seed of the topology draws (per question, round and agent).
    alpha: digra: alpha of the information-gain ratio (0.2).
    entropy_model: dig/digra: an hf model (alias, folder or Hub id) that scores the entropies instead of
        the team's backend, whose agents' adapters are used otherwise; needed when the team's backend
        gives no logits (vllm, openai).
    stop_stable_agents: dig/digra: an agent whose answer held for two rounds stops answering (true).
    unanimity_stop: dig/digra: the debate ends once every agent gives the same answer (true).
    interventions: the interventions, in the order applied: qp, dp, mr (all three).
    qp_fraction: share of the candidate responses quality pruning keeps (0.5).
    dp_k: responses diversity pruning keeps (null: the number of agents).
    mr_max_tokens: completion cap of each misconception-refutation call (256).
    embedding_model: sentence-transformers folder for pruning (null: the packaged all-MiniLM-L6-v2).
    inject: controlled injection, one entry per agent: correct, wrong or own (null: none).
    inject_file: JSONL of the injected responses (null: written from the gold answer).
    """

    name: str = "standard"
    degree: float = 0.5
    seed: int = 0
    alpha: float = ALPHA
    entropy_model: str | None = None
    stop_stable_agents: bool = True
    unanimity_stop: bool = True
    interventions: list[str] = field(default_factory=lambda: list(INTERVENTIONS))
    qp_fraction: float = 0.5
    dp_k: int | None = None
    mr_max_tokens: int = 256
    embedding_model: str | None = None
    inject: list[str] | None = None
    inject_file: str | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            kinds = _KINDS[f.name]
            if not (value is None and f.default is None) and (
                isinstance(value, bool) != (bool in kinds) or not isinstance(value, kinds)
            ):
                raise ValueError(f"protocol option {f.name} must be {_KIND_NAMES[kinds]}, got {value!r}")
        if self.name not in PROTOCOL_NAMES:
            raise ValueError(f"unknown protocol {self.name!r}; choose one of {', '.join(PROTOCOL_NAMES)}")
        for f in fields(self):
            if f.name in APPLIES_TO and self.name not in APPLIES_TO[f.name]:
                default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
                if getattr(self, f.name) != default:
                    raise ValueError(
                        f"protocol option {f.name} applies to {', '.join(APPLIES_TO[f.name])}, "
                        f"not to protocol {self.name}"
                    )
        if not 0 < self.degree <= 1:
            raise ValueError(f"protocol option degree must be in (0, 1], got {self.degree}")
        if not self.alpha >= 0:
            raise ValueError(f"protocol option alpha must be >= 0, got {self.alpha}")
        if not 0 < self.qp_fraction <= 1:
            raise ValueError(f"protocol option qp_fraction must be in (0, 1], got {self.qp_fraction}")
        if self.dp_k is not None and self.dp_k < 1:
            raise ValueError(f"protocol option dp_k must be >= 1, got {self.dp_k}")
        if self.mr_max_tokens < 1:
            raise ValueError(f"protocol option mr_max_tokens must be >= 1, got {self.mr_max_tokens}")
        ops = self.interventions = list(self.interventions)
        if not ops or any(op not in INTERVENTIONS for op in ops) or len(set(ops)) != len(ops):
            raise ValueError(
                f"protocol option interventions: distinct names among {', '.join(INTERVENTIONS)}, got {ops}"
            )
        if self.inject is not None:
            self.inject = check_pattern(self.inject)
        if self.inject_file and self.inject is None:
            raise ValueError("protocol option inject_file needs inject (one of correct/wrong/own per agent)")

    @classmethod
    def from_options(cls, name: str, options: dict[str, Any] | None = None) -> ProtocolConfig:
        """``name`` with a mapping of options; unknown keys are named (with the closest known one)."""
        options = dict(options or {})
        known = [f.name for f in fields(cls) if f.name != "name"]
        unknown = [k for k in options if k not in known]
        if unknown:
            hints = []
            for k in unknown:
                close = difflib.get_close_matches(k, known, n=1)
                hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise ValueError(f"unknown protocol option(s) {', '.join(hints)}; known: {', '.join(known)}")
        return cls(name=name, **options)

    def options(self) -> dict[str, Any]:
        """The options that differ from their defaults (for metadata and summaries)."""
        reference = ProtocolConfig(name=self.name)
        return {
            f.name: getattr(self, f.name)
            for f in fields(self)
            if f.name != "name" and getattr(self, f.name) != getattr(reference, f.name)
        }


_NUMBER, _NAMES = (int, float), (list, tuple)
_KINDS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "degree": _NUMBER,
    "seed": (int,),
    "alpha": _NUMBER,
    "entropy_model": (str,),
    "stop_stable_agents": (bool,),
    "unanimity_stop": (bool,),
    "interventions": _NAMES,
    "qp_fraction": _NUMBER,
    "dp_k": (int,),
    "mr_max_tokens": (int,),
    "embedding_model": (str,),
    "inject": _NAMES,
    "inject_file": (str,),
}
_KIND_NAMES = {(str,): "a string", _NUMBER: "a number", (int,): "an integer", (bool,): "true or false"}
_KIND_NAMES[_NAMES] = "a list of names"


def build_protocol(config: ProtocolConfig, task: Task, backend: Backend) -> Protocol:
    """The protocol ``config`` names, over the team's ``backend`` (which also serves misconception
    refutation and, without ``entropy_model``, DIGRA's scoring). Close it when done: an
    ``entropy_model`` is loaded for it."""
    stages: list[Stage] = []
    if config.name == "sparse":
        stages.append(SparseTopology(config.degree))
    elif config.name == "random":
        stages.append(RandomTopology(config.seed))
    elif config.name in _DIG:
        stages.append(_digra(config, task, backend))
        stages += [StableAgentStop()] if config.stop_stable_agents else []
        stages += [UnanimityStop()] if config.unanimity_stop else []
    elif config.name == "interventions":
        refuter = None
        if "mr" in config.interventions:
            sampling = SamplingParams(temperature=0.0, max_tokens=config.mr_max_tokens, logprobs=False)
            refuter = Refuter(backend, sampling)
        stages.append(
            Interventions(
                task,
                config.interventions,
                embedder=SentenceEmbedder(config.embedding_model),
                refuter=refuter,
                qp_fraction=config.qp_fraction,
                dp_k=config.dp_k,
            )
        )
    if config.inject is not None:
        stages.append(Injection(task, config.inject, config.inject_file))
    return Protocol(stages, config.name)


def _digra(config: ProtocolConfig, task: Task, backend: Backend) -> DIGRATopology:
    if config.entropy_model is None:
        if not backend.capabilities.returns_logits:
            raise ValueError(
                f"protocol {config.name} scores entropies by forced decoding, which the {backend.name} backend "
                f"cannot do (no logits); set the protocol option entropy_model to an hf model"
            )
        return DIGRATopology(task, backend, config.alpha, config.name)
    from ..backends import make_backend

    scorer = make_backend("hf", model=config.entropy_model)
    return DIGRATopology(
        task,
        scorer,
        config.alpha,
        config.name,
        use_adapters=False,
        owns_scorer=True,
        entropy_model=config.entropy_model,
    )
