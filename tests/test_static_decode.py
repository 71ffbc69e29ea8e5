"""The hf backend's stacked decode path (udpo.env.backends.static_decode, .stacked) against the eager loop,
on a tiny random Llama with three random adapters, in fp32.

Same seed, same uniforms: the eager loop drops finished rows and draws for the rows left; the stacked
path keeps every row in a fixed, padded batch; both read one uniform per row of the call per step. Their
logits differ by rounding (other batch shapes, other kernels), so their tokens are equal wherever a
draw lies farther than that from a boundary between tokens and their log-probs equal to the bound
(:func:`rounding.assert_same_samples`, on the stacked loop's recorded draws). The buffers and stacked
adapters are reused across calls and see adapter updates made in place; graph capture needs CUDA and is
skipped without it.
"""

from __future__ import annotations

import pytest
import torch
from rounding import (
    CallLog,
    DrawLog,
    assert_same_calls,
    assert_same_samples,
    call_columns,
    logit_bound,
    max_abs,
)
from tiny_models import tiny_team_with_distinct_adapters
from transformers import AutoConfig

from udpo.env.backends import decoding, static_decode
from udpo.env.backends.hf import HFBackend
from udpo.env.backends.machine import pick_decode
from udpo.env.backends.stacked import StackedAdapters
from udpo.env.backends.static_decode import StaticDecoder, bucket
from udpo.training.policy import MultiAgentPolicy

pytestmark = pytest.mark.numeric

NAMES = ["agent_0", None, "agent_2", "agent_1", "agent_0", "agent_2", None]


@pytest.fixture(scope="module")
def policy(tokenizer_path, tmp_path_factory) -> MultiAgentPolicy:
    """fp32: the decode tests compare log-probs to fp32's rounding bound, far below bf16's resolution."""
    return tiny_team_with_distinct_adapters(tmp_path_factory.mktemp("tiny"), tokenizer_path)


@pytest.fixture(scope="module")
def bf16_policy(tokenizer_path, tmp_path_factory) -> MultiAgentPolicy:
    return tiny_team_with_distinct_adapters(tmp_path_factory.mktemp("tiny_bf16"), tokenizer_path, "bf16")


def batch(pad: int, lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded rows of random token ids of the given lengths."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.randint(10, 1000, (len(lengths), width), generator=gen)
    attention = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, : width - n] = pad
        attention[row, width - n :] = 1
    return ids, attention


@pytest.fixture
def draws(monkeypatch) -> DrawLog:
    """Both loops' draws."""
    return DrawLog(monkeypatch, decoding, static_decode)


def both(model, decoder: StaticDecoder, draws: DrawLog, seed: int, **kwargs):
    """The eager loop's and the decoder's rows for the same call and seed, their draws, the model and the
    call's columns: the arguments of :func:`assert_same`."""
    draws.take()
    torch.manual_seed(seed)
    eager = decoding.sample(model, **kwargs)
    eager_draws = draws.take()
    torch.manual_seed(seed)
    stacked = decoder.sample(**kwargs)
    columns = call_columns(kwargs["input_ids"], kwargs["max_new_tokens"], kwargs.get("prefixes"))
    return eager, stacked, eager_draws, draws.take(), model, columns


def assert_same(eager, stacked, eager_draws, stacked_draws, model, columns) -> set[int]:
    """The same distributions, uniforms, tokens and log-probs up to rounding
    (:func:`rounding.assert_same_samples`); the rows that parted at a draw within rounding of a boundary."""
    return assert_same_samples(eager, stacked, eager_draws, stacked_draws, model.config, model.dtype, columns)


