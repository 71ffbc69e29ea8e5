"""The trainable team: one base model, one LoRA adapter per debating agent (PEFT).

Agent i is the base model with adapter ``adapter_names[i]`` switched on ("agent_i"; or one adapter
"shared" by every agent). Heterogeneous teams put agents on different base models: each distinct base
is loaded once and carries the adapters of the agents on it.

The trainer asks for per-token log-probs of completions the agents produced, from the token ids stored
in the trajectory (never re-tokenized text): ``log pi_theta(y_k | x, y_<k)`` of logits / sampling
temperature under the agent's adapter, or under the reference policy ``pi_ref`` (the base model with
adapters disabled, or a lagged snapshot of the agent's adapter refreshed by
:meth:`MultiAgentPolicy.refresh_reference`). An agent's consecutive rounds share one forward pass when the
earlier round's prompt + completion is a prefix of the later prompt (:func:`udpo.training.logprobs.plan_passes`).

PEFT facts this module relies on: only the active adapter takes part in a forward pass, so a loss
computed for agent i sends gradients to agent i's adapter alone; ``set_adapter`` switches
``requires_grad`` off for the other adapters, so it is switched back on for every adapter the
optimizer owns after each switch.

Several processes (``symmetric_passes``, set by the trainer): every process scores its own shard, and each
scoring call runs as many forward passes as the busiest process plans (the others add one-token passes
whose log-probs enter the result times zero), so DeepSpeed ZeRO-3, which gathers every layer from all
processes in each forward and backward pass, sees the same collective calls everywhere. Under ZeRO-3 the
adapters are partitioned too: they are saved inside :meth:`MultiAgentPolicy.full_adapters` and loaded
and refreshed through :func:`udpo.training.distributed.gathered`.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from udpo.env.backends.attention import use_grouped_sdpa
from udpo.env.backends.base import Backend, logprob_temperature
from udpo.env.backends.hf import HFBackend
from udpo.env.backends.machine import DtypeChoice, choose_dtype
from udpo.env.backends.team import TeamBackend
from udpo.env.debate import DebateConfig
from udpo.env.models import DEFAULT_MODEL, resolve_model
from udpo.training import distributed as dist
from udpo.training.logprobs import TOKEN_BUDGET, ForwardStats, PackedSequence, forward_logprobs, plan_passes

if TYPE_CHECKING:
    from peft import LoraConfig, PeftModel
    from transformers import PreTrainedModel

REFERENCE_SUFFIX = "__ref"  # lagged reference snapshot of adapter NAME is the adapter NAME__ref
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


@dataclass
class LoraSettings:
    """LoRA hyper-parameters shared by every agent's adapter.

    r: rank. alpha: scaling numerator (the update is scaled by alpha / r). dropout: LoRA dropout,
    active while log-probs are computed with gradients (the base model's own dropout is switched off).
    target_modules: module names that get adapters, or ``["all-linear"]`` (every linear layer but the
    output layer; the policy replaces it by the names PEFT chose). peft: a user's PEFT ``LoraConfig``
    (:meth:`from_peft`): every other setting of it (bias, use_rslora, use_dora, ...) is kept.
    """

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    peft: LoraConfig | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_peft(cls, config: LoraConfig) -> LoraSettings:
        """The settings of a PEFT ``LoraConfig`` (``target_modules`` a list, a name, ``"all-linear"`` or
        None for PEFT's default of the model type)."""
        targets = config.target_modules
        targets = (
            ["all-linear"] if targets is None else [targets] if isinstance(targets, str) else sorted(targets)
        )
        return cls(config.r, config.lora_alpha, config.lora_dropout, targets, peft=config)

    def resolved(self, target_modules: Sequence[str]) -> LoraSettings:
        """The same settings with the module names PEFT matched (after ``all-linear`` or a default)."""
        peft = None
        if self.peft is not None:
            peft = copy.deepcopy(self.peft)
            peft.target_modules = set(target_modules)
        return LoraSettings(self.r, self.alpha, self.dropout, sorted(target_modules), peft=peft)

    def peft_config(self) -> LoraConfig:
        from peft import LoraConfig

        targets = "all-linear" if list(self.target_modules) == ["all-linear"] else list(self.target_modules)
        if self.peft is not None:
            config = copy.deepcopy(self.peft)
            config.task_type, config.inference_mode = "CAUSAL_LM", False
            if config.target_modules is None or list(self.target_modules) != ["all-linear"]:
                config.target_modules = targets
            return config
        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=targets,
            task_type="CAUSAL_LM",
        )

    def to_dict(self) -> dict:
        return {
            "r": self.r,
            "alpha": self.alpha,
            "dropout": self.dropout,
            "target_modules": list(self.target_modules),
        }


class MultiAgentPolicy:
    """N agents as LoRA adapters on (one or a few) base models.

    model: alias, folder or Hub id of the base model (see :func:`udpo.env.models.resolve_model`), or a
    loaded transformers model (used as it is, cast to ``dtype``, its dropout switched off; its
    ``name_or_path`` names it and gives the tokenizer unless ``tokenizer`` is given).
    n_agents: N. lora: adapter settings. shared_adapter: one adapter ("shared") for every agent.
    agent_models: one base model name per agent for heterogeneous teams (default: ``model`` for all).
    dtype: "auto" (see :func:`~udpo.env.backends.machine.choose_dtype`), "bf16", "fp16" or "fp32", chosen for
    ``work``: "train" (the trainer's policy, whose rollouts run on these weights) or "generate" (a team that
    only debates: :class:`udpo.Team`); the choice and why in :attr:`dtype_choice`. device: default cuda if
    available, else cpu. reference: "base" (adapters disabled) or "lagged" (snapshot adapters).
    """

    def __init__(
        self,
        model: str | PreTrainedModel = DEFAULT_MODEL,
        n_agents: int = DebateConfig.n_agents,
        lora: LoraSettings | None = None,
        shared_adapter: bool = False,
        agent_models: Sequence[str] | None = None,
        dtype: str = "auto",
        device: str | None = None,
        reference: str = "base",
        tokenizer=None,
        work: str = "train",
    ):
        from peft import get_peft_model
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if n_agents < 1:
            raise ValueError(f"n_agents must be >= 1, got {n_agents}")
        if reference not in ("base", "lagged"):
            raise ValueError(f"reference must be 'base' or 'lagged', got {reference!r}")
        given = None  # a model object, used instead of loading ``model``
        if not isinstance(model, str):
            given, model = model, model_name(model)
            if agent_models is not None and set(agent_models) != {model}:
                raise ValueError("a model object cannot be combined with agent_models naming other models")
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
        choose_dtype(dtype, self.device)  # an unknown dtype (or UDPO_DTYPE) refused before any model is read
        self.adapter_names = ["shared" if shared_adapter else f"agent_{i}" for i in range(n_agents)]
        self.forward_stats = ForwardStats()  # of every log-prob pass; reset it to measure a span
        self.symmetric_passes = False  # processes agree on each scoring call's pass count (see module doc)

        self.models: dict[str, PeftModel] = {}
        self.tokenizers = {}
        paths = {base: resolve_model(base) if given is None else base for base in self.bases}
        configs = {base: _without_dropout(path) for base, path in paths.items() if given is None}
        if given is not None:
            configs[model] = _switch_off_dropout(given)
        for base, config in configs.items():  # every base before any weight is read
            _check_target_modules(config, self.lora.target_modules, base)
        #: the dtype of every base model's weights and why (for generation: probed on the first base's shape)
        self.dtype_choice: DtypeChoice = choose_dtype(dtype, self.device, work, configs[self.bases[0]])
        self.dtype = self.dtype_choice.dtype
        for base, path in paths.items():
            names = list(
                dict.fromkeys(
                    n for n, b in zip(self.adapter_names, self.agent_models, strict=True) if b == base
                )
            )
            config = configs[base]
            if given is None:
                backbone = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=self.dtype)
            else:
                backbone = given.to(self.dtype)
            backbone.to(self.device)
            use_grouped_sdpa(backbone)
            peft_model = get_peft_model(backbone, self.lora.peft_config(), adapter_name=names[0])
            if list(self.lora.target_modules) == [
                "all-linear"
            ]:  # the names PEFT chose, for every later adapter
                self.lora = self.lora.resolved(peft_model.peft_config[names[0]].target_modules)
            snapshots = [n + REFERENCE_SUFFIX for n in names] if reference == "lagged" else []
            for name in names[1:] + snapshots:
                peft_model.add_adapter(name, self.lora.peft_config())
            peft_model.eval()
            if tokenizer is None or given is None:
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
        with dist.gathered(self.lora_parameters(), modifier_rank=0):
            for i, name in enumerate(self.adapter_names):
                model = self.model_of(i)
                snapshot = dict(model.named_parameters())
                for n, p in model.named_parameters():
                    if f".{name}." in n:
                        snapshot[n.replace(f".{name}.", f".{name}{REFERENCE_SUFFIX}.")].copy_(p)

    def enable_gradient_checkpointing(self) -> None:
        """Recompute each base model's activations in the backward pass (``gradient_checkpointing``)."""
        for model in self.models.values():
            model.gradient_checkpointing_enable()
            model.enable_input_require_grads()

    def lora_parameters(self) -> list[torch.nn.Parameter]:
        """Every LoRA parameter of the team: the adapters and their lagged snapshots."""
        return [p for model in self.models.values() for n, p in model.named_parameters() if "lora_" in n]

    @contextmanager
    def full_adapters(self) -> Iterator[None]:
        """Inside the block every LoRA parameter holds its full value (ZeRO-3 partitions them); every
        process must enter it. What :meth:`save_adapters` writes is read inside it."""
        with dist.gathered(self.lora_parameters()):
            yield

    # log-probs --------------------------------------------------------------------------------------
    def token_logprobs(
        self,
        agent: int,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        reference: bool = False,
        batch_size: int = 8,
        temperature: float = 1.0,
        token_budget: int = TOKEN_BUDGET,
    ) -> list[Tensor]:
        """Per-token log-probs of each completion given its prompt, as float32 tensors in input order.

        ``log_softmax(logits / temperature)`` of the completion tokens: the distribution the tokens were
        sampled from. Temperature 0 (greedy decoding, which has no sampling distribution) scores at 1.
        Under agent ``agent``'s adapter, or its reference policy with ``reference=True`` (never
        differentiable; see :meth:`reference_logprobs`). Otherwise differentiable w.r.t.
        ``parameters_of(agent)`` when grad is enabled. How the forward passes are laid out (shared
        prefixes, ``batch_size`` and ``token_budget``) is :func:`udpo.training.logprobs.plan_passes`'; it changes no value.
        """
        if not 0 <= agent < self.n_agents:
            raise ValueError(f"agent {agent} out of range for a team of {self.n_agents}")
        if reference:
            return self.reference_logprobs(
                [agent] * len(prompt_ids), prompt_ids, completion_ids, batch_size, temperature, token_budget
            )
        model = self._set_active(agent)
        return self._score(
            model,
            agent,
            prompt_ids,
            completion_ids,
            torch.is_grad_enabled(),
            batch_size,
            temperature,
            token_budget,
        )

    @torch.no_grad()
    def reference_logprobs(
        self,
        agents: Sequence[int],
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        batch_size: int = 8,
        temperature: float = 1.0,
        token_budget: int = TOKEN_BUDGET,
    ) -> list[Tensor]:
        """Reference log-probs (as :meth:`token_logprobs` with ``reference=True``) of several agents' sequences
        at once: sequence k is agent ``agents[k]``'s. With ``reference="base"`` the reference of every agent on
        one base model is that model with adapters disabled, so their sequences share forward passes."""
        if len(agents) != len(prompt_ids):
            raise ValueError(f"{len(agents)} agents for {len(prompt_ids)} sequences")
        bad = [a for a in agents if not 0 <= a < self.n_agents]
        if bad:
            raise ValueError(f"agent {bad[0]} out of range for a team of {self.n_agents}")
        lagged = self.reference == "lagged"
        groups: dict[str, list[int]] = {}  # one group per reference model: a base, or a lagged snapshot
        for k, a in enumerate(agents):
            groups.setdefault(self.adapter_names[a] if lagged else self.agent_models[a], []).append(k)
        out: list[Tensor] = [torch.zeros(0, device=self.device)] * len(agents)
        for idx in groups.values():
            agent = agents[idx[0]]
            model = self._set_active(agent, reference=lagged)
            with nullcontext() if lagged else model.disable_adapter():
                logps = self._score(
                    model,
                    agent,
                    [prompt_ids[k] for k in idx],
                    [completion_ids[k] for k in idx],
                    False,
                    batch_size,
                    temperature,
                    token_budget,
                )
            for k, lp in zip(idx, logps, strict=True):
                out[k] = lp
        return out

    def _score(
        self,
        model: PeftModel,
        agent: int,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        grad: bool,
        batch_size: int,
        temperature: float,
        token_budget: int,
    ) -> list[Tensor]:
        """Log-probs of the completions under ``model`` as it is set up (adapter active or disabled)."""
        if len(prompt_ids) != len(completion_ids):
            raise ValueError(f"{len(prompt_ids)} prompts for {len(completion_ids)} completions")
        if temperature < 0 or not math.isfinite(temperature):
            raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
        if batch_size < 1 or token_budget < 1:
            raise ValueError(f"batch_size and token_budget must be >= 1, got {batch_size} and {token_budget}")
        sequences, passes = plan_passes(prompt_ids, completion_ids, batch_size, token_budget)
        pad = self.tokenizer_of(agent).pad_token_id
        padding = dist.max_over_processes(len(passes)) - len(passes) if self.symmetric_passes else 0
        out = [torch.zeros(0, device=self.device)] * len(prompt_ids)
        model.train(grad)  # LoRA dropout and gradient checkpointing act in training mode only
        try:
            with torch.set_grad_enabled(grad):
                for rows in passes:
                    chunk = [sequences[j] for j in rows]
                    logps = forward_logprobs(model, chunk, pad, self.device, logprob_temperature(temperature))
                    for (k, _, _), lp in zip([s for seq in chunk for s in seq.spans], logps, strict=True):
                        out[k] = lp
                    width = len(chunk[-1].ids)
                    self.forward_stats.add(
                        len(chunk) * width,
                        sum(len(seq.ids) for seq in chunk),
                        rows=len(chunk),
                        completions=sum(len(seq.spans) for seq in chunk),
                    )
                # empty work: a one-token pass that adds zero to the result but takes part in backward
                empty = PackedSequence([pad, pad], [(0, 1, 1)])
                for _ in range(padding):
                    (lp,) = forward_logprobs(model, [empty], pad, self.device)
                    self.forward_stats.empty_passes += 1
                    if out:
                        out[0] = out[0] + 0.0 * lp.sum()
        finally:
            model.eval()
        return out

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
            if any(v.numel() == 0 for v in state.values()):
                raise RuntimeError(
                    f"adapter {source!r} is partitioned (DeepSpeed ZeRO-3): save it inside policy.full_adapters()"
                )
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
            state = load_file(str(folder / ADAPTER_WEIGHTS))
            with dist.gathered(self.lora_parameters(), modifier_rank=0):
                result = set_peft_model_state_dict(model, state, adapter_name=target)
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
        cls,
        directory: str | Path,
        dtype: str = "auto",
        device: str | None = None,
        reference: str = "base",
        work: str = "train",
    ):
        """A policy rebuilt from a team folder (``team.json`` + adapters) written by
        :func:`udpo.training.team.save_team`; ``work`` as :class:`MultiAgentPolicy` takes it."""
        from udpo.training.team import TeamManifest

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
            work=work,
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
        backends: dict[str, Backend] = {
            base: HFBackend(
                model_obj=self.models[base], tokenizer=self.tokenizers[base], device=self.device, **kwargs
            )
            for base in self.bases
        }
        return backends[self.bases[0]] if len(backends) == 1 else TeamBackend(backends)


