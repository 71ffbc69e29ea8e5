"""Sizing the update's passes to the device: the settings a recipe leaves at ``null`` (auto).

The update holds, until each backward, the activations of one agent's micro-batch: every position of its
rows through every layer, and the fp32 logits of every completion token. :func:`plan_update` picks, from
an estimate of those bytes (:class:`ModelShape`: hidden size, layers, vocabulary, bytes per weight) and
the micro-batch's token counts, the largest log-prob pass, the fewest micro-batches and gradient
checkpointing only where the activations of one debate at a time would not fit otherwise. On a CPU
(no device memory to read) auto keeps the fixed defaults: ``CPU_DEFAULTS``. A process that shares its GPU
with other runs (``UDPO_GPU_MEMORY_SHARE``, :mod:`udpo.gpu_share`) sizes from its share of the card, not
from all that is free.

Besides what the process holds when the plan is made, the update shares the device with what the
rollouts keep between their calls: the hf backend's decode buffers on its stacked paths (up to
``KEPT_KV_CALLS x kv_cache_gib`` per base model, :func:`udpo.env.backends.hf.kept_kv_bytes`), allocated
at the first rollout. They are set aside from the free memory before the update is sized
(``UpdatePlan.kept_bytes``).

The estimate is deliberately generous (every tensor a Llama-type layer keeps for backward, the fp32
copies of the norms included), so that the plan leaves room for what it does not count: the allocator's
slack and the optimizer's few LoRA tensors.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: what auto means without a GPU: the settings' fixed defaults before they were sized
CPU_DEFAULTS: dict[str, Any] = {
    "logprob_token_budget": 4096,
    "gradient_accumulation_steps": 1,
    "gradient_checkpointing": False,
}
#: share of the device's free memory (read after the model loaded) the update's activations may fill
MEMORY_SHARE = 0.7
#: bounds of an auto ``logprob_token_budget`` (a power of two; more positions per pass, fewer launches)
TOKEN_BUDGET_RANGE = (512, 65536)
#: elements one token keeps per layer for backward, per hidden unit and per MLP unit (Llama-type layer:
#: norms with their fp32 copies, q/k/v after RoPE, attention output, gate/up/activation/product)
PER_HIDDEN, PER_INTERMEDIATE = 20, 4
#: bytes each completion token's logits keep per vocabulary entry besides the model's own dtype: the fp32
#: copy log-softmax works on and its output
LOGIT_FP32_BYTES = 8
#: tokens of a debate's question and chat template besides the responses, and per message of its history
PROMPT_TOKENS, MESSAGE_TOKENS = 256, 16


@dataclass(frozen=True)
class ModelShape:
    """What the memory estimate reads of a model: ``intermediate`` defaults to 4 x ``hidden``."""

    hidden: int
    layers: int
    vocab: int
    dtype_bytes: int
    intermediate: int | None = None

    @classmethod
    def of(cls, model: Any) -> ModelShape:
        """The shape of a transformers model (its text config, for multimodal ones)."""
        config = model.config
        config = getattr(config, "text_config", None) or config
        param = next(model.parameters())
        return cls(
            hidden=config.hidden_size,
            layers=config.num_hidden_layers,
            vocab=config.vocab_size,
            dtype_bytes=param.element_size(),
            intermediate=getattr(config, "intermediate_size", None),
        )

    def token_bytes(self, checkpointing: bool) -> int:
        """Bytes one position keeps for backward through all layers: everything, or with gradient
        checkpointing each layer's input alone."""
        if checkpointing:
            return self.layers * self.hidden * self.dtype_bytes
        return self.layers * self.layer_bytes()

    def layer_bytes(self) -> int:
        """Bytes one position keeps for backward in one layer (what a checkpointed layer recomputes)."""
        intermediate = self.intermediate or 4 * self.hidden
        return (PER_HIDDEN * self.hidden + PER_INTERMEDIATE * intermediate) * self.dtype_bytes

    def logit_bytes(self) -> int:
        """Bytes one scored completion token keeps: its logits, and their fp32 copy and log-softmax."""
        return self.vocab * (self.dtype_bytes + LOGIT_FP32_BYTES)