def counting_backend(graphs: list, runs: list | None = None, through: str | None = None):
    """A ``torch.compile`` backend that records each graph dynamo hands it and runs it uncompiled, or
    compiled by the backend ``through`` names ("aot_eager": AOTAutograd's decomposed, functionalized
    graph, the front end inductor compiles); each run of a graph appended to ``runs``: its index in
    ``graphs``."""
    from torch._dynamo.backends.registry import lookup_backend

    def count(graph, inputs):
        graphs.append(graph)
        index = len(graphs) - 1
        run = graph.forward if through is None else lookup_backend(through)(graph, inputs)

        def forward(*args):
            if runs is not None:
                runs.append(index)
            return run(*args)

        return forward

    return count


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_stacked_adapters_give_the_logits_of_peft_per_row_dispatch(request, dtype):
    """On both numeric paths, to the rounding of the dtype: the two sum the LoRA terms in another order
    (:func:`rounding.logit_bound`: 6.7e-5 in fp32, 4.4 in bf16; every adapter moves its rows by more, 9.7)."""
    policy = request.getfixturevalue("policy" if dtype == "fp32" else "bf16_policy")
    model = policy.models[policy.base_model]
    ids, attention = batch(policy.tokenizer.pad_token_id, [5, 9, 7, 9, 3, 6, 8])
    assert StackedAdapters.supported(model)
    stack = StackedAdapters(model)
    assert stack.names == ["agent_0", "agent_1", "agent_2"]
    stack.select(stack.slots(NAMES), capacity=12)  # padding rows past the batch run the base model
    with torch.no_grad():
        expected = model(
            input_ids=ids, attention_mask=attention, adapter_names=[n or "__base__" for n in NAMES]
        ).logits
        with stack:
            got = model(input_ids=ids, attention_mask=attention).logits
        base = model(input_ids=ids, attention_mask=attention, adapter_names=["__base__"] * len(NAMES)).logits
    tolerance = logit_bound(model.config, expected.dtype, max_abs(expected))
    assert (got - expected).abs().max().item() <= tolerance
    differs = [(expected[r] - base[r]).abs().max().item() > tolerance for r in range(len(NAMES))]
    assert differs == [n is not None for n in NAMES]  # the adapters are not the identity


@pytest.mark.parametrize(("temperature", "top_p"), [(0.0, 1.0), (1.0, 1.0), (0.8, 0.9)])
def test_stacked_decoding_samples_the_eager_loops_tokens(policy, draws, temperature, top_p):
    """Mixed adapters and prompt lengths, rows stopping at different steps (the eager loop compacts its
    batch; the stacked one pads 7 rows to 8 and keeps them): the same tokens and log-probs."""
    model = policy.models[policy.base_model]
    ids, attention = batch(policy.tokenizer.pad_token_id, [4, 8, 6, 8, 3, 7, 5])
    with torch.no_grad():
        first = model(input_ids=ids, attention_mask=attention).logits[:, -1].mean(0)
    stops = set(first.topk(1500).indices.tolist())  # likely tokens end rows early, at different steps
    decoder = StaticDecoder(model)
    reported: list[int] = []  # progress: tokens sampled, reported by both loops
    eager, stacked, *numerics = both(
        model, decoder, draws, seed=11, input_ids=ids, attention=attention, max_new_tokens=20,
        temperature=temperature, top_p=top_p, stops=stops, adapters=NAMES, on_tokens=reported.append,
    )  # fmt: skip
    lengths = {len(r.tokens) for r in eager}
    assert len(lengths) > 1 and {r.finish_reason for r in eager} == {"stop", "length"}
    assert_same(eager, stacked, *numerics)
    assert sum(reported) == 2 * sum(len(r.tokens) for r in eager)


