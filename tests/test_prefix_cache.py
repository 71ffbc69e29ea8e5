"""Prompt work the hf backend does not repeat, and grouped-query attention without the KV copy.

Inside ``reuse_prefixes`` (one per debate batch) a prompt starts from the keys and values of the row
it extends, and rows with the same prompt and adapter share one prompt pass; ``sdpa_gqa`` attention
hands SDPA the grouped key/value heads. Each must give what the plain computation gives.
"""

from __future__ import annotations

import pytest
import torch
from rounding import CallLog, assert_same_calls
from transformers import AutoConfig

from udpo.env.backends import ChatRequest, SamplingParams
from udpo.env.backends.decoding import RowKV
from udpo.env.backends.hf import HFBackend, PrefixStore, _Read

pytestmark = pytest.mark.numeric


def row(adapter, tokens, real=None, width=2) -> _Read:
    real = torch.ones(len(tokens), dtype=torch.bool) if real is None else torch.tensor(real)
    return _Read(adapter, list(tokens), RowKV(torch.zeros(1, 2, 1, len(real), width), real))


def test_lookup_takes_the_longest_shared_prefix_of_the_same_adapter():
    store = PrefixStore(max_bytes=1e9)
    store.update([row("a", [1, 2, 3]), row("a", [1, 2, 3, 4, 5]), row("b", [1, 2, 3, 4, 5, 6])], [])

    def found(adapter, prompt):
        hit = store.lookup(adapter, prompt)
        return hit and (hit[0].tokens, hit[1])

    assert found("a", [1, 2, 3, 4, 9]) == ([1, 2, 3, 4, 5], 4)
    assert found("a", [1, 2, 7]) == ([1, 2, 3], 2)  # a tie goes to the row stored first
    assert found("a", [1, 2, 3, 4, 5]) == ([1, 2, 3, 4, 5], 4)  # the last prompt token always runs
    assert found("b", [1, 2, 3]) == ([1, 2, 3, 4, 5, 6], 2)
    assert store.lookup(None, [1, 2, 3]) is None  # the base model's keys differ from an adapter's
    assert store.lookup("a", [9, 1, 2]) is None


def test_store_keeps_one_row_per_sequence_drops_superseded_rows_and_stays_in_budget():
    store = PrefixStore(max_bytes=1e9)
    first = row("a", [1, 2])
    store.update([first, row("a", [1, 2]), row(None, [1, 2])], [])
    assert [(r.adapter, r.tokens) for r in store.rows] == [("a", [1, 2]), (None, [1, 2])]
    longer = row("a", [1, 2, 3, 4])
    store.update([longer], [first])  # ``longer`` read all of ``first``
    assert [(r.adapter, r.tokens) for r in store.rows] == [(None, [1, 2]), ("a", [1, 2, 3, 4])]
    store.max_bytes = longer.kv.nbytes  # room for one row: the oldest goes
    store.update([], [])
    assert len(store.rows) == 1 and store.rows[0] is longer


def test_head_counts_real_columns_only():
    kv = RowKV(torch.arange(6.0).reshape(1, 1, 1, 6, 1), torch.tensor([1, 1, 0, 0, 1, 1], dtype=torch.bool))
    head = kv.head(3)
    assert head.columns == 5 and int(head.real.sum()) == 3
    assert kv.head(2).columns == 2


def debate(backend, sampling, questions, prefix_cache: bool):
    from udpo.env.debate import AgentSpec, DebateConfig, DebateEnv
    from udpo.env.tasks.arithmetic import Arithmetic

    backend.prefix_cache = prefix_cache
    agents = [AgentSpec(adapter=a) for a in (None, "a", "b", "a")]  # two agents share adapter "a"
    config = DebateConfig(n_agents=4, rounds=2, sampling=sampling, agents=agents)
    return DebateEnv(Arithmetic(), backend, config).run(questions, progress=False)


