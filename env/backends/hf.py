"""Transformers ``generate`` backend: batched, one LoRA adapter per row (PEFT mixed batches).

The CPU default. It can wrap a live ``PeftModel`` (the trainer's), so on-policy rollouts need no
adapter sync at all. Log-probs are those of the sampled tokens under log-softmax(logits / temperature)
over the whole vocabulary (top-p truncation not applied; temperature 1 for greedy requests), the
quantity the trainer's importance ratio compares against.
"""

from __future__ import annotations

import time

import torch

from ..progress import DebateProgress, active_progress
from .base import Backend, BackendError, ChatRequest, Completion, SamplingParams, ScoreRequest
from .chat import chat_prompt_ids, prompt_ids_of, sampling_temperature

#: dtype names accepted everywhere a dtype is set (besides "auto")
DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
}

#: forced decoding keeps at most this many (row x response position) logit vectors in memory at once
SCORE_POSITIONS = 1024


def pick_dtype(name: str, device: str) -> torch.dtype:
    """ "auto" is bf16 on GPU and fp32 on CPU (bf16 matmuls are slow on most CPUs)."""
    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use auto, bf16, fp16 or fp32") from None


class HFBackend(Backend):
    """Generation with transformers.

    model: alias, folder or Hub id (ignored when ``model_obj`` is given).
    model_obj / tokenizer: an already loaded (Peft)model and tokenizer to generate with.
    max_batch: rows per ``generate`` call (longer batches are split). device: "cpu", "cuda", ...
    chat_template_kwargs: extra chat-template variables (e.g. ``{"enable_thinking": False}``).
    """

    name = "hf"

    def __init__(
        self,
        model: str = "smollm2-135m-instruct",
        model_obj=None,
        tokenizer=None,
        device: str | None = None,
        dtype: str = "auto",
        max_batch: int = 64,
        chat_template_kwargs: dict | None = None,
    ):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from ..models import ModelNotFoundError, resolve_model

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if model_obj is None:
            path = resolve_model(model)
            try:
                model_obj = AutoModelForCausalLM.from_pretrained(path, dtype=pick_dtype(dtype, self.device))
                tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
            except OSError as e:
                raise ModelNotFoundError(f"could not load model {model!r}: {e}") from e
            model_obj.to(self.device)
        elif tokenizer is None:
            raise ValueError("pass the tokenizer together with model_obj")
        self.model = model_obj
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.max_batch = max_batch
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

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

    # generation -----------------------------------------------------------------------------
    def encode(self, messages: list[dict[str, str]]) -> list[int]:
        """Prompt token ids of a chat, with the generation prompt appended."""
        return chat_prompt_ids(self.tokenizer, messages, self.chat_template_kwargs)

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        out: list[Completion | None] = [None] * len(requests)
        # one generate call per distinct sampling setting, split into max_batch rows
        groups: dict[SamplingParams, list[int]] = {}
        for k, r in enumerate(requests):
            groups.setdefault(r.sampling, []).append(k)
        for sampling, idx in groups.items():
            for s in range(0, len(idx), self.max_batch):
                chunk = idx[s : s + self.max_batch]
                for k, c in zip(chunk, self._generate([requests[k] for k in chunk], sampling), strict=True):
                    out[k] = c
        return out  # type: ignore[return-value]

    @torch.no_grad()
    def _generate(self, requests: list[ChatRequest], sp: SamplingParams) -> list[Completion]:
        prompts = [self.encode(r.messages) for r in requests]
        width = max(len(p) for p in prompts)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=self.device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        kwargs = self._adapter_kwargs([r.adapter for r in requests])
        stops = {self.tokenizer.eos_token_id, pad, *self._extra_stops()}
        reporter = active_progress()
        counter = _token_counter(reporter, stops, len(requests)) if reporter else None
        if counter is not None:
            from transformers import StoppingCriteriaList

            kwargs["stopping_criteria"] = StoppingCriteriaList([counter])
        if sp.seed is not None:
            torch.manual_seed(sp.seed)
        was_training = self.model.training
        self.model.eval()
        try:
            gen = self.model.generate(
                input_ids=input_ids,
                attention_mask=attention,
                max_new_tokens=sp.max_tokens,
                do_sample=sp.temperature > 0,
                temperature=sp.temperature if sp.temperature > 0 else None,
                top_p=sp.top_p if sp.temperature > 0 else None,
                top_k=None,
                pad_token_id=pad,
                # each process generates alone with weights it holds (under ZeRO-3 the trainer gathers
                # them first): transformers would otherwise sync every step with the other processes
                synced_gpus=False,
                return_dict_in_generate=True,
                output_logits=sp.logprobs,
                **kwargs,
            )
        except (RuntimeError, ValueError) as e:
            raise BackendError(f"hf generate failed: {e}") from e
        finally:
            self.model.train(was_training)
            if counter is not None:
                counter.flush()
        seqs = gen.sequences[:, width:].tolist()
        logps = None
        if sp.logprobs:
            # raw logits, B x L x V, scaled to the distribution the tokens were drawn from
            logits = torch.stack(gen.logits, dim=1).float() / sampling_temperature(sp.temperature)
            chosen = gen.sequences[:, width:].unsqueeze(-1)
            logps = (torch.log_softmax(logits, dim=-1).gather(-1, chosen).squeeze(-1)).tolist()
        out = []
        for b, seq in enumerate(seqs):
            n, finish = len(seq), "length"
            for k, tok in enumerate(seq):
                if tok in stops:
                    n, finish = k + 1, "stop"
                    break
            ids = seq[:n]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            out.append(
                Completion(
                    text=text,
                    prompt_ids=prompts[b],
                    completion_ids=ids,
                    logprobs=logps[b][:n] if logps else [],
                    finish_reason=finish,
                )
            )
        return out

    def _adapter_kwargs(self, names: list[str | None]) -> dict:
        """PEFT's per-row ``adapter_names`` for a batch (None rows use the base model)."""
        if any(n is not None for n in names):
            known = set(self.adapters)
            missing = sorted({n for n in names if n is not None and n not in known})
            if missing:
                raise BackendError(
                    f"adapter(s) {missing} are not loaded in the hf backend (loaded: {sorted(known)})"
                )
            return {"adapter_names": [n if n is not None else "__base__" for n in names]}
        return {"adapter_names": ["__base__"] * len(names)} if self.adapters else {}

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
                logits_to_keep=keep,
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
        self.model = None


