"""Backend for any OpenAI-compatible chat server (vLLM's own server, SGLang, TGI, hosted APIs).

Requests of a batch run concurrently (``max_concurrency`` in flight), each with a timeout and
retries with exponential backoff on connection errors, timeouts, 429 and 5xx answers; anything
else fails at once. Every failure is a ``BackendError`` naming the URL and the cause.

Adapters are served as model names: a request with ``adapter="agent0"`` asks the server for model
``agent0``. Start vLLM with ``--enable-lora --lora-modules agent0=/path/agent0 ...``, or with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` so ``load_adapter`` can register or replace adapters at
run time (through ``/v1/load_lora_adapter``; the folder must be readable by the server). Write each
new version of an adapter to a new folder: vLLM keys its prefix cache by adapter name and path.

What comes back depends on the server:

* vLLM (detected through its ``/version`` endpoint, or ``vllm_extras=True``): text, prompt token
  ids and completion token ids (the ``return_token_ids`` extension) and the log-prob of each sampled
  token as the server's ``--logprobs-mode`` defines it. Training with ``behavior_logprobs: rollout``
  needs the sampling distribution's log-probs, ``--logprobs-mode processed_logprobs`` (what
  :class:`~udpo.env.backends.vllm_server.VLLMServer` starts); vLLM's default ``raw_logprobs`` are
  before temperature. The trainer's default (``behavior_logprobs: recompute``) does not use them.
* Other servers: text and, where the server supports ``logprobs``, the per-token log-probs as the
  server defines them; ``prompt_ids`` and ``completion_ids`` are empty lists, so such rollouts can
  be scored but not trained on.
"""

from __future__ import annotations

import os
import random
import time
import warnings
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

import httpx

from ..progress import DebateProgress, active_progress
from . import backend_capabilities
from .base import Backend, BackendError, ChatRequest, Completion

#: answers worth another try: request timeout, conflict, too early, rate limit, server errors
RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
#: environment variables the API key is read from, first set wins (never from a command line, which
#: every user of the machine can read in the process list)
API_KEY_ENV = ("UDPO_API_KEY", "OPENAI_API_KEY")


def api_key_from_env() -> str | None:
    """The API key in ``$UDPO_API_KEY``, else ``$OPENAI_API_KEY``, else None."""
    return next((os.environ[k] for k in API_KEY_ENV if os.environ.get(k)), None)


def read_api_key_file(path: str | os.PathLike) -> str:
    """The API key in a file (its first line, spaces stripped); errors name the file, never its content."""
    try:
        with open(path, encoding="utf-8") as fh:
            key = fh.readline(4096).strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"API key file {path}: cannot read it ({type(e).__name__})") from None
    if not key:
        raise ValueError(f"API key file {path}: its first line is empty")
    return key


#: the server an OpenAIBackend talks to when no ``base_url`` is given (``vllm serve``'s default address)
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


