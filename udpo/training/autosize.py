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
``KEPT_KV_CALLS x kv_cache_gib`` per base model, :func:`udpo.env.backends.machine.kept_kv_bytes`), allocated
at the first rollout. They are set aside from the free memory before the update is sized
(``UpdatePlan.kept_bytes``).

The estimate counts what one micro-batch's backward finds alive, as measured tensor by tensor
(``benchmarks/update_memory.py``; docs/training.md, "Auto sizes"): per position and layer what a
Llama-type layer with LoRA adapters keeps for backward (:meth:`ModelShape.layer_bytes`), per scored token
the fp32 copy of its logits that the log-softmax keeps, and the larger of two moments' temporaries: the
log-softmax's backward over the busiest log-prob pass, or a layer's backward over the largest. It sizes for the worst debate
(:meth:`Workload.bound`): every response ``max_tokens`` long, each round's prompt as long as the run's
longest questions make it through the team's chat templates (measured before the model loads), and every
round in a row of its own (an agent's rounds share a row only where the later prompt starts with the
earlier round's tokens, which a re-tokenized history can break). Not counted: the allocator's slack, the optimizer's few LoRA
tensors, and the logits of columns a pass scores for some rows only (see :func:`micro_batch_bytes`).
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
#: bytes per vocabulary entry that each scored token keeps until its pass's backward: the fp32 logits
#: the log-softmax reads (``forward_logprobs``: ``logits.float()``, kept by ``logsumexp``)
LOGIT_KEPT_BYTES = 4
#: bytes per vocabulary entry and scored token of one pass while its log-softmax runs backward: three
#: fp32 temporaries of the pass's size (``logsumexp``'s backward: ``grad * exp(input - result)``)
LOGIT_BACKWARD_BYTES = 12
#: MLP-wide gradients alive at once per position in a layer's backward
LAYER_BACKWARD_WIDTHS = 3
#: the LoRA adapters' input, per adapted linear layer of a Llama-type layer: which activation it reads
#: (modules reading the same one share it in fp32) and how wide it is; other names count as a hidden-wide
#: input of their own
LORA_INPUTS = {
    "q_proj": ("attention_input", "hidden"),
    "k_proj": ("attention_input", "hidden"),
    "v_proj": ("attention_input", "hidden"),
    "o_proj": ("attention_output", "attention"),
    "gate_proj": ("mlp_input", "hidden"),
    "up_proj": ("mlp_input", "hidden"),
    "down_proj": ("mlp_product", "intermediate"),
}
#: the policy's default adapted modules (:class:`udpo.training.policy.LoraSettings`)
DEFAULT_ADAPTED = ("q_proj", "k_proj", "v_proj", "o_proj")
#: tokens of a debate's first prompt besides the responses (system prompt, the question, chat markers) and
#: of each later round's request besides the responses it shows (the question again, the request, chat
#: markers); a CPU replay of the GPU check's debates (its small tokenizer, random weights) took about 165
#: and 273, SmolLM2's tokenizer about 60 and 100
PROMPT_TOKENS, REQUEST_TOKENS = 256, 288


@dataclass(frozen=True)
class ModelShape:
    """What the memory estimate reads of a model: ``intermediate`` defaults to 4 x ``hidden``,
    ``attention`` (query heads x head size) and ``kv`` (key/value heads x head size) to ``hidden``;
    ``adapted``: the linear layers that carry LoRA adapters."""

    hidden: int
    layers: int
    vocab: int
    dtype_bytes: int
    intermediate: int | None = None
    attention: int | None = None
    kv: int | None = None
    adapted: tuple[str, ...] = DEFAULT_ADAPTED

    @classmethod
    def of(cls, model: Any) -> ModelShape:
        """The shape of a transformers model (its text config, for multimodal ones), and the modules its
        PEFT adapters adapt (the policy's defaults for a model without any)."""
        config = model.config
        config = getattr(config, "text_config", None) or config
        param = next(model.parameters())
        heads = getattr(config, "num_attention_heads", None)
        head_dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else None)
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        peft = getattr(model, "peft_config", None)
        targets = next(iter(peft.values())).target_modules if peft else None
        return cls(
            hidden=config.hidden_size,
            layers=config.num_hidden_layers,
            vocab=config.vocab_size,
            dtype_bytes=param.element_size(),
            intermediate=getattr(config, "intermediate_size", None),
            attention=heads * head_dim if heads and head_dim else None,
            kv=kv_heads * head_dim if kv_heads and head_dim else None,
            adapted=tuple(sorted(targets)) if targets and not isinstance(targets, str) else DEFAULT_ADAPTED,
        )

    def token_bytes(self, checkpointing: bool) -> int:
        """Bytes one position keeps for backward through all layers (everything, or with gradient
        checkpointing each layer's input alone) and the final norm's fp32 input."""
        per_layer = self.hidden * self.dtype_bytes if checkpointing else self.layer_bytes()
        return self.layers * per_layer + 4 * self.hidden

    def layer_bytes(self) -> int:
        """Bytes one position keeps for backward in one Llama-type layer (what a checkpointed layer
        recomputes): both RMSNorms' inputs in fp32 (their own copies in bf16/fp16); the queries and keys
        after RoPE, the values and the attention's output; the MLP's gate, its activation and up
        projections (the frozen linear layers keep no input); and the adapters' inputs
        (:meth:`lora_bytes`)."""
        h, b = self.hidden, self.dtype_bytes
        widths = self._widths()
        attention = b * (2 * widths["attention"] + 2 * (self.kv or h))
        return 2 * 4 * h + attention + 3 * b * widths["intermediate"] + self.lora_bytes()

    def lora_bytes(self) -> int:
        """Bytes one position keeps per layer for the LoRA A matrices' gradients: their inputs. In fp32
        the adapters read the layer's own activations (modules reading the same one share it, and the
        attention's output is kept anyway); in bf16/fp16 PEFT casts each input to the adapters' fp32
        and autocast casts it back, so every adapted module keeps a copy of its own."""
        widths = self._widths()
        reads = [LORA_INPUTS.get(name, (name, "hidden")) for name in self.adapted]
        if self.dtype_bytes < 4:
            return sum(self.dtype_bytes * widths[width] for _, width in reads)
        shared = {source: width for source, width in reads if source != "attention_output"}
        return sum(4 * widths[width] for width in shared.values())

    def _widths(self) -> dict[str, int]:
        return {
            "hidden": self.hidden,
            "attention": self.attention or self.hidden,
            "intermediate": self.intermediate or 4 * self.hidden,
        }

    def backward_bytes(self) -> int:
        """Bytes one position's gradients take at once at the peak of a layer's backward: three of the
        MLP's width (measured: the gradients through its product, activation and projections)."""
        return LAYER_BACKWARD_WIDTHS * self.dtype_bytes * self._widths()["intermediate"]

    def logit_bytes(self) -> int:
        """Bytes one scored token keeps until its pass's backward: the fp32 logits its log-softmax reads."""
        return self.vocab * LOGIT_KEPT_BYTES


