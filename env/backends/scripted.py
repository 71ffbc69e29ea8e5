"""A deterministic backend for unit tests of logic only (never a stand-in for a real model)."""

from __future__ import annotations

from collections.abc import Callable

from ..progress import report_tokens
from . import backend_capabilities
from .base import Backend, ChatRequest, Completion


class ScriptedBackend(Backend):
    """Answers each request with ``script(request, call_index)``.

    ``script`` may also be a list of strings, used in order (cycled). Every call's batch is kept in
    ``self.calls`` so tests can check how requests were batched.
    """

    name = "scripted"
    capabilities = backend_capabilities(name)

    def __init__(self, script: Callable[[ChatRequest, int], str] | list[str]):
        self._script = script
        self._n = 0
        self.calls: list[list[ChatRequest]] = []
        self._adapters: dict[str, str] = {}

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        self.calls.append(list(requests))
        out = []
        for req in requests:
            if callable(self._script):
                text = self._script(req, self._n)
            else:
                text = self._script[self._n % len(self._script)]
            self._n += 1
            ids = [ord(c) % 256 for c in text]
            out.append(Completion(text=text, prompt_ids=[], completion_ids=ids, logprobs=[0.0] * len(ids)))
        report_tokens(sum(len(c.completion_ids) for c in out))
        return out

    def load_adapter(self, name: str, path: str) -> None:
        self._adapters[name] = path

    @property
    def adapters(self) -> list[str]:
        return list(self._adapters)