@dataclass(frozen=True)
class Workload:
    """One process's update, the way the estimate sees it: ``debates`` (the busiest process's share,
    replayed debates included), ``splits`` (the most micro-batches allowed: the least busy process's fresh
    debates), and per debate and agent the ``tokens`` of its packed rows and the ``completions`` it scores."""

    debates: int
    splits: int
    tokens: int
    completions: int

    @classmethod
    def bound(cls, config: Any, world: int) -> Workload:
        """The most a debate of ``config`` can hold: every round's response ``max_tokens`` long, every
        agent reading all peers (its rounds packed in one row: the history only grows), and the replayed
        debates added to the fresh ones."""
        from udpo.training.replay import replayed_count

        fresh = config.questions_per_iteration * config.debates_per_question
        replayed = replayed_count(fresh, config.replay_fraction) if config.replay else 0
        rounds, agents = config.rounds + 1, config.n_agents
        responses = rounds + config.rounds * (agents - 1)  # its own, and its peers' in later prompts
        messages = rounds * 2
        tokens = PROMPT_TOKENS + messages * MESSAGE_TOKENS + responses * config.max_tokens
        return cls(
            debates=math.ceil((fresh + replayed) / world),
            splits=max(1, fresh // world),
            tokens=tokens,
            completions=rounds * config.max_tokens,
        )


@dataclass(frozen=True)
class UpdatePlan:
    """The sizes the update runs with, and the estimate behind them (``peak_bytes``: one micro-batch's
    activations; ``free_bytes``: what the device had free, within this process's ``share`` of the card
    where one is set; None on a CPU; ``kept_bytes``: of that, what the rollouts' decode buffers will
    hold through the update, set aside)."""

    logprob_token_budget: int
    gradient_accumulation_steps: int
    gradient_checkpointing: bool
    peak_bytes: int | None = None
    free_bytes: int | None = None
    share: float | None = None
    kept_bytes: int = 0

    def describe(self, auto: list[str]) -> str:
        """One line for the log: the sizes, which of them were sized here, and the estimate."""
        sizes = ", ".join(
            f"{name}={str(getattr(self, name)).lower()}{' (auto)' if name in auto else ''}"
            for name in CPU_DEFAULTS
        )
        if self.free_bytes is None or self.peak_bytes is None:  # on a CPU
            return f"update sizes: {sizes}"
        within = "" if self.share is None else f" within this process's GPU memory share {self.share:.3g}"
        kept = (
            f", {self.kept_bytes / 2**30:.1f} GiB of it kept for the decode buffers"
            if self.kept_bytes
            else ""
        )
        return (
            f"update sizes: {sizes}; estimated activations {self.peak_bytes / 2**30:.1f} GiB of "
            f"{self.free_bytes / 2**30:.1f} GiB free{within}{kept}"
        )


def micro_batch_bytes(
    shape: ModelShape, work: Workload, micro_batches: int, checkpointing: bool, budget: int
) -> int:
    """Bytes one agent's micro-batch keeps until its backward: its debates' positions through the layers
    and their completions' logits; with checkpointing also one layer recomputed over a pass."""
    debates = math.ceil(work.debates / micro_batches)
    kept = debates * (work.tokens * shape.token_bytes(checkpointing) + work.completions * shape.logit_bytes())
    return kept + (budget * shape.layer_bytes() if checkpointing else 0)


def token_budget(shape: ModelShape, usable: int) -> int:
    """The largest power of two of positions (within ``TOKEN_BUDGET_RANGE``) whose pass, every position
    a layer's activations and a scored token's logits, takes at most a quarter of ``usable`` bytes."""
    low, high = TOKEN_BUDGET_RANGE
    per_position = shape.layer_bytes() + shape.logit_bytes()
    fits = max(1, usable // 4 // per_position)
    return max(low, min(high, 2 ** int(math.log2(fits))))


def plan_update(
    shape: ModelShape,
    work: Workload,
    free_bytes: int,
    explicit: dict[str, Any] | None = None,
    kept_bytes: int = 0,
) -> UpdatePlan:
    """The update's sizes for ``free_bytes`` of device memory of which ``kept_bytes`` will be held by
    the rollouts' decode buffers; ``explicit`` settings (a recipe's values) are kept as given and the
    others chosen around them: the token budget first, then the fewest micro-batches whose activations
    fit ``MEMORY_SHARE`` of the free memory left without gradient checkpointing, else with it. Where even
    one debate per micro-batch does not fit, the smallest micro-batches with checkpointing (the estimate
    is generous; the run may still fit)."""
    explicit = {k: v for k, v in (explicit or {}).items() if v is not None}
    usable = int(max(0, free_bytes - kept_bytes) * MEMORY_SHARE)
    budget = explicit.get("logprob_token_budget") or token_budget(shape, usable)
    counts = [explicit["gradient_accumulation_steps"]] if "gradient_accumulation_steps" in explicit else None
    checkpointing = (
        [explicit["gradient_checkpointing"]] if "gradient_checkpointing" in explicit else [False, True]
    )
    candidates = [(ckpt, n) for ckpt in checkpointing for n in (counts or range(1, work.splits + 1))]
    chosen = next(
        ((ckpt, n) for ckpt, n in candidates if micro_batch_bytes(shape, work, n, ckpt, budget) <= usable),
        candidates[-1],
    )
    ckpt, n = chosen
    peak = micro_batch_bytes(shape, work, n, ckpt, budget)
    return UpdatePlan(budget, n, ckpt, peak, free_bytes, kept_bytes=kept_bytes)


def decode_kept_bytes(config: Any, device: str) -> int:
    """Bytes the rollout backend's decode buffers keep through an update, per base model: the hf backend
    on the live model keeps its stacked paths' KV buffers (:func:`udpo.env.backends.hf.kept_kv_bytes`);
    another engine (vLLM: its own memory share) none here."""
    if not config.backend_capabilities.serves_live_model:
        return 0
    from udpo.env.backends.hf import kept_kv_bytes

    return kept_kv_bytes(config.hf_decode, device)


def resolve(
    config: Any, models: Sequence[Any], world: int, device: str, share: float | None = None
) -> tuple[Any, UpdatePlan]:
    """``config`` with its auto update sizes filled in (a new config; explicit values untouched), and the
    plan. On a CUDA device they are sized from its free memory now (the least over the processes, which
    must split their work alike), for the largest of the team's base ``models``; with a ``share`` of the
    card (several runs on one GPU) from what is left of that share (:func:`udpo.gpu_share.usable_bytes`);
    elsewhere auto is ``CPU_DEFAULTS``. The decode buffers the rollouts keep (:func:`decode_kept_bytes`,
    per base model) are set aside first. The resolved config is checked (:func:`check_sizes`). Every
    process calls it."""
    explicit = {name: getattr(config, name) for name in CPU_DEFAULTS}
    if not device.startswith("cuda"):
        plan = UpdatePlan(
            **{name: CPU_DEFAULTS[name] if value is None else value for name, value in explicit.items()}
        )
    else:
        import torch

        from udpo.gpu_share import usable_bytes
        from udpo.training import distributed as dist

        free, total = torch.cuda.mem_get_info(torch.device(device))
        free = usable_bytes(free, total, torch.cuda.memory_reserved(torch.device(device)), share)
        free = -dist.max_over_processes(-free)  # the least any process has: every process sizes alike
        shape = max((ModelShape.of(m) for m in models), key=lambda m: m.token_bytes(checkpointing=False))
        kept = len(models) * decode_kept_bytes(config, device)
        plan = dataclasses.replace(
            plan_update(shape, Workload.bound(config, world), free, explicit, kept), share=share
        )
    chosen = {name: getattr(plan, name) for name in CPU_DEFAULTS}
    resolved = dataclasses.replace(config, **chosen)
    check_sizes(resolved, world)
    return resolved, plan


def check_sizes(config: Any, world: int) -> None:
    """Refuse an update whose debates cannot be shared by ``world`` processes, each splitting its share
    into ``gradient_accumulation_steps`` micro-batches (a resolved config: no size left auto)."""
    debates = config.questions_per_iteration * config.debates_per_question
    if debates < world * config.gradient_accumulation_steps:
        raise ValueError(
            f"questions_per_iteration x debates_per_question = {debates} debates cannot be shared by "
            f"{world} processes with gradient_accumulation_steps={config.gradient_accumulation_steps} "
            f"micro-batches each; raise questions_per_iteration"
        )
