"""The hf backend's sampling loop: a batch of left-padded prompts, one forward per new token.

Why not ``generate``: at the batch sizes of a debate (a dozen to a few hundred rows, tens of tokens) the
per-step work around the model (logits processors, stopping criteria, keeping every step's logits for the
log-probs) and PEFT's per-row adapter dispatch (an index, a cast and two matmuls per adapter and layer)
cost more than the model's own forward. This loop keeps one step to: the forward over the KV cache, one
fp32 log-softmax of the last logits, the draw, and a check for finished rows. The KV cache is one
buffer of prompt + ``max_new_tokens`` positions written in place (transformers' growing cache
concatenates, copying the whole cache at every step: at a few hundred rows that copy costs more than
the step). Rows that finished leave the batch (their cache rows are dropped) once a quarter of the
batch is done, so a long answer does not make every finished row pay for its steps.

Sampling matches ``generate``'s: temperature scaling, then nucleus (top-p) truncation, then one draw
from torch's generator (seed it with ``torch.manual_seed`` for reproducible draws). The log-prob of each
drawn token is ``log_softmax(logits / temperature)`` over the whole vocabulary (temperature 1 for greedy
rows), the quantity the trainer's importance ratio compares against.

Row adapters (:class:`RowAdapters`): every LoRA layer computes ``base(x) + ((x A^T) * mask) B^T`` with the
adapters' A matrices stacked (R = the sum of their ranks), B matrices (scaled) side by side, and a 0/1
mask of shape rows x R that keeps each row's own adapter: two matmuls per layer whatever the number of
adapters.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch

#: finished rows leave the batch once they are at least this share of it
COMPACT_SHARE = 0.25


@dataclass
class Sampled:
    """One row's result: token ids (the stop token included), their log-probs, "stop" or "length"."""

    tokens: list[int]
    logprobs: list[float]
    finish_reason: str


def _lora_layers(model) -> list:
    """The LoRA linear layers of a PeftModel (none for a plain model)."""
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


class RowAdapters:
    """Context manager: each row of the batch runs through its own LoRA adapter (None: the base model).

    The adapters' matmuls run in the adapters' dtype, as PEFT's do (fp32 under a bf16 base: at these
    shapes fp32 is also the faster one on CPU). Works for plain LoRA on linear (and GPT-2 Conv1D) layers; :meth:`supported` says
    whether a model's adapters are all of that kind (DoRA, embedding or other LoRA variants are not).
    """

    def __init__(self, model, names: Sequence[str | None]):
        self.layers = _lora_layers(model)
        adapters = sorted({n for n in names if n is not None})
        self.weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        columns: dict[str, slice] = {}
        for layer in self.layers:
            a_parts, b_parts, start = [], [], 0
            for name in adapters:
                a, b = layer.lora_A[name].weight.detach(), layer.lora_B[name].weight.detach()
                a_parts.append(a)
                b_parts.append(b * layer.scaling[name])
                columns[name] = slice(start, start + a.shape[0])
                start += a.shape[0]
            if a_parts:
                self.weights[id(layer)] = (torch.cat(a_parts), torch.cat(b_parts, dim=1))
        a = next(iter(self.weights.values()))[0] if self.weights else torch.empty(0)
        self.mask = torch.zeros(
            len(names), 1, max((c.stop for c in columns.values()), default=0), dtype=a.dtype
        )
        for row, name in enumerate(names):
            if name is not None:
                self.mask[row, 0, columns[name]] = 1
        self.mask = self.mask.to(a.device)

    @staticmethod
    def supported(model, names: Sequence[str | None]) -> bool:
        from peft.tuners.lora import Linear

        wanted = {n for n in names if n is not None}
        return all(
            type(layer) is Linear
            and all(n in layer.lora_A and not layer.use_dora.get(n, False) for n in wanted)
            for layer in _lora_layers(model)
        )

    def keep(self, rows: torch.Tensor) -> None:
        """Only ``rows`` (indices into the current batch) go on."""
        self.mask = self.mask[rows]

    def __enter__(self) -> RowAdapters:
        for layer in self.layers:
            layer.forward = self._forward(layer.base_layer, *self.weights.get(id(layer), (None, None)))
        return self

    def __exit__(self, *exc) -> None:
        for layer in self.layers:
            del layer.forward  # back to the class's forward

    def _forward(self, base, a: torch.Tensor | None, b: torch.Tensor | None) -> Callable:
        # always a function: a module assigned to ``layer.forward`` would be registered as a submodule
        # named "forward" and leave the class's forward in place
        def forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
            result = base(x, *args, **kwargs)
            if a is None:
                return result
            return (result + ((x.to(a.dtype) @ a.T) * self.mask) @ b.T).to(result.dtype)

        return forward


