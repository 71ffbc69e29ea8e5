"""The hf backend's sampling loop (udpo.env.backends.decoding) on a tiny random Llama, in fp32.

Row adapters against PEFT's own per-row dispatch, finished rows leaving the batch against keeping them,
the draw against the distribution it samples, nucleus truncation, and the stop/length bookkeeping.
"""

from __future__ import annotations

import pytest
import torch
from rounding import DrawLog, assert_same_samples, call_columns, logit_bound, logprob_bound, max_abs
from tiny_models import tiny_team_with_distinct_adapters

from udpo.env.backends import decoding
from udpo.env.backends.decoding import _draw, sample
from udpo.env.backends.stacked import StackedAdapters
from udpo.training.policy import MultiAgentPolicy

pytestmark = pytest.mark.numeric


@pytest.fixture(scope="module")
def policy(tokenizer_path, tmp_path_factory) -> MultiAgentPolicy:
    """fp32: the sampling tests compare tokens and log-probs to 1e-5, below bf16's resolution."""
    return tiny_team_with_distinct_adapters(tmp_path_factory.mktemp("tiny"), tokenizer_path)


@pytest.fixture(scope="module")
def bf16_policy(tokenizer_path, tmp_path_factory) -> MultiAgentPolicy:
    return tiny_team_with_distinct_adapters(tmp_path_factory.mktemp("tiny_bf16"), tokenizer_path, "bf16")


def batch(policy, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded rows of random token ids of the given lengths."""
    gen = torch.Generator().manual_seed(0)
    width = max(lengths)
    ids = torch.randint(10, 1000, (len(lengths), width), generator=gen)
    attention = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, : width - n] = policy.tokenizer.pad_token_id
        attention[row, width - n :] = 1
    return ids, attention


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_row_adapters_give_the_logits_of_peft_per_row_dispatch(request, dtype):
    """The eager loop's row adapters (only the call's adapters stacked, agent_1 left out; rows leaving
    the batch), on both numeric paths, to the rounding of the dtype (:func:`rounding.logit_bound`)."""
    policy = request.getfixturevalue("policy" if dtype == "fp32" else "bf16_policy")
    model = policy.models[policy.base_model]
    names = ["agent_0", None, "agent_2", None, "agent_0"]
    ids, attention = batch(policy, [5, 9, 7, 9, 3])
    assert StackedAdapters.supported(model, names)
    stack = StackedAdapters(model, capacity=len(names), names=names)
    assert stack.names == ["agent_0", "agent_2"]
    stack.select(stack.slots(names))
    with torch.no_grad():
        expected = model(
            input_ids=ids, attention_mask=attention, adapter_names=[n or "__base__" for n in names]
        )
        with stack:
            got = model(input_ids=ids, attention_mask=attention)
            keep = torch.tensor([4, 1, 2])  # rows leaving the batch: the others keep their adapters
            stack.keep(keep)
            kept = model(input_ids=ids[keep], attention_mask=attention[keep])
        after = model(input_ids=ids, attention_mask=attention)  # the layers' own forward is back
    tolerance = logit_bound(model.config, expected.logits.dtype, max_abs(expected.logits))
    assert (got.logits - expected.logits).abs().max().item() <= tolerance
    assert (kept.logits - expected.logits[keep]).abs().max().item() <= tolerance
    assert (got.logits - after.logits).abs().max().item() > tolerance  # the active adapter alone differs


def test_finished_rows_leaving_the_batch_change_nothing(policy, monkeypatch):
    model = policy.models[policy.base_model]
    ids, attention = batch(policy, [4, 8, 6, 8])
    first = model(input_ids=ids[:1], attention_mask=attention[:1]).logits[0, -1]
    stops = set(first.topk(200).indices.tolist())  # likely tokens end rows early, at different steps
    names = ["agent_0", "agent_1", None, "agent_2"]

    draws = DrawLog(monkeypatch, decoding)

    def run(share: float):
        monkeypatch.setattr(decoding, "COMPACT_SHARE", share)
        rows = sample(model, ids, attention, max_new_tokens=12, temperature=0.0, top_p=1.0, stops=stops,
                      adapters=names)  # fmt: skip
        return rows, draws.take()

    (kept, kept_draws), (dropped, dropped_draws) = run(2.0), run(0.0)  # never / at every finished row
    assert {r.finish_reason for r in kept} == {"stop", "length"}  # rows end at different times
    # other batch shapes sum in another order: greedy tokens equal unless the top-2 gap is within rounding
    columns = call_columns(ids, 12)
    assert_same_samples(kept, dropped, kept_draws, dropped_draws, model.config, model.dtype, columns)
    for a in kept:
        assert len(a.tokens) == len(a.logprobs) and (a.finish_reason == "length") == (
            a.tokens[-1] not in stops
        )


def test_sampled_logprobs_are_those_of_a_forward_pass_at_the_temperature(policy):
    model = policy.models[policy.base_model]
    ids, attention = batch(policy, [6])
    torch.manual_seed(3)
    row = sample(model, ids, attention, max_new_tokens=6, temperature=0.7, top_p=1.0, stops=set(),
                 adapters=["agent_1"])[0]  # fmt: skip
    full = torch.cat([ids[0], torch.tensor(row.tokens)])[None]
    with torch.no_grad():
        logits = model(input_ids=full, adapter_names=["agent_1"]).logits[0, ids.shape[1] - 1 : -1]
    expected = torch.log_softmax(logits / 0.7, -1).gather(-1, torch.tensor(row.tokens)[:, None]).squeeze(-1)
    # a KV-cache loop against one pass over the whole sequence: the same sums in another order
    difference = logit_bound(model.config, model.dtype, max_abs(logits), columns=full.shape[1])
    assert row.logprobs == pytest.approx(expected.tolist(), abs=logprob_bound(difference, 0.7))
    assert row.finish_reason == "length" and len(row.tokens) == 6


def test_the_draw_follows_the_distribution_and_the_nucleus():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -30.0]).repeat(40_000, 1)
    torch.manual_seed(0)
    token, logp = _draw(logits, temperature=0.5, top_p=1.0)
    expected = torch.softmax(logits[0] / 0.5, -1)
    freq = torch.bincount(token, minlength=5).double() / len(token)
    assert torch.allclose(freq, expected.double(), atol=0.01)  # 4 sigma of 40,000 draws is ~0.01
    # log-probs ignore the nucleus (log of softmax against log_softmax: torch.testing's fp32 tolerance)
    torch.testing.assert_close(logp, torch.log(expected)[token])
    # top_p 0.9 at temperature 1: tokens 0 and 1 hold 0.87 < 0.9, so token 2 stays and 3, 4 go
    token, _ = _draw(logits, temperature=1.0, top_p=0.9)
    kept = torch.softmax(logits[0], -1)[:3]
    freq = torch.bincount(token, minlength=5).double() / len(token)
    assert freq[3:].sum() == 0 and torch.allclose(freq[:3], (kept / kept.sum()).double(), atol=0.01)
    token, logp = _draw(logits[:3], temperature=0.0, top_p=1.0)  # greedy: temperature-1 log-probs
    assert token.tolist() == [0, 0, 0]
    torch.testing.assert_close(logp, torch.log_softmax(logits[0], -1)[0].expand(3))