def test_shared_prompts_reused_prefixes_and_kept_kv_match_the_eager_loop(policy, draws):
    """Rows sharing a prompt (``expand``), rows starting from earlier keys and values (``prefixes``)
    and the keys and values kept for later calls (``keep_kv``)."""
    model = policy.models[policy.base_model]
    pad = policy.tokenizer.pad_token_id
    ids, attention = batch(pad, [6, 9, 4])
    adapters = ["agent_1", None, "agent_2"]
    decoder = StaticDecoder(model)
    kwargs = dict(max_new_tokens=6, temperature=0.9, top_p=1.0, stops=set(), keep_kv=True)
    expand = torch.tensor([0, 0, 1, 2, 2])
    eager, stacked, *numerics = both(model, decoder, draws, 3, input_ids=ids, attention=attention,
                                     adapters=adapters, expand=expand, **kwargs)  # fmt: skip
    parted = assert_same(eager, stacked, *numerics)
    for r, (e, s) in enumerate(zip(eager, stacked, strict=True)):
        if r not in parted:  # keys and values: outputs of the layers, to the logits' rounding bound
            bound = logit_bound(model.config, model.dtype, max_abs(e.kv.kv), columns=numerics[-1])
            assert torch.equal(s.kv.real, e.kv.real) and (s.kv.kv - e.kv.kv).abs().max() <= bound
    more, more_attention = batch(pad, [5, 3, 7], seed=1)  # each prompt continues a row above
    prefixes = [eager[0].kv, eager[2].kv, eager[4].kv]
    assert_same(*both(model, decoder, draws, 4, input_ids=more, attention=more_attention, adapters=adapters,
                      prefixes=prefixes, **kwargs))  # fmt: skip


def test_buffers_are_reused_and_adapter_updates_reach_them(policy, draws):
    """Calls of nearby sizes share one bucket's buffers; an optimizer-like in-place update of the adapters
    is copied into the same stacked buffers (no new storage), and decoding follows it."""
    model = policy.models[policy.base_model]
    pad = policy.tokenizer.pad_token_id
    decoder = StaticDecoder(model)
    kwargs = dict(max_new_tokens=5, temperature=1.0, top_p=1.0, stops=set(), adapters=NAMES[:6])
    ids, attention = batch(pad, [4, 6, 5, 6, 3, 6])
    assert_same(*both(model, decoder, draws, 1, input_ids=ids, attention=attention, **kwargs))
    (shape, buffers), stack = next(iter(decoder.buffers.items())), decoder.stack
    pointers = [s.a.data_ptr() for s in stack.stacks.values()]
    ids, attention = batch(pad, [7, 8, 5, 8, 6, 8], seed=2)  # longer prompts, same buckets
    assert_same(*both(model, decoder, draws, 2, input_ids=ids, attention=attention, **kwargs))
    assert list(decoder.buffers) == [shape] and decoder.buffers[shape] is buffers and shape == (6, 64)
    saved = [p.detach().clone() for p in policy.trainable_parameters()]
    try:
        with torch.no_grad():
            for p in policy.trainable_parameters():
                p.mul_(-1.5)
        assert_same(*both(model, decoder, draws, 2, input_ids=ids, attention=attention, **kwargs))
        assert decoder.stack is stack and [s.a.data_ptr() for s in stack.stacks.values()] == pointers
    finally:
        with torch.no_grad():
            for p, s in zip(policy.trainable_parameters(), saved, strict=True):
                p.copy_(s)


def test_the_compiled_step_is_one_graph_across_calls_and_adapter_updates(policy, draws):
    """What CUDA-graph replay relies on, checked with dynamo alone on CPU: the decode step traces into a
    single graph (``fullgraph``), and calls with other prompts, another row count of the same bucket and
    updated adapter weights reuse it (no recompilation, hence no recapture)."""
    model = policy.models[policy.base_model]
    pad = policy.tokenizer.pad_token_id
    graphs: list = []
    count = counting_backend(graphs)
    decoder = StaticDecoder(model)
    decoder.step = torch.compile(decoder._forward, backend=count, fullgraph=True, dynamic=False)
    kwargs = dict(max_new_tokens=5, temperature=1.0, top_p=1.0, stops=set())
    saved = [p.detach().clone() for p in policy.trainable_parameters()]
    try:
        for seed, lengths in ((0, [4, 7, 5, 7, 3]), (1, [6, 2, 5, 8, 4, 6])):  # 5 and 6 rows: bucket 6
            ids, attention = batch(pad, lengths, seed=seed)
            adapters = NAMES[: len(lengths)]
            assert_same(*both(model, decoder, draws, seed, input_ids=ids, attention=attention, adapters=adapters,
                              **kwargs))  # fmt: skip
            with torch.no_grad():
                for p in policy.trainable_parameters():
                    p.mul_(1.2)
    finally:
        with torch.no_grad():
            for p, s in zip(policy.trainable_parameters(), saved, strict=True):
                p.copy_(s)
    assert len(graphs) == 1