@torch.no_grad()
def sample(
    model,
    input_ids: torch.Tensor,
    attention: torch.Tensor,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    stops: set[int],
    adapters: Sequence[str | None] | None = None,
    on_tokens: Callable[[int], None] | None = None,
) -> list[Sampled]:
    """Sample up to ``max_new_tokens`` after each left-padded prompt row (``attention`` 1 on real tokens).

    adapters: per row, the LoRA adapter to run it through (None: the base model); None: the model as it
    is. on_tokens: called with the number of tokens sampled since its last call (rows still running),
    at most every 0.25 s and once at the end.
    """
    from transformers import StaticCache

    (rows, width), device = input_ids.shape, input_ids.device
    # one KV buffer for prompt + answer, written in place (a growing cache copies itself every step)
    cache = StaticCache(config=model.config, max_cache_len=width + max_new_tokens)
    kwargs, row_adapters = _adapter_setup(model, adapters)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    # the mask covers the whole buffer: answer positions are 1 (causality hides those not written yet)
    attention = torch.cat([attention, attention.new_ones(rows, max_new_tokens)], dim=1)
    live = torch.arange(rows, device=device)  # original row of each batch row
    running = torch.ones(rows, dtype=torch.bool, device=device)  # batch rows not yet stopped
    stop_ids = torch.tensor(sorted(stops), device=device)
    tokens = torch.empty(rows, max_new_tokens, dtype=torch.long, device=device)
    logps = torch.empty(rows, max_new_tokens, dtype=torch.float32, device=device)
    lengths = torch.full((rows,), max_new_tokens, dtype=torch.long, device=device)
    pending, last = 0, time.monotonic()
    with row_adapters or nullcontext():
        out = model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            # the last position as an index, not the int 1: torch multiplies a strided slice by expanding
            # the output layer's weight per row (seconds on CPU)
            logits_to_keep=torch.tensor([width - 1], device=device),
            **kwargs,
        )
        for step in range(max_new_tokens):
            token, logp = _draw(out.logits[:, -1].float(), temperature, top_p)
            tokens[live, step], logps[live, step] = token, logp
            done = running & torch.isin(token, stop_ids)
            lengths[live[done]] = step + 1
            pending += int(running.sum())
            running &= ~done
            if on_tokens is not None and time.monotonic() - last >= 0.25:
                on_tokens(pending)
                pending, last = 0, time.monotonic()
            n_running = int(running.sum())
            if n_running == 0 or step + 1 == max_new_tokens:
                break
            if len(live) - n_running >= COMPACT_SHARE * len(live):  # finished rows leave the batch
                keep = running.nonzero().squeeze(-1)
                cache.reorder_cache(keep)
                live, token, attention, positions = live[keep], token[keep], attention[keep], positions[keep]
                running = running[keep]
                kwargs = _keep_adapter_kwargs(kwargs, keep)
                if row_adapters is not None:
                    row_adapters.keep(keep)
            positions = positions[:, -1:] + 1
            out = model(
                input_ids=token[:, None],
                attention_mask=attention,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                **kwargs,
            )
    if on_tokens is not None and pending:
        on_tokens(pending)
    stopped = lengths < max_new_tokens
    stopped |= torch.isin(tokens[torch.arange(rows), (lengths - 1).clamp(min=0)], stop_ids)
    token_lists, logp_lists = tokens.tolist(), logps.tolist()
    return [
        Sampled(token_lists[r][:n], logp_lists[r][:n], "stop" if s else "length")
        for r, (n, s) in enumerate(zip(lengths.tolist(), stopped.tolist(), strict=True))
    ]


def _draw(logits: torch.Tensor, temperature: float, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(drawn token, its log-prob under log_softmax(logits / temperature)) per row; greedy at 0."""
    if temperature <= 0:
        logp = torch.log_softmax(logits, dim=-1)
        token = logits.argmax(-1)
        return token, logp.gather(-1, token[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / temperature, dim=-1)
    weights = logp
    if top_p < 1:
        # nucleus: drop the tokens whose higher-ranked mass already reaches top_p (the top one stays)
        sorted_logp, order = logp.sort(dim=-1, descending=True)
        above = sorted_logp.exp().cumsum(-1) - sorted_logp.exp() >= top_p
        weights = logp.scatter(-1, order, sorted_logp.masked_fill(above, float("-inf")))
    # inverse-CDF draw: one uniform per row (torch.multinomial draws one exponential per vocabulary entry)
    cdf = weights.exp().cumsum(-1)
    u = torch.rand(cdf.shape[0], 1, device=cdf.device) * cdf[:, -1:]
    token = torch.searchsorted(cdf, u).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
    return token, logp.gather(-1, token[:, None]).squeeze(-1)


def _adapter_setup(model, adapters: Sequence[str | None] | None) -> tuple[dict, RowAdapters | None]:
    """Forward kwargs and the row-adapter context for a batch: the fused path where it applies, PEFT's
    per-row ``adapter_names`` otherwise, nothing for a plain model."""
    if adapters is None:
        return {}, None
    if RowAdapters.supported(model, adapters):
        return {}, RowAdapters(model, adapters)
    return {"adapter_names": [n if n is not None else "__base__" for n in adapters]}, None


def _keep_adapter_kwargs(kwargs: dict, keep: torch.Tensor) -> dict:
    if "adapter_names" not in kwargs:
        return kwargs
    names = kwargs["adapter_names"]
    return {**kwargs, "adapter_names": [names[k] for k in keep.tolist()]}