@pytest.fixture(scope="module")
def adapter_backend(tiny_model, tiny_lora_adapters):
    backend = HFBackend(model=tiny_model, dtype="fp32")  # fp32: results compared to 1e-4
    for name, path in tiny_lora_adapters.items():
        backend.load_adapter(name, path)
    yield backend
    backend.close()


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_debate_with_reused_prefixes_equals_whole_prompts(
    adapter_backend, tiny_model, monkeypatch, temperature
):
    """A 3-round debate (agents on the base model and two adapters, two of them on one adapter, so
    round 0 has shared prompts) gives the same tokens and log-probs with the prefix cache as without (to
    rounding: a reused prefix's keys and values meet the rest of the prompt in other sums,
    :func:`rounding.assert_same_calls`), and the cached run did skip the shared prompt work."""
    import udpo.env.backends.hf as hf
    from udpo.env.tasks.arithmetic import Arithmetic

    calls = []

    def spy(*args, **kwargs):
        calls.append((args[1].shape[0], kwargs["prefixes"], kwargs["expand"]))
        return sample(*args, **kwargs)

    sample = hf.sample
    monkeypatch.setattr(hf, "sample", spy)
    draws = CallLog(monkeypatch)
    questions = Arithmetic().load("test", seed=0)[:1]
    sampling = SamplingParams(temperature=temperature, max_tokens=12, seed=5)
    whole = debate(adapter_backend, sampling, questions, prefix_cache=False)
    whole_calls = draws.take_calls()
    assert all(p is None for _, p, _ in calls)
    calls.clear()
    cached = debate(adapter_backend, sampling, questions, prefix_cache=True)
    config = AutoConfig.from_pretrained(tiny_model)
    compared = assert_same_calls(whole_calls, draws.take_calls(), config, torch.float32)
    if compared == len(whole_calls):  # no row parted: every round's prompts are the same
        for w, c in zip(whole, cached, strict=True):
            for w_turns, c_turns in zip(w.turns, c.turns, strict=True):
                assert [t.prompt_ids for t in c_turns] == [t.prompt_ids for t in w_turns]
    (r0_rows, r0_prefixes, r0_expand), *later = calls
    assert r0_prefixes is None and r0_expand is not None and r0_rows == 3  # 4 rows, 3 prompt rows
    for _, prefixes, _ in later:  # rounds 1 and 2 start every prompt from the row it extends
        assert prefixes is not None and all(p is not None for p in prefixes)
    prompt0 = len(cached[0].turns[1][0].prompt_ids)
    assert int(later[0][1][0].real.sum()) >= prompt0  # at least the whole round-0 prompt
    assert adapter_backend.prefixes is None  # the scope ended with the debate batch


def test_loading_an_adapter_empties_the_store(adapter_backend, tiny_lora_adapters):
    adapter_backend.prefix_cache = True
    with adapter_backend.reuse_prefixes():
        adapter_backend.generate(
            [ChatRequest([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=4))]
        )
        assert adapter_backend.prefixes.rows
        adapter_backend.load_adapter("a", tiny_lora_adapters["a"])
        assert adapter_backend.prefixes.rows == []


def test_grouped_sdpa_gives_the_same_logits_as_sdpa(tiny_model):
    """Left-padded prompt pass and a decode step over a static cache, in fp32 and bf16: ``sdpa_gqa``
    equals transformers' ``sdpa`` (which copies the key/value heads first); gradients flow."""
    from transformers import AutoModelForCausalLM, StaticCache

    from udpo.env.backends.attention import NAME, use_grouped_sdpa

    torch.manual_seed(0)
    ids = torch.randint(0, 40000, (4, 20))
    mask = torch.ones(4, 20, dtype=torch.long)
    mask[:2, :7] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    full = torch.cat([mask, torch.ones(4, 2, dtype=torch.long)], 1)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    for dtype in (torch.float32, torch.bfloat16):
        model.to(dtype)
        logits = []
        for grouped in (False, True):
            if grouped:
                use_grouped_sdpa(model)
                assert model.config._attn_implementation == NAME
            else:
                model.set_attn_implementation("sdpa")
            cache = StaticCache(config=model.config, max_cache_len=22)
            with torch.no_grad():
                step0 = model(
                    input_ids=ids, attention_mask=full, position_ids=positions, past_key_values=cache
                )
                step1 = model(
                    input_ids=ids[:, -1:],
                    attention_mask=full,
                    position_ids=positions[:, -1:] + 1,
                    past_key_values=cache,
                )
            logits.append((step0.logits[mask.bool()], step1.logits))
        assert torch.equal(logits[0][0], logits[1][0]) and torch.equal(logits[0][1], logits[1][1])
    model.model.layers[0].self_attn.q_proj.weight.requires_grad_(True)
    model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float().sum().backward()
    assert model.model.layers[0].self_attn.q_proj.weight.grad.abs().sum() > 0