def test_buckets():
    assert [bucket(n) for n in (1, 2, 3, 5, 7, 9, 96, 97, 130)] == [1, 2, 3, 6, 8, 12, 96, 128, 192]
    assert bucket(10, 64) == 64 and bucket(100, 64) == 128


def test_the_decode_path_is_picked_by_device():
    assert pick_decode("auto", "cpu") == "eager" and pick_decode("auto", "cuda:0") == "graph"
    assert pick_decode("stacked", "cpu") == "stacked"
    with pytest.raises(ValueError, match="CUDA"):
        pick_decode("graph", "cpu")
    with pytest.raises(ValueError, match="unknown decode"):
        pick_decode("fast", "cpu")


def test_backend_debates_alike_on_every_path(tiny_model, tiny_lora_adapters, monkeypatch):
    """A 2-round debate of two questions through the backend (prefix cache on, shared round-0 prompts)
    with decode eager, stacked, and stacked with its step compiled as the graph path compiles it (dynamic
    shapes; through AOTAutograd on a CPU): the same decode calls, each sampling the same tokens to
    rounding (compared to the stacked run's draws, :func:`rounding.assert_same_calls`), and the compiled
    step compiled once for the debate's buckets."""
    from test_prefix_cache import debate

    from udpo.env.backends import SamplingParams
    from udpo.env.tasks.arithmetic import Arithmetic

    graphs: list = []
    aot_eager = counting_backend(graphs, through="aot_eager")
    build = StaticDecoder.__init__
    calls = CallLog(monkeypatch)
    runs, buckets = {}, []
    for mode in ("eager", "stacked", "compiled"):
        backend = HFBackend(model=tiny_model, dtype="fp32", decode="eager" if mode == "eager" else "stacked")
        for name, path in tiny_lora_adapters.items():
            backend.load_adapter(name, path)
        sampling = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=10, seed=7)
        with monkeypatch.context() as m:
            if mode == "compiled":
                m.setattr(
                    StaticDecoder,
                    "__init__",
                    lambda self, *a, **k: build(self, *a, **k, compile_backend=aot_eager),
                )
            debate(backend, sampling, Arithmetic().load("test", seed=0)[:2], prefix_cache=True)
        runs[mode] = calls.take_calls()
        assert (backend._static is not None) == (mode != "eager")
        if mode == "compiled":
            buckets = list(backend._static.buffers)
        backend.close()
    assert len(buckets) >= 2 and len(graphs) == 1  # the rounds' buckets, one compile
    config = AutoConfig.from_pretrained(tiny_model)
    stacked = runs["stacked"]
    assert len(stacked) >= 2  # at least one call per round
    for mode in ("eager", "compiled"):
        assert assert_same_calls(stacked, runs[mode], config, torch.float32) >= 1, mode


@pytest.mark.skipif(not torch.cuda.is_available(), reason="graph capture needs CUDA")
def test_graph_decoding_matches_stacked_on_cuda(policy, draws):
    model = policy.models[policy.base_model].to("cuda")
    try:
        ids, attention = batch(policy.tokenizer.pad_token_id, [4, 8, 6, 8, 3, 7, 5])
        kwargs = dict(input_ids=ids.cuda(), attention=attention.cuda(), max_new_tokens=12, temperature=1.0,
                      top_p=0.9, stops=set(), adapters=NAMES)  # fmt: skip
        runs, drawn = [], []
        for graph in (False, True):
            torch.manual_seed(5)
            runs.append(StaticDecoder(model, graph=graph).sample(**kwargs))
            drawn.append(draws.take())
        assert_same(*runs, *drawn, model, call_columns(kwargs["input_ids"], kwargs["max_new_tokens"]))
    finally:
        model.to("cpu")


