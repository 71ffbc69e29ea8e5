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
and uniforms a loop drew from; :func:`assert_same_samples` requires equal tokens wherever the draw (or,
greedy, the top-2 gap) is farther than the bound from a boundary, log-probs within the bound, and
lets the rows part only at a draw that is not.
"""

from __future__ import annotations

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


def max_abs(t) -> float:
    return torch.as_tensor(t).abs().max().item()


@dataclass
class Draw:
    """One step of a decode loop's draw: the logits of every row of the call (fp32, as drawn), the
    sampling settings, and the uniforms (None: greedy)."""

    logits: torch.Tensor
    temperature: float
    top_p: float
    uniforms: torch.Tensor | None


class DrawLog:
    """Records every draw of the decode modules given (their ``_draw``, patched with ``monkeypatch``).
    Record only a loop that keeps every row of the call in its batch (the stacked loop; the eager loop
    with ``COMPACT_SHARE`` > 1; a call of one row), so that row r of each step is row r of the call."""

    def __init__(self, monkeypatch, *modules) -> None:
        self.draws: list[Draw] = []
        self.on = True
        for module in modules:
            monkeypatch.setattr(module, "_draw", self._wrap(module._draw))

    def _wrap(self, draw):
        def recording(logits, temperature, top_p, uniforms=None):
            if self.on:
                u = None if uniforms is None else uniforms.clone()
                self.draws.append(Draw(logits.detach().clone(), temperature, top_p, u))
            return draw(logits, temperature, top_p, uniforms)

        return recording

    def take(self) -> list[Draw]:
        """The draws recorded since the last take."""
        draws, self.draws = self.draws, []
        return draws


def near_a_boundary(draw: Draw, logit_difference: float) -> torch.Tensor:
    """Per row: could the drawn token change if every logit moved by up to ``logit_difference``?

    Greedy: the top-2 gap is within twice it. Sampled: each probability moves by a factor of at most
    e^(2d/T) and their normalized cumulative sums by at most e^(4d/T) - 1 =: s; the draw u picks token k
    with cdf[k-1] <= u < cdf[k], so it cannot change while both edges are farther than s from u. With a
    nucleus, the tokens whose higher-ranked mass lies within s of top_p may enter or leave it, moving
    the normalized cdf by at most twice their mass over what stays."""
    z = draw.logits.float()
    if draw.temperature <= 0:
        top2 = z.topk(2, dim=-1).values
        return top2[:, 0] - top2[:, 1] <= 2 * logit_difference
    p = torch.softmax(z / draw.temperature, dim=-1)
    slack = torch.full((len(z),), torch.expm1(torch.tensor(4 * logit_difference / draw.temperature)).item())
    weights = p
    if draw.top_p < 1:
        sorted_p, order = p.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p
        unsure = ((before - draw.top_p).abs() <= slack[:, None]).float()
        moving = (sorted_p * unsure).sum(-1)
        kept = sorted_p.masked_fill(before >= draw.top_p, 0.0)
        weights = torch.zeros_like(p).scatter(-1, order, kept)
        slack = slack + 2 * moving / (weights.sum(-1) - moving).clamp(min=1e-30)
    cdf = weights.cumsum(-1)
    cdf = cdf / cdf[:, -1:]
    u = draw.uniforms.reshape(-1, 1).float()
    k = torch.searchsorted(cdf, u).clamp(max=cdf.shape[-1] - 1)
    upper = cdf.gather(-1, k).squeeze(-1)
    lower = torch.where(k > 0, cdf.gather(-1, (k - 1).clamp(min=0)), torch.zeros_like(u)).squeeze(-1)
    u = u.squeeze(-1)
    return torch.minimum(u - lower, upper - u) <= slack


def assert_same_samples(
    expected, got, draws: list[Draw], config, dtype: torch.dtype, columns: int
) -> set[int]:
    """Two decode loops' rows (``Sampled`` or ``Completion``: ``tokens`` or ``completion_ids``, and
    ``logprobs``) for the same call and uniforms, ``draws`` recorded from one of them. Row by row, step by
    step: where the tokens agree their log-probs lie within the bound (:func:`logprob_bound` of
    :func:`logit_bound`); where they part, the draw lay within the bound of a boundary, and the row is
    compared no further (its contexts differ from there). A row that never parts ends alike.

    Returns the rows that parted (a later call whose prompts follow from them is then not the same
    call). At least half of all tokens must have been compared: a bound so loose that most draws
    look ambiguous would prove nothing."""
    parted: set[int] = set()
    compared, total = 0, 0
    for r, (e, g) in enumerate(zip(expected, got, strict=True)):
        e_tokens, g_tokens = _tokens(e), _tokens(g)
        total += len(e_tokens)
        for step, (a, b) in enumerate(zip(e_tokens, g_tokens, strict=False)):
            draw = draws[step]
            difference = logit_bound(config, dtype, max_abs(draw.logits[r]), columns)
            if a != b:
                assert near_a_boundary(draw, difference)[r], (
                    r,
                    step,
                    a,
                    b,
                )  # a real difference, not rounding
                parted.add(r)
                break
            bound = logprob_bound(difference, draw.temperature)
            assert g.logprobs[step] == pytest.approx(e.logprobs[step], abs=bound), (r, step)
            compared += 1
        else:
            assert len(g_tokens) == len(e_tokens), r
            assert getattr(g, "finish_reason", None) == getattr(e, "finish_reason", None), r
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


def assert_same_calls(expected: list[Call], got: list[Call], drawn: list[Call], config, dtype) -> int:
    """Two runs of the same sequence of decode calls (``drawn``: the run whose loop kept every row, one
    of the two): :func:`assert_same_samples` call by call, up to and including the first call where a
    row parted (the prompts of later calls follow from it). Returns the number of calls compared."""
    assert len(expected) == len(got) == len(drawn)
    for k, (e, g, d) in enumerate(zip(expected, got, drawn, strict=True)):
        if assert_same_samples(e.rows, g.rows, d.draws, config, dtype, d.columns):
            return k + 1
    return len(expected)
