"""Transformers backend: batched, one LoRA adapter per row, sampled by :mod:`.decoding`'s loop.

The CPU default. It can wrap a live ``PeftModel`` (the trainer's), so on-policy rollouts need no
adapter sync at all. Log-probs are those of the sampled tokens under log-softmax(logits / temperature)
over the whole vocabulary (top-p truncation not applied; temperature 1 for greedy requests), the
quantity the trainer's importance ratio compares against.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import torch

from ..progress import active_progress
from . import backend_capabilities
from .attention import use_grouped_sdpa
from .base import Backend, BackendError, ChatRequest, Completion, SamplingParams, ScoreRequest
from .chat import chat_prompt_ids, prompt_ids_of
from .decoding import RowKV, prefix_reuse_supported, sample
from .machine import KEPT_KV_CALLS, KV_CACHE_GIB, DtypeChoice, choose_dtype, pick_decode
from .static_decode import StaticDecoder, check_shapes

log = logging.getLogger(__name__)

#: forced decoding keeps at most this many (row x response position) logit vectors in memory at once
SCORE_POSITIONS = 1024


_logged: set[str] = set()


def _log_once(message: str) -> None:
    if message not in _logged:
        _logged.add(message)
        log.info(message)


def kv_bytes_per_token(model) -> int:
    """Bytes of KV cache one token position takes in ``model`` (keys and values of every layer)."""
    cfg = model.config
    cfg = getattr(cfg, "text_config", None) or cfg
    heads = getattr(cfg, "num_attention_heads", 1)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    width = next(model.parameters()).element_size()
    return 2 * cfg.num_hidden_layers * kv_heads * head_dim * width


@dataclass
class _Read:
    """What one sampled row left behind: the adapter it ran under, the tokens the model read (prompt and
    answer but its last token) and their keys and values."""

    adapter: str | None
    tokens: list[int]
    kv: RowKV


class PrefixStore:
    """The rows sampled inside one :meth:`HFBackend.reuse_prefixes` scope, for later prompts to start from.

    A prompt reuses the row of its adapter whose tokens share the longest prefix with it (all but its
    last token at most: the prompt pass needs one token to run). A row whose tokens a later row read in
    full is dropped (the later row holds them too); past ``max_bytes`` the oldest rows go first.
    """

    def __init__(self, max_bytes: float):
        self.max_bytes = max_bytes
        self.rows: list[_Read] = []

    def lookup(self, adapter: str | None, prompt: list[int]) -> tuple[_Read, int] | None:
        """The row to start ``prompt`` from and how many of its tokens to reuse (None: no shared prefix)."""
        best, reuse = None, 0
        for row in self.rows:
            if row.adapter == adapter:
                n = min(len(os.path.commonprefix([row.tokens, prompt])), len(prompt) - 1)
                if n > reuse:
                    best, reuse = row, n
        return None if best is None else (best, reuse)

    def update(self, new: list[_Read], superseded: list[_Read]) -> None:
        """Add ``new`` rows (one of each adapter and token sequence); drop those in ``superseded`` and,
        past the memory budget, the oldest."""
        gone = {id(r) for r in superseded}
        self.rows = [r for r in self.rows if id(r) not in gone]
        seen = {(r.adapter, tuple(r.tokens)) for r in self.rows}
        for r in new:
            key = (r.adapter, tuple(r.tokens))
            if key not in seen:
                seen.add(key)
                self.rows.append(r)
        size = sum(r.kv.nbytes for r in self.rows)
        while self.rows and size > self.max_bytes:
            size -= self.rows[0].kv.nbytes
            self.rows.pop(0)


class HFBackend(Backend):
    """Generation with transformers.

    model: alias, folder or Hub id (ignored when ``model_obj`` is given). dtype: the weights' dtype when
    the backend loads them: "auto" is :func:`.machine.choose_dtype`'s for generation (on a CPU with bf16
    matrix units the faster of bf16 and fp32 for this model's shape, probed once and cached), kept with
    why in :attr:`dtype_choice` (None when ``model_obj`` is given: its dtype is the caller's).
    model_obj / tokenizer: an already loaded (Peft)model and tokenizer to generate with.
    max_batch: rows per sampling loop at most. kv_cache_gib: KV cache one loop may fill (a batch whose rows
    x (prompt + max_tokens) would need more is split). device: "cpu", "cuda", ...
    chat_template_kwargs: extra chat-template variables (e.g. ``{"enable_thinking": False}``).
    prefix_cache: inside :meth:`reuse_prefixes`, start prompts from the keys and values of earlier rows
    (False: every prompt runs whole; the results are the same up to rounding).
    decode: the decode path, :func:`.machine.pick_decode` ("auto": a CUDA graph on GPU, the eager loop on CPU);
    the stacked paths keep up to ``KEPT_KV_CALLS`` (2) times ``kv_cache_gib`` of KV buffers across calls
    (:mod:`udpo.training.autosize` plans the update around them). Models they cannot
    run (cache layers other than full attention, LoRA variants other than plain linear LoRA) decode
    eagerly; the choice is logged once. Where "auto" picked the graph and compiling or capturing it fails
    (a RuntimeError other than running out of memory), the call is made again stacked, uncompiled, and
    so are the later ones, with a warning naming the error (``decode="graph"`` raises it instead).
    decode_shapes: how a compiled decode step treats the sizes of its buckets (rows, KV columns):
    "dynamic", one compile for all of them (a new bucket records a CUDA graph), or "static", a compile
    per bucket (:mod:`.static_decode`; ``benchmarks/decode.py`` measures both side by side).
    """

    name = "hf"
    capabilities = backend_capabilities(name)

    def __init__(
        self,
        model: str = "smollm2-135m-instruct",
        model_obj=None,
        tokenizer=None,
        device: str | None = None,
        dtype: str = "auto",
        max_batch: int = 512,
        kv_cache_gib: float = KV_CACHE_GIB,
        chat_template_kwargs: dict | None = None,
        prefix_cache: bool = True,
        decode: str = "auto",
        decode_shapes: str = "dynamic",
    ):
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        from ..models import ModelNotFoundError, resolve_model

        check_shapes(decode_shapes)  # before the model loads
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        #: the dtype the weights were loaded in and why (None: ``model_obj`` given)
        self.dtype_choice: DtypeChoice | None = None
        if model_obj is None:
            path = resolve_model(model)
            try:
                config = AutoConfig.from_pretrained(path)
                self.dtype_choice = choose_dtype(dtype, self.device, "generate", config)
                _log_once(f"hf backend: {self.dtype_choice.describe()}")
                model_obj = AutoModelForCausalLM.from_pretrained(
                    path, config=config, dtype=self.dtype_choice.dtype
                )
                tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
            except OSError as e:
                raise ModelNotFoundError(f"could not load model {model!r}: {e}") from e
            model_obj.to(self.device)
        elif tokenizer is None:
            raise ValueError("pass the tokenizer together with model_obj")
        use_grouped_sdpa(model_obj)
        self.model = model_obj
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if max_batch < 1 or not kv_cache_gib > 0:
            raise ValueError(
                f"max_batch must be >= 1 and kv_cache_gib > 0, got {max_batch} and {kv_cache_gib}"
            )
        self.max_batch = max_batch
        self.kv_bytes = kv_cache_gib * 2**30
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.prefix_cache = prefix_cache
        self.prefixes: PrefixStore | None = None  # inside reuse_prefixes()
        self.decode = pick_decode(decode, self.device)
        self.decode_shapes = decode_shapes
        self._decode_auto = decode == "auto"
        self._static: StaticDecoder | None = None
        self._static_for: tuple | None = None  # (model id, adapters) the decoder was checked for

    # adapters -------------------------------------------------------------------------------
    @property
    def adapters(self) -> list[str]:
        return list(getattr(self.model, "peft_config", {}) or {})

    def load_adapter(self, name: str, path: str) -> None:
        from peft import PeftModel

        if not isinstance(self.model, PeftModel):
            self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name)
        else:
            if name in self.model.peft_config:
                self.model.delete_adapter(name)
            self.model.load_adapter(path, adapter_name=name)
        self.model.eval()
        if self.prefixes is not None:  # keys and values computed under the old weights
            self.prefixes.rows.clear()

    @contextmanager
    def reuse_prefixes(self) -> Iterator[None]:
        """Keep every sampled row's keys and values until the scope ends (at most ``kv_cache_gib``), and
        start each later prompt from the row with the longest shared prefix under its adapter: a
        debate's round-1 prompt then only runs the peers' messages. The model's weights must not change
        inside the scope (``load_adapter`` empties the store). Models whose cache layers are not all full
        attention (:func:`.decoding.prefix_reuse_supported`) run every prompt whole."""
        if not self.prefix_cache or self.prefixes is not None or not prefix_reuse_supported(self.model):
            yield
            return
        self.prefixes = PrefixStore(self.kv_bytes)
        try:
            yield
        finally:
            self.prefixes = None

    # generation -----------------------------------------------------------------------------
    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        """Prompt token ids of a chat, with the generation prompt appended."""
        return chat_prompt_ids(self.tokenizer, messages, self.chat_template_kwargs)

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        """One sampling loop per distinct sampling setting, its rows sorted by prompt length and split
        into calls whose KV cache stays within ``kv_cache_gib`` (and at most ``max_batch`` rows)."""
        prompts = [self.encode(r.messages) for r in requests]
        out: list[Completion | None] = [None] * len(requests)
        groups: dict[SamplingParams, list[int]] = {}
        for k, r in enumerate(requests):
            groups.setdefault(r.sampling, []).append(k)
        for sampling, idx in groups.items():
            idx.sort(key=lambda k: len(prompts[k]))
            for chunk in self._calls(idx, [len(prompts[k]) for k in idx], sampling.max_tokens):
                done = self._generate([requests[k] for k in chunk], [prompts[k] for k in chunk], sampling)
                for k, c in zip(chunk, done, strict=True):
                    out[k] = c
        return out  # type: ignore[return-value]

    def _calls(self, idx: list[int], lengths: list[int], max_tokens: int) -> list[list[int]]:
        """``idx`` (sorted by prompt length) in consecutive calls of at most ``max_batch`` rows whose
        rows x (longest prompt + max_tokens) positions of KV cache fit the budget (one row at least)."""
        per_position = kv_bytes_per_token(self.model)
        calls: list[list[int]] = [[]]
        for k, n in zip(idx, lengths, strict=True):
            rows = len(calls[-1]) + 1
            if calls[-1] and (
                rows > self.max_batch or rows * (n + max_tokens) * per_position > self.kv_bytes
            ):
                calls.append([])
            calls[-1].append(k)
        return calls

    @torch.no_grad()
    def _generate(
        self, requests: list[ChatRequest], prompts: list[list[int]], sp: SamplingParams
    ) -> list[Completion]:
        # rows with the same prompt and adapter share one prompt pass
        unique: dict[tuple[tuple[int, ...], str | None], int] = {}
        expand = [
            unique.setdefault((tuple(p), r.adapter), len(unique))
            for p, r in zip(prompts, requests, strict=True)
        ]
        keys = list(unique)
        store = self.prefixes
        found = [store.lookup(adapter, list(p)) if store is not None else None for p, adapter in keys]
        skip = [f[1] if f else 0 for f in found]
        suffixes = [p[n:] for (p, _), n in zip(keys, skip, strict=True)]
        width = max(len(p) for p in suffixes)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in suffixes], device=self.device)
        attention = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in suffixes], device=self.device
        )
        adapters = [r.adapter for r in requests]
        self._check_adapters(adapters)
        reporter = active_progress()
        if sp.seed is not None:
            torch.manual_seed(sp.seed)
        was_training = self.model.training
        self.model.eval()
        kwargs = dict(
            max_new_tokens=sp.max_tokens,
            temperature=sp.temperature,
            top_p=sp.top_p,
            stops={self.tokenizer.eos_token_id, pad, *self._extra_stops()} - {None},
            adapters=[a for _, a in keys] if self.adapters else None,
            on_tokens=reporter.add_tokens if reporter else None,
            prefixes=[f[0].kv.head(f[1]) if f else None for f in found] if any(skip) else None,
            expand=torch.tensor(expand, device=self.device) if len(keys) < len(prompts) else None,
            keep_kv=store is not None,
        )
        try:
            try:
                rows = self._sample(input_ids, attention, **kwargs)
            except RuntimeError as e:
                if not self._graph_failed(e):
                    raise
                if sp.seed is not None:
                    torch.manual_seed(sp.seed)
                rows = self._sample(input_ids, attention, **kwargs)
        except (RuntimeError, ValueError) as e:
            raise BackendError(f"hf generation failed: {e}") from e
        finally:
            self.model.train(was_training)
        if store is not None:
            store.update(
                [
                    _Read(a, p + row.tokens[:-1], row.kv)
                    for p, a, row in zip(prompts, adapters, rows, strict=True)
                ],
                [f[0] for f in found if f and f[1] == len(f[0].tokens)],
            )
        return [
            Completion(
                text=self.tokenizer.decode(row.tokens, skip_special_tokens=True),
                prompt_ids=prompt,
                completion_ids=row.tokens,
                logprobs=row.logprobs if sp.logprobs else [],
                finish_reason=row.finish_reason,
            )
            for prompt, row in zip(prompts, rows, strict=True)
        ]

    def _sample(self, input_ids: torch.Tensor, attention: torch.Tensor, **kwargs) -> list:
        """One call of the decode path in use (:meth:`_decoder`)."""
        decoder = self._decoder()
        return (decoder.sample if decoder is not None else partial(sample, self.model))(
            input_ids, attention, **kwargs
        )

    def _graph_failed(self, error: RuntimeError) -> bool:
        """Whether ``error`` came from a graph that "auto" chose and could not compile or capture: then
        decode stacked from now on (logged) and say so; an error of any other kind stays an error."""
        if not (
            self._decode_auto
            and self._static is not None
            and self._static.graph
            and not isinstance(error, torch.cuda.OutOfMemoryError)
        ):
            return False
        log.warning(
            "hf backend: graph decoding failed; decoding stacked, uncompiled, from now on. The error:\n%s: %s",
            type(error).__name__,
            error,
        )
        self._drop_decoder()
        self.decode, self._static_for = "stacked", None
        return True

    def _drop_decoder(self) -> None:
        """Close the stacked decoder (a compiled one resets dynamo: a new decoder compiles afresh)."""
        if self._static is not None:
            self._static.close()
        self._static = None

    def _decoder(self) -> StaticDecoder | None:
        """The stacked decoder (None: the eager loop), rebuilt when the model or its adapters change."""
        if self.decode == "eager":
            _log_once(f"hf backend: eager decoding on {self.device}")
            return None
        key = (id(self.model), tuple(self.adapters))
        if key != self._static_for:
            self._drop_decoder()
            self._static_for = key
            mode = mode_asked = self.decode
            if mode == "graph" and hasattr(next(self.model.parameters()), "ds_id"):
                # ZeRO-3 partitions the weights and gathers them into new storage for every rollout: a
                # captured graph would read the old addresses
                mode = "stacked"
            if StaticDecoder.supported(self.model):
                self._static = StaticDecoder(
                    self.model,
                    graph=mode == "graph",
                    max_bytes=KEPT_KV_CALLS * self.kv_bytes,
                    max_rows=self.max_batch,
                    max_positions=int(self.kv_bytes // kv_bytes_per_token(self.model)),
                    shapes=self.decode_shapes,
                )
                why = (
                    " (not graph: ZeRO-3 gathers the weights afresh for every rollout)"
                    if mode != mode_asked
                    else ""
                )
                _log_once(f"hf backend: {mode} decoding on {self.device}{why}")
            else:
                _log_once(f"hf backend: eager decoding ({self.decode} cannot run this model's layers)")
        return self._static

    def _check_adapters(self, names: list[str | None]) -> None:
        missing = sorted({n for n in names if n is not None} - set(self.adapters))
        if missing:
            raise BackendError(
                f"adapter(s) {missing} are not loaded in the hf backend (loaded: {self.adapters})"
            )

    def _adapter_kwargs(self, names: list[str | None]) -> dict:
        """PEFT's per-row ``adapter_names`` for a batch (None rows use the base model)."""
        self._check_adapters(names)
        if not self.adapters:
            return {}
        return {"adapter_names": [n if n is not None else "__base__" for n in names]}

    @torch.no_grad()
    def completion_logprobs(
        self,
        messages_or_prompt_ids: list[dict[str, str]] | list[int],
        completion_ids: list[int],
        adapter: str | None = None,
        temperature: float = 1.0,
    ) -> list[float]:
        """Log-prob of each token of a given completion after the prompt, under ``adapter`` (None: base).

        The prompt is chat messages (the chat template is applied) or token ids used as they are. One
        teacher-forced forward pass; log-softmax(logits / temperature), the quantity ``generate``
        returns at that temperature, so a trainer can check that its policy and an engine agree.
        """
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        prompt = prompt_ids_of(self.tokenizer, messages_or_prompt_ids, self.chat_template_kwargs)
        completion = list(completion_ids)
        if not completion:
            return []
        kwargs = self._adapter_kwargs([adapter])
        ids = torch.tensor([prompt + completion], device=self.device)
        was_training = self.model.training
        self.model.eval()
        try:
            logits = self.model(input_ids=ids, **kwargs).logits[0, len(prompt) - 1 : -1].float() / temperature
        except (RuntimeError, ValueError) as e:
            raise BackendError(f"hf forward pass failed: {e}") from e
        finally:
            self.model.train(was_training)
        chosen = ids[0, len(prompt) :].unsqueeze(-1)
        return torch.log_softmax(logits, dim=-1).gather(-1, chosen).squeeze(-1).tolist()

    @torch.no_grad()
    def token_entropies(self, requests: list[ScoreRequest]) -> list[list[float]]:
        """Per request, the full-vocabulary entropy (nats, temperature 1) of the next-token distribution
        at each token of ``response`` forced after the chat prompt; the response is tokenized as text and
        ends with the end-of-turn token, as a generated turn does.

        Rows are batched (one adapter per row), shortest first, left-padded so every response ends at
        the last position; only the response positions get logits, at most ``SCORE_POSITIONS`` row
        positions per forward pass.
        """
        eos = self.tokenizer.eos_token_id
        rows = [
            (self.encode(r.messages), self.tokenizer.encode(r.response, add_special_tokens=False) + [eos])
            for r in requests
        ]
        order = sorted(range(len(rows)), key=lambda k: len(rows[k][0]) + len(rows[k][1]))
        out: list[list[float]] = [[] for _ in rows]
        chunk: list[int] = []
        for k in order:
            keep = max(len(rows[j][1]) for j in [*chunk, k]) + 1
            if chunk and ((len(chunk) + 1) * keep > SCORE_POSITIONS or len(chunk) == self.max_batch):
                self._score_chunk(rows, chunk, [requests[j].adapter for j in chunk], out)
                chunk = []
            chunk.append(k)
        if chunk:
            self._score_chunk(rows, chunk, [requests[j].adapter for j in chunk], out)
        return out

    def _score_chunk(
        self, rows: list[tuple[list[int], list[int]]], chunk: list[int], adapters, out: list[list[float]]
    ) -> None:
        pad = self.tokenizer.pad_token_id
        batch = [rows[k] for k in chunk]
        width = max(len(p) + len(c) for p, c in batch)
        keep = max(len(c) for _, c in batch) + 1
        ids = torch.tensor([[pad] * (width - len(p) - len(c)) + p + c for p, c in batch], device=self.device)
        mask = torch.tensor(
            [[0] * (width - len(p) - len(c)) + [1] * (len(p) + len(c)) for p, c in batch], device=self.device
        )
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        was_training = self.model.training
        self.model.eval()
        try:
            logits = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                # as indices, not an int: torch multiplies a sliced (strided) input by expanding the
                # output layer's weight per row, seconds per call on CPU
                logits_to_keep=torch.arange(width - keep, width, device=self.device),
                use_cache=False,
                **self._adapter_kwargs(adapters),
            ).logits
        except (RuntimeError, ValueError) as e:
            raise BackendError(f"hf forward pass failed: {e}") from e
        finally:
            self.model.train(was_training)
        for b, (k, (_, c)) in enumerate(zip(chunk, batch, strict=True)):
            # logits[b, j] predicts position width - keep + j + 1: the response starts at j = keep - 1 - len(c)
            logp = torch.log_softmax(logits[b, keep - 1 - len(c) : keep - 1].float(), dim=-1)
            out[k] = (-(logp.exp() * logp).sum(-1)).tolist()

    def _extra_stops(self) -> list[int]:
        cfg = getattr(self.model, "generation_config", None)
        eos = getattr(cfg, "eos_token_id", None)
        if eos is None:
            return []
        return list(eos) if isinstance(eos, list | tuple) else [eos]

    def close(self) -> None:
        self._drop_decoder()
        self.model = None