@pytest.mark.parametrize(("shapes", "compiles"), [("dynamic", 1), ("static", 2)])
def test_a_compiled_step_compiles_once_across_debates_updates_evictions_and_runs(
    policy, tokenizer_path, tmp_path, shapes, compiles
):
    """What keeps a GPU run from recompiling (issue 50), checked with dynamo on CPU (the step compiled with
    a counting backend: dynamo's guards are those of the CUDA-graph path): a first debate meets two
    buckets of other rows and columns, compiled once with dynamic shapes (the default) and once each with
    static ones; then a second debate, an in-place adapter update, an eviction of each bucket at the KV
    cap and its reallocation, and adapters stacked afresh all reuse the compiled code
    (``error_on_recompile``); an evicted bucket is freed (no compiled code holds it); a second run in the
    same process, after the first decoder is closed (dynamo reset), compiles afresh instead of
    recompiling against the first run's guards."""
    import gc
    import weakref

    pad = policy.tokenizer.pad_token_id
    graphs: list = []
    count = counting_backend(graphs)
    kwargs = dict(max_new_tokens=4, temperature=1.0, top_p=1.0, stops=set())
    small = batch(pad, [4, 7, 5, 7, 3], seed=0)  # 5 rows: bucket 6 x 64 columns
    large = batch(pad, [70, 66, 61], seed=1)  # 3 rows x 74 columns: bucket 3 x 96

    def debate(decoder, ids_attention, adapters=NAMES) -> None:
        ids, attention = ids_attention
        decoder.sample(input_ids=ids, attention=attention, adapters=adapters[: len(ids)], **kwargs)

    model = policy.models[policy.base_model]
    saved = [p.detach().clone() for p in policy.trainable_parameters()]
    # max_bytes 1: only the newest bucket is kept, so every change of shape evicts the other one
    decoder = StaticDecoder(model, max_bytes=1, max_rows=8, compile_backend=count, shapes=shapes)
    try:
        debate(decoder, small)
        mask = weakref.ref(decoder.buffers[6, 64].mask)
        debate(decoder, large)  # the second shape: no new compile with dynamic shapes, one with static
        gc.collect()
        assert list(decoder.buffers) == [(3, 96)] and mask() is None  # evicted, and freed
        assert (
            len(graphs) == compiles and len(decoder.stack.index) == 8
        )  # the index at its largest from the start
        with torch._dynamo.config.patch(error_on_recompile=True):
            debate(decoder, small)  # a second debate, its bucket allocated again
            with torch.no_grad():
                for p in policy.trainable_parameters():
                    p.mul_(1.1)  # an optimizer step's in-place update
            debate(decoder, small)
            debate(decoder, large)  # evicted and allocated again
            decoder.stack = None  # adapters stacked afresh (a reloaded adapter): new buffers, same shapes
            debate(decoder, large)
            debate(decoder, small, adapters=[None] * 8)  # no adapter on any row
        assert len(graphs) == compiles
        decoder.close()
        # a second run in this process: another model and decoder; after the reset, no guard of the first
        # run's is left to fail, so its compile is a first one
        second = tiny_team_with_distinct_adapters(tmp_path / "second", tokenizer_path)
        decoder = StaticDecoder(
            second.models[second.base_model], max_rows=8, compile_backend=count, shapes=shapes
        )
        with torch._dynamo.config.patch(error_on_recompile=True):
            debate(decoder, small)
            debate(decoder, small)
        assert len(graphs) == compiles + 1
    finally:
        decoder.close()
        with torch.no_grad():
            for p, s in zip(policy.trainable_parameters(), saved, strict=True):
                p.copy_(s)