@dataclass(frozen=True)
class Workload:
    """One process's update, the way the estimate sees it: ``debates`` (the busiest process's share,
    replayed debates included), ``splits`` (the most micro-batches allowed: the least busy process's fresh
    debates), per debate and agent the ``tokens`` of its rows, the ``completions`` it scores and the
    ``width`` of its longest row (0: ``tokens``), and ``pass_rows``, the most rows a log-prob pass takes
    (``logprob_batch_size``)."""

    debates: int
    splits: int
    tokens: int
    completions: int
    width: int = 0
    pass_rows: int = 8

    @classmethod
    def bound(cls, config: Any, world: int, widths: Sequence[int] | None = None) -> Workload:
        """The most a debate of ``config`` can hold: every round's response ``max_tokens`` long, every
        agent reading all peers, each round in a row of its own, and the replayed debates added to the
        fresh ones. ``widths``: each round's row measured on the run's longest questions with the team's
        chat templates (:func:`udpo.training.data.check_context`); without them, :func:`row_widths`' fixed
        prompt sizes."""
        from udpo.training.replay import replayed_count

        fresh = config.questions_per_iteration * config.debates_per_question
        replayed = replayed_count(fresh, config.replay_fraction) if config.replay else 0
        rounds = config.rounds + 1
        if widths is not None and len(widths) != rounds:
            raise ValueError(f"{len(widths)} row widths for {rounds} rounds")
        widths = (
            list(widths) if widths is not None else row_widths(rounds, config.n_agents, config.max_tokens)
        )
        return cls(
            debates=math.ceil((fresh + replayed) / world),
            splits=max(1, fresh // world),
            tokens=sum(widths),
            completions=rounds * config.max_tokens,
            width=max(widths),
            pass_rows=config.logprob_batch_size,
        )


def row_widths(rounds: int, agents: int, max_tokens: int) -> list[int]:
    """Positions of an agent's rows, one per round, at their longest: round r's prompt (the first prompt,
    r later requests, the agent's r earlier responses and r x (agents - 1) of its peers') and its
    response. A row per round is the worst case: rounds share a row only where the later prompt starts
    with the earlier round's tokens (:func:`udpo.training.logprobs.plan_passes`)."""
    return [PROMPT_TOKENS + r * REQUEST_TOKENS + (r * agents + 1) * max_tokens for r in range(rounds)]


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
    """Bytes one agent's micro-batch holds at its backward's peak: its debates' positions through the
    layers and the fp32 logits of their scored tokens, kept until backward, and the larger of two
    moments' temporaries: the log-softmax backward of the busiest pass (``pass_rows`` rows of a debate's
    scored tokens each), or a layer's backward over the largest pass (``pass_rows`` rows of the longest
    row, within ``budget`` unless one row is longer), with checkpointing that layer recomputed too. Not
    counted: the lm head's logits of columns that some rows of a pass score and others do not (a pass
    computes the union of its rows' columns), which exceed the temporaries only where the union is
    several times one row's columns."""
    debates = math.ceil(work.debates / micro_batches)
    kept = debates * (work.tokens * shape.token_bytes(checkpointing) + work.completions * shape.logit_bytes())
    rows = min(work.pass_rows, debates)
    softmax = rows * work.completions * shape.vocab * LOGIT_BACKWARD_BYTES
    width = work.width or work.tokens
    positions = min(rows * width, max(budget, width))
    layer = positions * (shape.backward_bytes() + (shape.layer_bytes() if checkpointing else 0))
    return kept + max(softmax, layer)


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
    on the live model keeps its stacked paths' KV buffers (:func:`udpo.env.backends.machine.kept_kv_bytes`);
    another engine (vLLM: its own memory share) none here."""
    if not config.backend_capabilities.serves_live_model:
        return 0
    from udpo.env.backends.machine import kept_kv_bytes

    return kept_kv_bytes(config.hf_decode, device)


def resolve(
    config: Any,
    models: Sequence[Any],
    world: int,
    device: str,
    share: float | None = None,
    widths: Sequence[int] | None = None,
) -> tuple[Any, UpdatePlan]:
    """``config`` with its auto update sizes filled in (a new config; explicit values untouched), and the
    plan. On a CUDA device they are sized from its free memory now (the least over the processes, which
    must split their work alike), for the largest of the team's base ``models``; with a ``share`` of the
    card (several runs on one GPU) from what is left of that share (:func:`udpo.gpu_share.usable_bytes`);
    elsewhere auto is ``CPU_DEFAULTS``. The decode buffers the rollouts keep (:func:`decode_kept_bytes`,
    per base model) are set aside first. ``widths``: each round's row as measured for this run
    (:meth:`Workload.bound`). The resolved config is checked (:func:`check_sizes`). Every process calls it."""
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
            plan_update(shape, Workload.bound(config, world, widths), free, explicit, kept), share=share
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