class OpenAIBackend(Backend):
    """Chat completions over HTTP.

    base_url: the server's OpenAI root, e.g. ``http://127.0.0.1:8000/v1``.
    model: the base model's served name (None: the first model the server lists that is not a
        LoRA adapter). api_key: sent as a bearer token (None: ``$UDPO_API_KEY``, else
        ``$OPENAI_API_KEY``, else none; see :func:`api_key_from_env`).
    max_concurrency: requests in flight at once. timeout: seconds per attempt.
    max_retries: further attempts after a retryable failure. backoff: first wait in seconds,
        doubled per attempt (with jitter, at most ``max_backoff``; a ``Retry-After`` header wins).
    vllm_extras: ask for vLLM's token ids (None: detect a vLLM server on first use).
    chat_template_kwargs: extra chat-template variables sent with every request (vLLM's and SGLang's
        ``chat_template_kwargs`` extension, e.g. ``{"enable_thinking": False}``).
    """

    name = "openai"
    capabilities = backend_capabilities(name)

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        model: str | None = None,
        api_key: str | None = None,
        max_concurrency: int = 32,
        timeout: float = 120.0,
        max_retries: int = 3,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        vllm_extras: bool | None = None,
        chat_template_kwargs: dict | None = None,
    ):
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        if max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.root = self.base_url[: -len("/v1")] if self.base_url.endswith("/v1") else self.base_url
        self._model = model
        self.max_concurrency = max_concurrency
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._vllm = vllm_extras
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        api_key = api_key if api_key is not None else api_key_from_env()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 10.0)),
            limits=httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency),
        )
        self._loaded: dict[str, str] = {}  # adapters this client registered: name -> path

    # server facts ---------------------------------------------------------------------------
    @property
    def model(self) -> str:
        """The base model's served name (asked from ``/models`` once when not given)."""
        if self._model is None:
            cards = self._request("GET", f"{self.base_url}/models").get("data") or []
            bases = [c["id"] for c in cards if not c.get("parent")]
            if not bases:
                raise BackendError(
                    f"{self.base_url}/models lists no base model; pass model=... to OpenAIBackend"
                )
            self._model = bases[0]
        return self._model

    @property
    def is_vllm(self) -> bool:
        """Whether the server is vLLM (it answers ``/version``); decides the token-id extras."""
        if self._vllm is None:
            try:
                response = self._client.get(f"{self.root}/version", timeout=min(self.timeout, 10.0))
                self._vllm = response.status_code == 200 and "version" in response.json()
            except (httpx.HTTPError, ValueError):
                self._vllm = False
        return self._vllm

    @property
    def adapters(self) -> list[str]:
        """LoRA adapters the server lists (vLLM marks them with a ``parent`` model)."""
        cards = self._request("GET", f"{self.base_url}/models").get("data") or []
        return [c["id"] for c in cards if c.get("parent")]

    def load_adapter(self, name: str, path: str) -> None:
        """Register or replace adapter ``name`` on a vLLM server started with runtime LoRA updating."""
        path = os.path.abspath(path)
        if self._loaded.get(name) == path:
            warnings.warn(
                f"adapter {name!r} reloaded from the same folder {path}: vLLM may reuse prefix-cache "
                "entries of the old weights; write each version to a new folder",
                stacklevel=2,
            )
        url = f"{self.base_url}/load_lora_adapter"
        try:
            self._request("POST", url, {"lora_name": name, "lora_path": path, "load_inplace": True})
        except BackendError as e:
            if "HTTP 404" in str(e):
                raise BackendError(
                    f"{url} is not available: start the vLLM server with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True "
                    f"to load adapters at run time, or serve them with --lora-modules {name}={path}"
                ) from e
            raise
        self._loaded[name] = path

    # generation -----------------------------------------------------------------------------
    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        """All requests concurrently (``max_concurrency`` at a time), results in request order.
        A request's ``seed`` s is sent as s + k for the k-th request, as in the vllm backend."""
        if not requests:
            return []
        payloads = [self._payload(r, k) for k, r in enumerate(requests)]
        workers = min(self.max_concurrency, len(payloads))
        reporter = active_progress()  # read here: worker threads do not inherit the context
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="udpo-openai") as pool:
            futures = [pool.submit(self._complete_reported, p, reporter) for p in payloads]
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            failed = next((f for f in futures if f in done and f.exception() is not None), None)
            if failed is not None:
                for f in pending:
                    f.cancel()
                raise failed.exception()
        return [f.result() for f in futures]

    def _payload(self, r: ChatRequest, k: int) -> dict:
        sp = r.sampling
        payload = {
            "model": r.adapter or r.model or self.model,
            "messages": r.messages,
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "max_tokens": sp.max_tokens,
        }
        if sp.seed is not None:
            payload["seed"] = sp.seed + k
        if sp.logprobs:
            payload["logprobs"] = True
        if self.is_vllm:
            payload["return_token_ids"] = True
        if self.chat_template_kwargs:
            payload["chat_template_kwargs"] = self.chat_template_kwargs
        return payload

    def _complete_reported(self, payload: dict, reporter: DebateProgress | None) -> Completion:
        """One response, its completion tokens reported as it arrives (counted by their log-probs when the
        server returns no token ids)."""
        completion = self._complete(payload)
        if reporter is not None:
            reporter.add_tokens(len(completion.completion_ids) or len(completion.logprobs))
        return completion

    def _complete(self, payload: dict) -> Completion:
        url = f"{self.base_url}/chat/completions"
        data = self._request("POST", url, payload)
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
            steps = (choice.get("logprobs") or {}).get("content") or []
            return Completion(
                text=text,
                prompt_ids=list(data.get("prompt_token_ids") or []),
                completion_ids=list(choice.get("token_ids") or []),
                logprobs=[float(s["logprob"]) for s in steps],
                finish_reason=choice.get("finish_reason") or "stop",
            )
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise BackendError(
                f"{url} returned an unexpected answer ({type(e).__name__}: {e}): {data!r:.500}"
            ) from e

    # HTTP -----------------------------------------------------------------------------------
    def _request(self, method: str, url: str, body: dict | None = None) -> dict:
        """One call with retries: the JSON answer (a plain-text one as ``{"text": ...}``), or a
        BackendError naming ``url`` when it cannot succeed."""
        attempts = self.max_retries + 1
        last = ""
        for attempt in range(attempts):
            delay = 0.0
            try:
                response = self._client.request(method, url, json=body)
            except httpx.TimeoutException:
                last = f"no answer within the {self.timeout:g}s timeout"
            except httpx.TransportError as e:
                last = f"{type(e).__name__}: {e or 'connection failed'}"
            else:
                if response.status_code < 400:
                    try:
                        return response.json()
                    except ValueError:  # some endpoints (vLLM's adapter loading) answer in plain text
                        return {"text": response.text}
                last = f"HTTP {response.status_code}: {_error_message(response)}"
                if response.status_code not in RETRY_STATUS:
                    raise BackendError(f"{method} {url} failed: {last}")
                delay = _retry_after(response)
            if attempt + 1 < attempts:
                backoff = self.backoff * 2**attempt * random.uniform(0.5, 1.0)
                time.sleep(min(self.max_backoff, delay or backoff))
        raise BackendError(f"{method} {url} failed after {attempts} attempt(s): {last}")

    def close(self) -> None:
        self._client.close()


def _error_message(response: httpx.Response) -> str:
    """The server's error text (OpenAI-style ``{"error": {"message": ...}}``, or the raw body)."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or err)[:500]
        return str(err)[:500]
    return str(body)[:500]


def _retry_after(response: httpx.Response) -> float:
    """Seconds asked for by a ``Retry-After`` header (0.0 when absent or not a number of seconds)."""
    try:
        return max(0.0, float(response.headers.get("retry-after", "")))
    except ValueError:
        return 0.0