#: seconds between the token counts a generate call hands to the progress reporter
COUNT_INTERVAL = 0.25


def _token_counter(reporter: DebateProgress, stops: set[int], rows: int):
    """A transformers stopping criterion that never stops: once per decoding step it adds the rows still
    generating (their new token included; finished rows only pad) to a count on the device, and hands the
    count to ``reporter`` at most every ``COUNT_INTERVAL`` seconds (one device sync each) and at
    ``flush()``. The total equals the completions' lengths as ``_generate`` cuts them."""
    from transformers import StoppingCriteria

    class TokenCounter(StoppingCriteria):
        def __init__(self) -> None:
            self.stops = torch.tensor(sorted(s for s in stops if s is not None))
            self.alive = torch.ones(rows, dtype=torch.bool)
            self.pending = torch.zeros((), dtype=torch.long)
            self.last = time.monotonic()

        def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
            if self.alive.device != input_ids.device:  # the model's device, known at the first step
                self.stops, self.alive = self.stops.to(input_ids.device), self.alive.to(input_ids.device)
                self.pending = self.pending.to(input_ids.device)
            self.pending += self.alive.sum()
            self.alive &= ~torch.isin(input_ids[:, -1], self.stops)
            if time.monotonic() - self.last >= COUNT_INTERVAL:
                self.flush()
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

        def flush(self) -> None:
            n = int(self.pending.item())
            self.pending.zero_()
            self.last = time.monotonic()
            reporter.add_tokens(n)

    return TokenCounter()