def graph_backend(tiny_model, tiny_lora_adapters, monkeypatch, error: Exception, auto: bool) -> HFBackend:
    """A backend on CPU made to decode as on a GPU with ``decode`` auto (or graph, ``auto=False``), whose
    compiled step raises ``error``: CUDA is reported present while the decoder is built, and
    ``torch.compile`` returns a step that fails as a failed compile or capture would."""

    def compile_failing(fn, **kwargs):
        def step(*args):
            raise error

        return step

    backend = HFBackend(model=tiny_model, dtype="fp32", decode="stacked")
    for name, path in tiny_lora_adapters.items():
        backend.load_adapter(name, path)
    backend.decode, backend._decode_auto = "graph", auto
    monkeypatch.setattr(torch, "compile", compile_failing)
    build = StaticDecoder.__init__

    def init_as_on_cuda(self, *args, **kwargs):
        with monkeypatch.context() as m:
            m.setattr(torch.cuda, "is_available", lambda: True)
            build(self, *args, **kwargs)

    monkeypatch.setattr(StaticDecoder, "__init__", init_as_on_cuda)
    return backend


@pytest.mark.parametrize(("shapes", "dynamic"), [("dynamic", None), ("static", False)])
def test_the_backends_decode_shapes_reach_the_compiled_step(tiny_model, shapes, dynamic, monkeypatch):
    """``HFBackend(decode_shapes=...)`` (the recipe's ``hf_decode_shapes``) is how its graph step is
    compiled: dynamic sizes where marked (``dynamic=None``), or every size specialized; a bad value is
    refused when the backend is built, not at its first graph call."""
    asked = []

    def compile_recording(fn, **kwargs):
        asked.append(kwargs)
        return fn

    backend = HFBackend(model=tiny_model, dtype="fp32", decode="stacked", decode_shapes=shapes)
    backend.decode = "graph"
    monkeypatch.setattr(torch, "compile", compile_recording)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    decoder = backend._decoder()
    assert asked == [{"mode": "reduce-overhead", "dynamic": dynamic}]
    assert decoder.graph and decoder.dynamic == (shapes == "dynamic")
    with pytest.raises(ValueError, match="decode shapes must be one of dynamic, static, got 'both'"):
        HFBackend(model="no/such-model", decode="stacked", decode_shapes="both")  # refused before loading


def requests_for(adapters) -> list:
    from udpo.env.backends import ChatRequest, SamplingParams

    sampling = SamplingParams(temperature=1.0, max_tokens=12, seed=3)
    return [ChatRequest([{"role": "user", "content": f"add {k} and {k + 2}"}], sampling, adapter=a)
            for k, a in enumerate(adapters)]  # fmt: skip


def test_auto_decodes_stacked_when_the_graph_fails_to_compile_and_says_so(
    tiny_model, tiny_lora_adapters, monkeypatch, caplog
):
    """Where "auto" picked the CUDA graph and it cannot be compiled or captured, the call is made again
    stacked (the same tokens as a stacked backend for the same seed), later calls stay stacked, and a
    warning carries the whole error."""
    names = [*tiny_lora_adapters, None]
    reference = HFBackend(model=tiny_model, dtype="fp32", decode="stacked")
    for name, path in tiny_lora_adapters.items():
        reference.load_adapter(name, path)
    expected = [c.completion_ids for c in reference.generate(requests_for(names))]
    error = RuntimeError("capture failed\n  at the second line of the error")
    backend = graph_backend(tiny_model, tiny_lora_adapters, monkeypatch, error, True)
    resets = []
    monkeypatch.setattr(torch._dynamo, "reset", lambda: resets.append(1))
    with caplog.at_level("WARNING", logger="udpo.env.backends.hf"):
        got = [c.completion_ids for c in backend.generate(requests_for(names))]
    # exact: both are the uncompiled stacked loop on the same rows and kernels, bit-identical by construction
    assert got == expected and backend.decode == "stacked" and not backend._static.graph
    assert resets == [1]  # the failed graph's decoder closed: dynamo's caches let go of it
    assert "graph decoding failed; decoding stacked, uncompiled, from now on" in caplog.text
    assert "RuntimeError: capture failed\n  at the second line of the error" in caplog.text  # all of it
    assert [c.completion_ids for c in backend.generate(requests_for(names))] == expected
    backend.close()
    assert resets == [1] and backend._static is None  # an uncompiled decoder needs no reset