def model_name(model: PreTrainedModel) -> str:
    """The name a model object goes by in configs and run folders: its ``name_or_path``."""
    name = getattr(model, "name_or_path", "") or getattr(getattr(model, "config", None), "_name_or_path", "")
    if not hasattr(model, "config") or not callable(getattr(model, "forward", None)):
        raise TypeError(f"model must be a name or a transformers causal LM, got {type(model).__name__}")
    if not name:
        raise ValueError(
            "the model object has no name_or_path: save it with save_pretrained(folder) and pass the folder, "
            "or load it with from_pretrained"
        )
    return str(name)


def _switch_off_dropout(model: PreTrainedModel):
    """Dropout off in a loaded model (as :func:`_without_dropout` does before loading): its config's rates,
    the ``nn.Dropout`` modules and the rates modules copied from the config (attention dropout)."""
    config = model.config
    for key, value in vars(config).items():
        if ("dropout" in key or "pdrop" in key) and isinstance(value, float):
            setattr(config, key, 0.0)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for key, value in list(vars(module).items()):
            if "dropout" in key and isinstance(value, float):
                setattr(module, key, 0.0)
    return config


def _without_dropout(path: str):
    """The model's config with every dropout rate set to 0: the base model's own dropout would make the
    log-probs of a training forward pass differ from the sampling policy's (only LoRA dropout stays)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    for key, value in vars(config).items():
        if ("dropout" in key or "pdrop" in key) and isinstance(value, float):
            setattr(config, key, 0.0)
    return config


@contextmanager
def outside_zero3_init() -> Iterator[None]:
    """Build models as if no DeepSpeed config were registered. transformers wraps ``from_config`` and
    ``from_pretrained`` in ``deepspeed.zero.Init`` whenever accelerate has registered a ZeRO-3 config
    (whatever ``zero3_init_flag`` says), and a meta-device skeleton cannot be partitioned."""
    try:
        from transformers.integrations import deepspeed as hf_deepspeed
    except ImportError:
        yield
        return
    registered = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = registered


def _check_target_modules(config, targets: Sequence[str], model: str) -> None:
    """Raise ValueError naming ``lora_target_modules`` when an entry names no module of the model, matched
    as PEFT does (the module's name or its last dotted parts). The modules come from a skeleton built
    on the meta device from the config: no weights are read."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with outside_zero3_init(), init_empty_weights():
        skeleton = AutoModelForCausalLM.from_config(config)
    names = [n for n, _ in skeleton.named_modules()]
    missing = [t for t in targets if t != "all-linear"]
    missing = [t for t in missing if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        from transformers.pytorch_utils import Conv1D  # GPT-2's linear layers

        linear = sorted(
            {
                n.rsplit(".", 1)[-1]
                for n, m in skeleton.named_modules()
                if isinstance(m, torch.nn.Linear | Conv1D)
            }
        )
        raise ValueError(
            f"lora_target_modules: {', '.join(missing)} name(s) no module of {model}; its linear layers are "
            f"{', '.join(linear)}"
        )
