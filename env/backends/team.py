"""One backend for a heterogeneous team: each request goes to the backend of its base model."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

from .base import Backend, BackendError, Capabilities, ChatRequest, Completion, ScoreRequest


class TeamBackend(Backend):
    """Routes each request to the backend of its ``model`` (a heterogeneous team's base model name);
    requests with ``model=None`` go to the first backend."""

    name = "team"

    def __init__(self, backends: dict[str, Backend]):
        if not backends:
            raise ValueError("TeamBackend needs at least one backend")
        self.backends = backends
        members = [b.capabilities for b in backends.values()]
        self.capabilities = Capabilities(
            serves_live_model=all(c.serves_live_model for c in members),
            returns_logits=all(c.returns_logits for c in members),
            serves_several_models=True,
        )

    def generate(self, requests: list[ChatRequest]) -> list[Completion]:
        return self._routed(requests, lambda backend, rows: backend.generate(rows))

    def token_entropies(self, requests: list[ScoreRequest]) -> list[list[float]]:
        return self._routed(requests, lambda backend, rows: backend.token_entropies(rows))

    def _routed(self, requests: list, call: Callable[[Backend, list], list]) -> list:
        """``call(backend, its requests)`` once per base model; results back in request order."""
        first = next(iter(self.backends))
        groups: dict[str, list[int]] = {}
        for k, r in enumerate(requests):
            model = r.model or first
            if model not in self.backends:
                raise BackendError(f"no backend serves model {model!r} (serving: {sorted(self.backends)})")
            groups.setdefault(model, []).append(k)
        out: list = [None] * len(requests)
        for model, idx in groups.items():
            for k, c in zip(idx, call(self.backends[model], [requests[k] for k in idx]), strict=True):
                out[k] = c
        return out

    @property
    def adapters(self) -> list[str]:
        return sorted({a for b in self.backends.values() for a in b.adapters})

    def load_adapter(self, name: str, path: str) -> None:
        """Load into every backend whose model already serves ``name`` (else into all of them)."""
        owners = [b for b in self.backends.values() if name in b.adapters] or list(self.backends.values())
        for b in owners:
            b.load_adapter(name, path)

    @contextmanager
    def reuse_prefixes(self) -> Iterator[None]:
        with ExitStack() as stack:
            for b in self.backends.values():
                stack.enter_context(b.reuse_prefixes())
            yield

    def close(self) -> None:
        for b in self.backends.values():
            b.close()