@pytest.mark.parametrize(
    ("error", "auto"),
    [(RuntimeError("capture failed"), False), (torch.cuda.OutOfMemoryError("CUDA out of memory"), True)],
    ids=["graph asked for", "out of memory"],
)
def test_a_graph_asked_for_or_out_of_memory_stays_an_error(
    tiny_model, tiny_lora_adapters, monkeypatch, error, auto
):
    from udpo.env.backends import BackendError

    backend = graph_backend(tiny_model, tiny_lora_adapters, monkeypatch, error, auto)
    with pytest.raises(BackendError, match="hf generation failed"):
        backend.generate(requests_for([*tiny_lora_adapters, None]))
    assert backend.decode == "graph"


def test_switching_the_active_adapter_between_rollouts_recompiles_nothing(policy, draws):
    """The trainer's update makes each agent's adapter the PEFT model's active one in turn
    (``MultiAgentPolicy._set_active``); the compiled decode step reads no ``active_adapter`` (on an H200
    each switch recompiled every bucket, issue 50), so rollouts after a switch reuse the compiled code."""
    model = policy.models[policy.base_model]
    pad = policy.tokenizer.pad_token_id
    graphs: list = []
    kwargs = dict(max_new_tokens=4, temperature=1.0, top_p=1.0, stops=set(), adapters=NAMES[:5])
    ids, attention = batch(pad, [4, 7, 5, 7, 3])
    active = model.active_adapter
    decoder = StaticDecoder(model, max_rows=8, compile_backend=counting_backend(graphs))
    try:
        assert_same(*both(model, decoder, draws, 0, input_ids=ids, attention=attention, **kwargs))
        with torch._dynamo.config.patch(error_on_recompile=True):
            for agent in (1, 2, 0):
                policy._set_active(agent)  # as the update does, agent by agent
                assert model.active_adapter == policy.adapter_names[agent]
                assert_same(*both(model, decoder, draws, agent, input_ids=ids, attention=attention, **kwargs))
        assert len(graphs) == 1
    finally:
        decoder.close()
        model.set_adapter(active)


def test_a_step_compiled_with_dynamic_shapes_samples_the_eager_loops_tokens_in_every_bucket(policy, draws):
    """One compile (through AOTAutograd, which decomposes and functionalizes the step as inductor's
    front end does, with the rows and KV columns symbolic) serves buckets of other rows and columns,
    and each samples the eager loop's tokens; a single row is a second compile (dynamo specializes a
    size of 1), for any columns; the cache layers report their keys' size as the mask's length, the
    number they were built with."""
    model = policy.models[policy.base_model]
    pad = policy.tokenizer.pad_token_id
    graphs: list = []
    aot_eager = counting_backend(graphs, through="aot_eager")
    decoder = StaticDecoder(model, max_rows=8, compile_backend=aot_eager)
    kwargs = dict(max_new_tokens=5, temperature=0.9, top_p=0.95, stops=set())
    try:
        calls = [[4, 7, 5, 7, 3], [70, 66, 61], [9, 130], [6, 5, 4, 8, 7, 6, 5, 3], [5], [70]]
        for seed, lengths in enumerate(calls):
            ids, attention = batch(pad, lengths, seed=seed)
            adapters = NAMES[: len(ids)] if len(ids) <= len(NAMES) else [*NAMES, "agent_1"]
            assert_same(*both(model, decoder, draws, seed, input_ids=ids, attention=attention, adapters=adapters,
                              **kwargs))  # fmt: skip
        assert sorted(decoder.buffers) == [(1, 64), (1, 96), (2, 192), (3, 96), (6, 64), (8, 64)]
        assert len(graphs) == 2
        for (rows, columns), buf in decoder.buffers.items():
            assert {layer.get_mask_sizes(1) for layer in buf.cache.layers} == {(columns, 0)}
            assert {(layer.keys.shape[0], layer.max_cache_len) for layer in buf.cache.layers} == {
                (rows, columns)
            }
    finally:
        decoder.close()


