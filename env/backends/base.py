"""The one interface every inference engine sits behind.

A backend takes a batch of chat requests (each with its agent's adapter and sampling parameters)
and returns, per request, the text, the prompt and completion token ids and the per-token
log-probabilities of the sampled completion tokens under the distribution they were sampled from,
log-softmax(logits / temperature) (the *behavior* log-probs the trainer's importance ratio needs;
greedy requests report temperature-1 log-probs).
"""

from __future__ import annotations

import abc
import math
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace

#: weight dtypes a backend accepts besides "auto" (``machine.DTYPES`` maps them to torch dtypes); listed
#: here, without torch, so settings are checked before anything heavy is imported
DTYPE_NAMES = ("bf16", "bfloat16", "fp16", "float16", "fp32", "float32")


class BackendError(RuntimeError):
    """An inference engine or server failed; the message says which and why."""


@dataclass(frozen=True)
class Capabilities:
    """What an inference engine can do. Code outside the backends asks these instead of comparing a
    backend's name: a backend class declares its own (:attr:`Backend.capabilities`), and
    ``udpo.env.backends.backend_capabilities(name)`` gives them where only a setting names the backend.

    serves_live_model: it samples a model object of this process (the trainer's own policy), so an
        update reaches it without adapter files to sync.
    returns_logits: it exposes full-vocabulary logits under forced decoding (token entropies, which
        the DIG and DIGRA protocols score).
    remote: it is a server at ``base_url`` that runs nothing on this machine and names its own model.
    fixed_context: its context length is a size chosen when it starts (vLLM's ``max_model_len``), not
        the model's own.
    serves_several_models: one backend answers for several base models (a role per model).
    """

    serves_live_model: bool = False
    returns_logits: bool = False
    remote: bool = False
    fixed_context: bool = False
    serves_several_models: bool = False


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion.

    temperature: 0 means greedy. top_p: nucleus mass. max_tokens: completion length cap.
    seed: per-request seed where the engine supports it (None: engine RNG).
    logprobs: return the log-prob of each sampled token.
    """

    temperature: float = 0.7
    top_p: float = 1.0
    max_tokens: int = 256
    seed: int | None = None
    logprobs: bool = True

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    def with_(self, **changes) -> SamplingParams:
        return replace(self, **changes)


def logprob_temperature(temperature: float) -> float:
    """The temperature of the distribution whose log-probs a backend reports and a trainer recomputes:
    the sampling temperature, or 1 for greedy decoding (temperature 0), whose own distribution is a point
    mass."""
    return temperature if temperature > 0 else 1.0


@dataclass
class ChatRequest:
    """One chat completion to produce.

    messages: OpenAI-style ``[{"role": ..., "content": ...}]``.
    adapter: name of a LoRA adapter registered with the backend (None: the base model).
    model: for backends serving several base models (heterogeneous teams); None: the default.
    """

    messages: list[dict[str, str]]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    adapter: str | None = None
    model: str | None = None


@dataclass
class Completion:
    """What a backend returns for one request.

    prompt_ids: the token ids the model was conditioned on (chat template applied).
    completion_ids / logprobs: sampled token ids and their log-probs (same length; logprobs may
    be empty when the engine cannot return them). finish_reason: "stop" or "length".
    """

    text: str
    prompt_ids: list[int] = field(default_factory=list)
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "stop"


@dataclass
class ScoreRequest:
    """A response to score by forced decoding: ``response`` (text) read token by token after the chat
    ``messages`` (the prompt), under ``adapter`` (None: the base model) of ``model`` (None: the default)."""

    messages: list[dict[str, str]]
    response: str
    adapter: str | None = None
    model: str | None = None


class Backend(abc.ABC):
    """Batch chat generation with per-request LoRA adapters."""

    name: str = "base"
    capabilities: Capabilities = Capabilities()

    @abc.abstractmethod
    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        """Produce one completion per request, in order. Raises BackendError on engine failure."""

    def completion_logprobs(
        self,
        messages_or_prompt_ids: list[dict[str, str]] | list[int],
        completion_ids: list[int],
        adapter: str | None = None,
        temperature: float = 1.0,
    ) -> list[float]:
        """Log-prob of each token of a given completion after the prompt (chat messages, or prompt
        token ids used as they are) under ``adapter`` (None: base), from log-softmax(logits /
        temperature) as in ``generate``. Lets a trainer check that an adapter update reached the engine."""
        raise BackendError(f"the {self.name} backend cannot score a given completion")

    def token_entropies(self, requests: list[ScoreRequest]) -> list[list[float]]:
        """Per request, the entropy (nats) of the model's full-vocabulary next-token distribution
        (temperature 1) at each token of the response forced after the prompt, the end-of-turn token
        included. Needs logits, which only local engines expose (the ``hf`` backend)."""
        raise BackendError(
            f"the {self.name} backend cannot return logits for forced decoding; score with an hf model "
            f"instead (protocol option entropy_model)"
        )

    def load_adapter(self, name: str, path: str) -> None:
        """Register (or replace) the LoRA adapter ``name`` from a PEFT folder ``path``."""
        raise BackendError(f"the {self.name} backend does not serve LoRA adapters")

    def reuse_prefixes(self) -> AbstractContextManager:
        """A scope (``with backend.reuse_prefixes(): ...``) over calls whose prompts extend earlier ones,
        such as a debate's rounds: the backend may keep what it computed for earlier prompts and answers
        and start later prompts from it. The weights must not change inside. Default: nothing kept
        (engines with their own prefix cache, such as vLLM, need no scope)."""
        return nullcontext()

    @property
    def adapters(self) -> list[str]:
        """Names of the adapters currently registered."""
        return []

    def close(self) -> None:
        """Release engines, servers and memory. Safe to call twice."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
