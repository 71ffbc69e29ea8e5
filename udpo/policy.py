"""The trainable team: one base model, one LoRA adapter per debating agent (PEFT).

Agent i is the base model with adapter ``adapter_names[i]`` switched on ("agent_i"; or one adapter
"shared" by every agent). Heterogeneous teams put agents on different base models: each distinct base
is loaded once and carries the adapters of the agents on it.

The trainer asks for per-token log-probs of completions the agents produced, from the token ids stored
in the trajectory (never re-tokenized text): ``log pi_theta(y_k | x, y_<k)`` at temperature 1 under the
agent's adapter, or under the reference policy ``pi_ref`` (the base model with adapters disabled, or a
lagged snapshot of the agent's adapter refreshed by :meth:`MultiAgentPolicy.refresh_reference`).

PEFT facts this module relies on: only the active adapter takes part in a forward pass, so a loss
computed for agent i sends gradients to agent i's adapter alone; ``set_adapter`` switches
``requires_grad`` off for the other adapters, so it is switched back on for every adapter the
optimizer owns after each switch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from udpo.env.backends.base import Backend, BackendError, ChatRequest, Completion, ScoreRequest
from udpo.env.backends.hf import HFBackend, pick_dtype
from udpo.env.models import resolve_model

if TYPE_CHECKING:
    from peft import LoraConfig, PeftModel

REFERENCE_SUFFIX = "__ref"  # lagged reference snapshot of adapter NAME is the adapter NAME__ref
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


@dataclass
class LoraSettings:
    """LoRA hyper-parameters shared by every agent's adapter.

    r: rank. alpha: scaling numerator (the update is scaled by alpha / r). dropout: LoRA dropout,
    active while log-probs are computed with gradients (the base model's own dropout is switched off). target_modules: module names that get adapters.
    """

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])

    def peft_config(self) -> LoraConfig:
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
            task_type="CAUSAL_LM",
        )

    def to_dict(self) -> dict:
        return asdict(self)


class MultiAgentPolicy:
    """N agents as LoRA adapters on (one or a few) base models.

    model: alias, folder or Hub id of the base model (see :func:`udpo.env.models.resolve_model`).
    n_agents: N. lora: adapter settings. shared_adapter: one adapter ("shared") for every agent.
    agent_models: one base model name per agent for heterogeneous teams (default: ``model`` for all).
    dtype: "auto" (bf16 on GPU, fp32 on CPU), "bf16", "fp16" or "fp32". device: default cuda if
    available, else cpu. reference: "base" (adapters disabled) or "lagged" (snapshot adapters).
    """

    def __init__(
        self,
        model: str = "smollm2-135m-instruct",
        n_agents: int = 3,
        lora: LoraSettings | None = None,
        shared_adapter: bool = False,
        agent_models: Sequence[str] | None = None,
        dtype: str = "auto",
        device: str | None = None,
        reference: str = "base",
    ):
        from peft import get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if n_agents < 1:
            raise ValueError(f"n_agents must be >= 1, got {n_agents}")
        if reference not in ("base", "lagged"):
            raise ValueError(f"reference must be 'base' or 'lagged', got {reference!r}")
        self.agent_models = list(agent_models) if agent_models is not None else [model] * n_agents
        if len(self.agent_models) != n_agents:
            raise ValueError(f"agent_models names {len(self.agent_models)} models for n_agents={n_agents}")
        self.bases = list(dict.fromkeys(self.agent_models))  # distinct, in agent order
        if shared_adapter and len(self.bases) > 1:
            raise ValueError("shared_adapter needs every agent on the same base model (agent_models differ)")
        self.base_model = model if model in self.bases else self.bases[0]
        self.n_agents = n_agents
        self.lora = lora or LoraSettings()
        self.shared_adapter = shared_adapter
        self.reference = reference
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.dtype = pick_dtype(dtype, self.device)
        self.adapter_names = ["shared" if shared_adapter else f"agent_{i}" for i in range(n_agents)]

        self.models: dict[str, PeftModel] = {}
        self.tokenizers = {}
        for base in self.bases:
            path = resolve_model(base)
            names = list(
                dict.fromkeys(
                    n for n, b in zip(self.adapter_names, self.agent_models, strict=True) if b == base
                )
            )
            backbone = AutoModelForCausalLM.from_pretrained(
                path, config=_without_dropout(path), dtype=self.dtype
            )
            backbone.to(self.device)
            peft_model = get_peft_model(backbone, self.lora.peft_config(), adapter_name=names[0])
            snapshots = [n + REFERENCE_SUFFIX for n in names] if reference == "lagged" else []
            for name in names[1:] + snapshots:
                peft_model.add_adapter(name, self.lora.peft_config())
            peft_model.eval()
            tokenizer = AutoTokenizer.from_pretrained(path)
            if tokenizer.pad_token_id is None:
                tokenizer.pad_token = tokenizer.eos_token
            self.models[base], self.tokenizers[base] = peft_model, tokenizer
        self._params = {
            name: self._adapter_params(self.models[self.agent_models[i]], name)
            for i, name in enumerate(self.adapter_names)
        }
        if reference == "lagged":
            self.refresh_reference()
        self._set_active(0)

    # adapters and their parameters ------------------------------------------------------------------
    @property
    def tokenizer(self):
        """The tokenizer of the (first) base model; :meth:`tokenizer_of` for heterogeneous teams."""
        return self.tokenizers[self.base_model]

    def tokenizer_of(self, agent: int):
        return self.tokenizers[self.agent_models[agent]]

    def model_of(self, agent: int) -> PeftModel:
        return self.models[self.agent_models[agent]]

    def parameters_of(self, agent: int) -> list[torch.nn.Parameter]:
        """Agent ``agent``'s trainable adapter parameters (the same list for agents sharing one adapter)."""
        return self._params[self.adapter_names[agent]]

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """Every trainable parameter once (what the optimizer should own)."""
        return [p for name in dict.fromkeys(self.adapter_names) for p in self._params[name]]

    def _distinct_adapters(self) -> dict[str, int]:
        """Adapter name -> the first agent that uses it."""
        return {name: self.adapter_names.index(name) for name in dict.fromkeys(self.adapter_names)}

    @staticmethod
    def _adapter_params(model: PeftModel, name: str) -> list[torch.nn.Parameter]:
        params = [p for n, p in model.named_parameters() if f".{name}." in n]
        if not params:
            raise RuntimeError(f"adapter {name!r} has no parameters; check lora.target_modules")
        return params

    def _set_active(self, agent: int, reference: bool = False) -> PeftModel:
        """Switch the agent's model to its adapter (or its lagged snapshot) and restore requires_grad."""
        model = self.model_of(agent)
        name = self.adapter_names[agent] + (REFERENCE_SUFFIX if reference else "")
        model.set_adapter(name)
        for n, p in model.named_parameters():  # set_adapter froze the other adapters: undo it
            if "lora_" in n:
                p.requires_grad_(REFERENCE_SUFFIX not in n)
        return model

    @torch.no_grad()
    def refresh_reference(self) -> None:
        """Copy each adapter into its lagged reference snapshot (``reference="lagged"`` only)."""
        if self.reference != "lagged":
            raise ValueError("refresh_reference() needs reference='lagged' (the reference is the base model)")
        for i, name in enumerate(self.adapter_names):
            model = self.model_of(i)
            snapshot = dict(model.named_parameters())
            for n, p in model.named_parameters():
                if f".{name}." in n:
                    snapshot[n.replace(f".{name}.", f".{name}{REFERENCE_SUFFIX}.")].copy_(p)

    # log-probs --------------------------------------------------------------------------------------
    def token_logprobs(
        self,
        agent: int,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        reference: bool = False,
        batch_size: int = 8,
    ) -> list[Tensor]:
        """Per-token log-probs (temperature 1) of each completion given its prompt, as float32 tensors.

        Under agent ``agent``'s adapter, or its reference policy with ``reference=True`` (never
        differentiable). Otherwise differentiable w.r.t. ``parameters_of(agent)`` when grad is enabled.
        Sequences are sorted by length and run ``batch_size`` at a time; results come back in input order.
        """
        if len(prompt_ids) != len(completion_ids):
            raise ValueError(f"{len(prompt_ids)} prompts for {len(completion_ids)} completions")
        if not 0 <= agent < self.n_agents:
            raise ValueError(f"agent {agent} out of range for a team of {self.n_agents}")
        lagged = reference and self.reference == "lagged"
        model = self._set_active(agent, reference=lagged)
        grad = torch.is_grad_enabled() and not reference
        model.train(grad)  # LoRA dropout and gradient checkpointing act in training mode only
        out: list[Tensor | None] = [None] * len(prompt_ids)
        order = sorted(range(len(prompt_ids)), key=lambda k: len(prompt_ids[k]) + len(completion_ids[k]))
        pad = self.tokenizer_of(agent).pad_token_id
        with torch.set_grad_enabled(grad):
            for s in range(0, len(order), batch_size):
                chunk = [k for k in order[s : s + batch_size] if len(completion_ids[k]) > 0]
                if chunk:
                    rows = [(list(prompt_ids[k]), list(completion_ids[k])) for k in chunk]
                    if reference and not lagged:
                        with model.disable_adapter():
                            logps = _forward_logprobs(model, rows, pad, self.device)
                    else:
                        logps = _forward_logprobs(model, rows, pad, self.device)
                    for k, lp in zip(chunk, logps, strict=True):
                        out[k] = lp
        model.eval()
        empty = torch.zeros(0, device=self.device)
        return [lp if lp is not None else empty for lp in out]

    # saving and loading adapters --------------------------------------------------------------------
    def save_adapters(self, directory: str | Path, reference: bool = False) -> dict[str, str]:
        """Write each adapter (or, with ``reference=True``, its lagged snapshot) as a PEFT folder
        ``directory/<adapter name>``; returns name -> folder."""
        from peft.utils import get_peft_model_state_dict
        from safetensors.torch import save_file

        if reference and self.reference != "lagged":
            raise ValueError("save_adapters(reference=True) needs reference='lagged'")
        out = {}
        for name, i in self._distinct_adapters().items():
            model, source = self.model_of(i), name + (REFERENCE_SUFFIX if reference else "")
            folder = Path(directory) / name
            folder.mkdir(parents=True, exist_ok=True)
            state = get_peft_model_state_dict(model, adapter_name=source)
            save_file(
                {k: v.detach().cpu().contiguous() for k, v in state.items()}, str(folder / ADAPTER_WEIGHTS)
            )
            config = model.peft_config[source]
            inference_mode, config.inference_mode = config.inference_mode, True
            try:
                config.save_pretrained(str(folder))
            finally:
                config.inference_mode = inference_mode
            out[name] = str(folder)
        return out

    @torch.no_grad()
    def load_adapters(
        self, directory: str | Path | Mapping[str, str | Path], reference: bool = False
    ) -> None:
        """Load adapter weights in place (parameter objects, and so optimizer state, stay valid).

        ``directory``: a folder written by :meth:`save_adapters` (``directory/<adapter name>``), or a
        mapping adapter name -> PEFT folder. Errors name the folder and what does not match.
        """
        from peft.utils import set_peft_model_state_dict
        from safetensors.torch import load_file

        if reference and self.reference != "lagged":
            raise ValueError("load_adapters(reference=True) needs reference='lagged'")
        for name, i in self._distinct_adapters().items():
            if isinstance(directory, Mapping):
                if name not in directory:
                    raise ValueError(f"no folder given for adapter {name!r} (given: {sorted(directory)})")
                folder = Path(directory[name])
            else:
                folder = Path(directory) / name
            if not (folder / ADAPTER_WEIGHTS).exists():
                raise FileNotFoundError(f"no {ADAPTER_WEIGHTS} for adapter {name!r} in {folder}")
            self._check_adapter_config(folder / ADAPTER_CONFIG)
            target = name + (REFERENCE_SUFFIX if reference else "")
            model = self.model_of(i)
            result = set_peft_model_state_dict(
                model, load_file(str(folder / ADAPTER_WEIGHTS)), adapter_name=target
            )
            missing = [k for k in result.missing_keys if f".{target}." in k]
            if result.unexpected_keys or missing:
                raise ValueError(
                    f"{folder}: adapter weights do not fit the model "
                    f"(unexpected: {result.unexpected_keys[:3]}, missing: {missing[:3]})"
                )

    def _check_adapter_config(self, path: Path) -> None:
        if not path.exists():
            raise FileNotFoundError(f"missing {path}")
        saved = json.loads(path.read_text())
        want = {
            "r": self.lora.r,
            "lora_alpha": self.lora.alpha,
            "target_modules": sorted(self.lora.target_modules),
        }
        got = {k: saved.get(k) for k in want}
        got["target_modules"] = sorted(got["target_modules"] or [])
        for key in want:
            if got[key] != want[key]:
                raise ValueError(
                    f"{path}: {key} is {got[key]!r} but the policy's LoRA settings say {want[key]!r}"
                )

    @classmethod
    def from_team(
        cls, directory: str | Path, dtype: str = "auto", device: str | None = None, reference: str = "base"
    ):
        """A policy rebuilt from a team folder (``team.json`` + adapters) written by :func:`udpo.team.save_team`."""
        from udpo.team import TeamManifest

        team = TeamManifest.load(directory)
        policy = cls(
            model=team.base_model,
            n_agents=team.n_agents,
            lora=LoraSettings(**team.lora) if team.lora else None,
            shared_adapter=team.shared_adapter,
            agent_models=[a.base_model or team.base_model for a in team.agents],
            dtype=dtype,
            device=device,
            reference=reference,
        )
        policy.load_adapters(team.adapter_paths(directory))
        return policy

    # rollouts ---------------------------------------------------------------------------------------
    def rollout_backend(self, **kwargs) -> Backend:
        """A generation backend over the live adapters (no sync needed after an update).

        One base model: an :class:`~udpo.env.backends.hf.HFBackend` on the PeftModel. Several: a
        :class:`TeamBackend` routing each request by its ``model`` field (the agent's base model name).
        ``kwargs`` go to each HFBackend (e.g. ``max_batch``).
        """
        backends = {
            base: HFBackend(
                model_obj=self.models[base], tokenizer=self.tokenizers[base], device=self.device, **kwargs
            )
            for base in self.bases
        }
        return backends[self.bases[0]] if len(backends) == 1 else TeamBackend(backends)


class TeamBackend(Backend):
    """Routes each request to the backend of its ``model`` (a heterogeneous team's base model name);
    requests with ``model=None`` go to the first backend."""

    name = "team"

    def __init__(self, backends: dict[str, Backend]):
        if not backends:
            raise ValueError("TeamBackend needs at least one backend")
        self.backends = backends

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        return self._routed(requests, lambda backend, rows: backend.generate(rows))

    def token_entropies(self, requests: list[ScoreRequest]) -> list[list[float]]:
        return self._routed(requests, lambda backend, rows: backend.token_entropies(rows))

    def _routed(self, requests: list, call: Callable[[Backend, list], list]) -> list:
        """``call(backend, its requests)`` once per base model; results back in request order."""
        first = next(iter(self.backends))
        groups: dict[str, list[int]] = {}
        for k, r in enumerate(requests):
            model = r.model or first
            if model not in self.backends:
                raise BackendError(f"no backend serves model {model!r} (serving: {sorted(self.backends)})")
            groups.setdefault(model, []).append(k)
        out: list = [None] * len(requests)
        for model, idx in groups.items():
            for k, c in zip(idx, call(self.backends[model], [requests[k] for k in idx]), strict=True):
                out[k] = c
        return out

    @property
    def adapters(self) -> list[str]:
        return sorted({a for b in self.backends.values() for a in b.adapters})

    def load_adapter(self, name: str, path: str) -> None:
        """Load into every backend whose model already serves ``name`` (else into all of them)."""
        owners = [b for b in self.backends.values() if name in b.adapters] or list(self.backends.values())
        for b in owners:
            b.load_adapter(name, path)

    def close(self) -> None:
        for b in self.backends.values():
            b.close()


def _without_dropout(path: str):
    """The model's config with every dropout rate set to 0: the base model's own dropout would make the
    log-probs of a training forward pass differ from the sampling policy's (only LoRA dropout stays)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    for key, value in vars(config).items():
        if ("dropout" in key or "pdrop" in key) and isinstance(value, float):
            setattr(config, key, 0.0)
    return config


def _forward_logprobs(model, rows: list[tuple[list[int], list[int]]], pad: int, device: str) -> list[Tensor]:
    """log p(completion token | prompt, earlier completion tokens) for each (prompt, completion) row.

    Rows are left-padded so every completion ends at the last position; only the last
    ``max completion length + 1`` positions get logits (``logits_to_keep``), which bounds the
    B x L x V logits tensor by the completions rather than the (long, multi-round) prompts.
    Position ids count real tokens only, as in generation.
    """
    width = max(len(p) + len(c) for p, c in rows)
    keep = max(len(c) for _, c in rows) + 1
    ids = torch.tensor([[pad] * (width - len(p) - len(c)) + p + c for p, c in rows], device=device)
    mask = torch.tensor(
        [[0] * (width - len(p) - len(c)) + [1] * (len(p) + len(c)) for p, c in rows], device=device
    )
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep, use_cache=False
    ).logits
    # logits[b, k] predicts the token at position width - keep + k + 1: completion c starts at k = keep - 1 - len(c)
    picked = torch.cat([logits[b, keep - 1 - len(c) : keep - 1] for b, (_, c) in enumerate(rows)]).float()
    targets = torch.tensor([t for _, c in rows for t in c], device=device)
    logp = picked.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(picked, dim=-1)
    return list(logp.split([len(c) for _, c in rows]))