def test_shape_count_by_hand():
    """Rows buckets 1, 2, 3, 4, 6 (fewest rows in each: 1, 2, 3, 4, 5) and column buckets 64, 96, 128
    (fewest columns: 1, 65, 97): 15 shapes; at most 200 positions in a call of several rows: one row any
    columns (3), 2 rows 2/130/194 (3), 3 rows 3/195 (2), 4 and 5 rows only the first (1 + 1): 10."""
    from udpo.env.backends.static_decode import bucket_sizes, shape_count

    assert bucket_sizes(6) == [1, 2, 3, 4, 6] and bucket_sizes(100, 64) == [64, 96, 128]
    assert shape_count(6, 128) == 15
    assert shape_count(6, 128, max_positions=200) == 10


def test_the_hf_backend_bounds_its_decoders_shapes_by_its_kv_cap(tiny_model, tiny_lora_adapters):
    from udpo.env.backends.hf import kv_bytes_per_token
    from udpo.env.backends.static_decode import context_length, shape_count

    backend = HFBackend(model=tiny_model, dtype="fp32", decode="stacked", max_batch=24, kv_cache_gib=0.001)
    for name, path in tiny_lora_adapters.items():
        backend.load_adapter(name, path)
    decoder = backend._decoder()
    positions = int(2**30 * 0.001 // kv_bytes_per_token(backend.model))
    assert decoder.shapes == shape_count(24, context_length(backend.model), positions)
    assert decoder.shapes < shape_count(24, context_length(backend.model))  # the cap bounds them
    assert decoder.max_bytes == 2 * 0.001 * 2**30
    backend.close()


def test_a_shape_past_the_recompile_limit_decodes_uncompiled_and_says_so(policy, draws, caplog):
    """A decoder compiling each shape on its own (``shapes="static"``) whose calls meet more bucket shapes
    than its recompile limit (one, here): the first shape is compiled; the second meets the limit, warns once and decodes uncompiled, the same tokens as the
    eager loop; the first shape still runs its compiled code (no new graph); the limit applies to this
    step alone (dynamo's global setting is untouched)."""
    model = policy.models[policy.base_model]
    pad = policy.tokenizer.pad_token_id
    graphs: list = []
    runs: list = []
    kwargs = dict(max_new_tokens=4, temperature=1.0, top_p=1.0, stops=set())
    small = batch(pad, [4, 7, 5, 7, 3], seed=0)  # bucket 6 x 64
    large = batch(pad, [70, 66, 61], seed=1)  # bucket 3 x 96
    limit = torch._dynamo.config.recompile_limit
    decoder = StaticDecoder(
        model, max_rows=8, compile_backend=counting_backend(graphs, runs), shapes="static"
    )
    assert decoder.shapes > 2
    decoder.shapes = 1
    compiled_steps = []
    try:
        with torch._dynamo.config.patch(recompile_limit=1), caplog.at_level("WARNING"):
            for seed, (ids, attention) in enumerate([small, large, small, large]):
                adapters = NAMES[: len(ids)]
                before = len(runs)
                assert_same(*both(model, decoder, draws, seed, input_ids=ids, attention=attention, adapters=adapters,
                                  **kwargs))  # fmt: skip
                compiled_steps.append(len(runs) - before)
        # 3 decode steps a call (4 tokens; the first from the prompt pass): compiled for the small bucket,
        # before and after the large one met the limit; uncompiled for the large one
        assert compiled_steps == [3, 0, 3, 0]
        assert len(graphs) == 1 and decoder.uncompiled == {(3, 96)}
        warnings = [r for r in caplog.records if "recompile limit (1) reached" in r.getMessage()]
        assert len(warnings) == 1 and "3 rows x 96 columns" in warnings[0].getMessage()
        assert torch._dynamo.config.recompile_limit == limit
    finally:
        decoder.close()
