"""How far two computations of the same numbers may differ when they sum in another order (other kernels,
threads, batch shapes), and how to compare what two decode loops sample without depending on it.

**The bound.** A sum of K products computed in floating point lies within gamma_K ~ K u of the exact
one, relative to the magnitude of its terms (u: the dtype's unit roundoff, half its epsilon; Higham,
*Accuracy and Stability of Numerical Algorithms*, sec. 3.1). Two orders of summation therefore differ
by at most about K u of that magnitude; through ``depth`` such sums in series the differences add (to
first order). :func:`rounding_bound` is that product; :func:`logit_bound` reads K (the model's longest
reduction: its MLP width, or the attention's columns) and the depth (its layers) from the model's config,
and takes the logits' largest magnitude. It is a worst case, not a fit: measured differences lie well
inside it on every kernel this project has met (docs/testing.md, "Other CPUs' kernels").

**Sampled tokens.** Two loops fed the same uniform draws sample the same token only while no draw lies
within their rounding difference of a boundary between two tokens. :class:`DrawLog` records the logits
and uniforms each loop drew from; :func:`assert_same_samples` requires, step by step, the same uniforms
and logit vectors within the bound (the same distribution), equal tokens wherever the draw (or, greedy,
the top-2 gap) is farther than the bound from a boundary, and lets the rows part only at a draw that
is not.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch


def unit_roundoff(dtype: torch.dtype) -> float:
    """u: the largest relative error of rounding one real number to ``dtype`` (half its epsilon)."""
    return torch.finfo(dtype).eps / 2


def rounding_bound(dtype: torch.dtype, magnitude: float, reduction: int, depth: int = 1) -> float:
    """``depth * reduction * u * magnitude``: how far two orders of ``depth`` chained sums of ``reduction``
    terms of size ``magnitude`` may differ (gamma_K = K u per sum, the sums' differences adding)."""
    return depth * reduction * unit_roundoff(dtype) * magnitude


def logit_bound(config, dtype: torch.dtype, magnitude: float, columns: int = 0) -> float:
    """Two computations of one model's logits (``config``: its transformers config, ``dtype``: the dtype
    it runs in) over at most ``columns`` key/value positions, at largest magnitude ``magnitude``."""
    reduction = max(config.intermediate_size, config.hidden_size, columns)
    return rounding_bound(dtype, magnitude, reduction, depth=config.num_hidden_layers)


def logprob_bound(logit_difference: float, temperature: float = 1.0) -> float:
    """log_softmax(z / T) moves by at most 2 |dz| / T (z itself and its log-sum-exp, each by |dz| / T);
    the log-softmax is the same fp32 kernel over each row in both computations (the vocabulary's order)."""
    return 2 * logit_difference / (temperature if temperature > 0 else 1.0)


def entropy_bound(logit_difference: float, vocabulary: int) -> float:
    """The entropy H = -sum p log p moves by at most 2 |dz| H <= 2 |dz| log V: dH/dz_j = -p_j (log p_j + H),
    and sum_j p_j |log p_j + H| <= 2 H."""
    return 2 * logit_difference * math.log(vocabulary)


def max_abs(t) -> float:
    return torch.as_tensor(t).abs().max().item()


def scored_bound(model, sequences, temperature: float = 1.0) -> float:
    """How far log-probs of token ``sequences`` scored by ``model`` two ways (batched or alone, padded or
    not, cached or whole) may differ: :func:`logprob_bound` of :func:`logit_bound` at their largest logit
    and longest sequence."""
    with torch.no_grad():
        magnitude = max(max_abs(model(input_ids=torch.tensor([list(s)])).logits) for s in sequences)
    columns = max(len(s) for s in sequences)
    return logprob_bound(logit_bound(model.config, model.dtype, magnitude, columns), temperature)


@dataclass
class Draw:
    """One step of a decode loop's draw: the logits of the rows still in its batch (fp32, as drawn), the
    call's row of each (``rows``), the sampling settings, and the uniforms (None: greedy)."""

    logits: torch.Tensor
    rows: torch.Tensor
    temperature: float
    top_p: float
    uniforms: torch.Tensor | None

    def of(self, row: int) -> Draw | None:
        """This step for one row of the call (None: the row had left the batch)."""
        at = (self.rows == row).nonzero().flatten()
        if len(at) == 0:
            return None
        u = None if self.uniforms is None else self.uniforms[at]
        return Draw(self.logits[at], self.rows[at], self.temperature, self.top_p, u)


class DrawLog:
    """Records every draw of the decode modules given (``decoding``, ``static_decode``: their ``_draw``
    and ``_uniforms``, patched with ``monkeypatch``), with the call's row of each batch row (the eager loop
    passes the rows still in its batch to ``_uniforms``; the stacked loop keeps all of them)."""

    def __init__(self, monkeypatch, *modules) -> None:
        self.draws: list[Draw] = []
        self.on = True
        self._live: torch.Tensor | None = None
        for module in modules:
            monkeypatch.setattr(module, "_uniforms", self._wrap_uniforms(module._uniforms))
            monkeypatch.setattr(module, "_draw", self._wrap_draw(module._draw))

    def _wrap_uniforms(self, uniforms):
        def recording(temperature, rows, device, live=None):
            self._live = live
            return uniforms(temperature, rows, device, live)

        return recording

    def _wrap_draw(self, draw):
        def recording(logits, temperature, top_p, uniforms=None):
            if self.on:
                rows = torch.arange(len(logits)) if self._live is None else self._live.cpu()
                u = None if uniforms is None else uniforms.detach().cpu().clone()
                self.draws.append(Draw(logits.detach().cpu().clone(), rows, temperature, top_p, u))
            self._live = None
            return draw(logits, temperature, top_p, uniforms)

        return recording

    def take(self) -> list[Draw]:
        """The draws recorded since the last take."""
        draws, self.draws = self.draws, []
        return draws


def near_a_boundary(draw: Draw, logit_difference: float) -> torch.Tensor:
    """Per row: could the drawn token change if every logit moved by up to ``logit_difference`` (d)?

    Greedy: the top-2 gap is within 2d. Sampled: with every logit moved by at most d, the normalized
    cumulative sum up to a token, c = a / (a + b), moves by at most tanh(d / T) / 2 < d / (2T) (the
    worst case lifts a and lowers b by e^(d/T)), so the draw u, which picks the token k with c[k-1] <= u
    < c[k], cannot change while both edges are farther than that from u. With a nucleus, the tokens whose
    higher-ranked mass lies within that of top_p may enter or leave it, moving c by at most twice their
    mass over what stays."""
    z = draw.logits.float()
    if draw.temperature <= 0:
        top2 = z.topk(2, dim=-1).values
        return top2[:, 0] - top2[:, 1] <= 2 * logit_difference
    p = torch.softmax(z / draw.temperature, dim=-1)
    slack = torch.full((len(z),), logit_difference / (2 * draw.temperature))
    weights = p
    if draw.top_p < 1:
        sorted_p, order = p.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p
        moving = (sorted_p * ((before - draw.top_p).abs() <= slack[:, None])).sum(-1)
        weights = torch.zeros_like(p).scatter(-1, order, sorted_p.masked_fill(before >= draw.top_p, 0.0))
        slack = slack + 2 * moving / (weights.sum(-1) - moving).clamp(min=1e-30)
    cdf = weights.cumsum(-1)
    cdf = cdf / cdf[:, -1:]
    u = draw.uniforms.reshape(-1, 1).float()
    k = torch.searchsorted(cdf, u).clamp(max=cdf.shape[-1] - 1)
    upper = cdf.gather(-1, k).squeeze(-1)
    lower = torch.where(k > 0, cdf.gather(-1, (k - 1).clamp(min=0)), torch.zeros_like(u)).squeeze(-1)
    u = u.squeeze(-1)
    return torch.minimum(u - lower, upper - u) <= slack


def steps_of(draws: list[Draw], row: int) -> list[Draw | None]:
    """One row's draws, step by step (None once it left the batch)."""
    return [d.of(row) for d in draws]


def assert_same_row(
    expected, got, expected_steps, got_steps, config, dtype, columns: int
) -> tuple[bool, int]:
    """One row of two decode loops for the same call and uniforms (``Sampled`` or ``Completion``, and
    each loop's :meth:`Draw.of` that row, step by step). While their tokens agree (the same context):
    at every step the whole logit vector lies within :func:`logit_bound` of the other loop's and the
    uniforms are equal, so both drew from the same distribution to rounding with the same number; the
    log-probs lie within :func:`logprob_bound`. Where the tokens part, the draw lay within the bound of a
    boundary, and the row is compared no further (its contexts differ from there). A row that never
    parts ends alike. Returns (whether it parted, the steps compared)."""
    e_tokens, g_tokens = _tokens(expected), _tokens(got)
    for step, (a, b) in enumerate(zip(e_tokens, g_tokens, strict=False)):
        e, g = expected_steps[step], got_steps[step]
        difference = logit_bound(config, dtype, max_abs(e.logits), columns)
        assert (g.logits - e.logits).abs().max().item() <= difference, step  # the distribution drawn from
        assert (e.uniforms is None) == (g.uniforms is None) and (
            e.uniforms is None or torch.equal(e.uniforms, g.uniforms)
        )
        if a != b:
            assert near_a_boundary(e, difference).item(), (step, a, b)  # a real difference, not rounding
            return True, step
        bound = logprob_bound(difference, e.temperature)
        assert got.logprobs[step] == pytest.approx(expected.logprobs[step], abs=bound), step
    assert len(g_tokens) == len(e_tokens)
    assert getattr(got, "finish_reason", None) == getattr(expected, "finish_reason", None)
    return False, len(e_tokens)


def assert_same_samples(
    expected, got, expected_draws: list[Draw], got_draws: list[Draw], config, dtype: torch.dtype, columns: int
) -> set[int]:
    """Every row of two decode loops' results for the same call (:func:`assert_same_row`, the draws
    each recorded with a :class:`DrawLog`); returns the rows that parted (a later call whose prompts
    follow from them is then not the same call). At least half of all tokens are compared."""
    parted: set[int] = set()
    compared, total = 0, 0
    for r, (e, g) in enumerate(zip(expected, got, strict=True)):
        e_steps, g_steps = steps_of(expected_draws, r), steps_of(got_draws, r)
        row_parted, steps = assert_same_row(e, g, e_steps, g_steps, config, dtype, columns)
        if row_parted:
            parted.add(r)
        compared, total = compared + steps, total + len(_tokens(e))
    assert compared >= total / 2, (compared, total)
    return parted


def _tokens(row) -> list[int]:
    return row.tokens if hasattr(row, "tokens") else row.completion_ids


def call_columns(input_ids: torch.Tensor, max_new_tokens: int, prefixes=None) -> int:
    """The key/value columns of a decode call: reused prefixes, prompts and answers (its longest
    attention sum)."""
    before = max((p.columns for p in prefixes or () if p is not None), default=0)
    return before + input_ids.shape[1] + max_new_tokens


@dataclass
class Call:
    """One call of the hf backend's decode path: its rows (``Sampled``), draws and columns."""

    rows: list
    draws: list[Draw]
    columns: int


class CallLog(DrawLog):
    """The draws of both decode loops, call by call of ``HFBackend._sample`` (:attr:`calls`)."""

    def __init__(self, monkeypatch) -> None:
        from udpo.env.backends import decoding, static_decode
        from udpo.env.backends.hf import HFBackend

        super().__init__(monkeypatch, decoding, static_decode)
        self.calls: list[Call] = []
        sample = HFBackend._sample

        def recording(backend, input_ids, attention, **kwargs):
            self.take()
            rows = sample(backend, input_ids, attention, **kwargs)
            columns = call_columns(input_ids, kwargs["max_new_tokens"], kwargs.get("prefixes"))
            self.calls.append(Call(rows, self.take(), columns))
            return rows

        monkeypatch.setattr(HFBackend, "_sample", recording)

    def take_calls(self) -> list[Call]:
        calls, self.calls = self.calls, []
        return calls


def assert_same_calls(expected: list[Call], got: list[Call], config, dtype) -> int:
    """Two runs of the same sequence of decode calls: :func:`assert_same_samples` call by call, up to and
    including the first call where a row parted (the prompts of later calls follow from it). Returns
    the number of calls compared."""
    assert len(expected) == len(got)
    for k, (e, g) in enumerate(zip(expected, got, strict=True)):
        if assert_same_samples(e.rows, g.rows, e.draws, g.draws, config, dtype, max(e.columns, g.columns)):
            return k + 1
    return len(expected)
