"""Which dtype generates faster on this CPU: one decode step of a model's shape timed in bf16 and in fp32.

On a CPU with bf16 matrix units the matmuls of a decode step run faster in bf16, but the rest of the step
(norms, rotary, attention, the per-row LoRA's casts, the output layer's logits cast for the draw) may
cost more, by more than the matmuls save: on a 2-core AMD Zen 4 (AVX512-BF16) a debate took 1.3x as long in
bf16 as in fp32, where on Intel AMX and on Zen 5 bf16 was the faster. So for generation alone
(:func:`.machine.choose_dtype` with ``work="generate"``) ``dtype: auto`` asks this probe instead of
guessing, once per machine and model shape:

- the stack: :data:`LAYERS` decoder layers built from the model's own config (random weights), its
  embedding and output layer, :data:`ADAPTERS` random LoRA adapters of rank 8 on the attention
  projections, stacked (:class:`.stacked.StackedAdapters`) as a team's debate runs them, the rows
  spread over them;
- the step: as :func:`.decoding.sample` runs it: one token for each of :data:`ROWS` rows over a static
  KV cache of :data:`CONTEXT` positions (random keys and values), then the fp32 log-softmax and the draw
  over the vocabulary (:func:`.decoding._draw`);
- the estimate: the whole step plus ``(layers / LAYERS - 1)`` times its decoder layers (timed within the
  same call, from the first layer's start to the last one's end): the full model's step;
- the timing: :data:`REPEATS` steps of each dtype after :data:`WARMUP` untimed ones, the two dtypes
  alternating; the choice is the median over the pairs of the bf16 step's time over the fp32 step's
  right after it (load that comes and goes falls on both of a pair), beside each dtype's median.

The faster one is kept in ``dtype_probe.json`` in the cache folder (``$UDPO_CACHE``, default
``~/.cache/udpo``), keyed by the CPU (model name, a digest of its flags, torch's kernel level), torch's
version and threads, the model's shape and this probe's settings: a later run with the same key reads it
(delete the file to measure again). For SmolLM2-135M it took 1.2-1.3 s at one thread and 1.7-2.2 s at
two on 2 cores busy with other work (load 3.5): 0.3 s building the two stacks, the rest the steps;
peft's import comes on top where nothing imported it before. Tests pass their own ``measure`` (a
function of the config returning each dtype's seconds) and ``path``.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

#: decoder layers built (the full model's step is estimated from them)
LAYERS = 2
#: rows of the probed step (a debate round's batch: 3 agents x 8 questions)
ROWS = 24
#: KV cache positions the step attends over (a round's prompt and answer so far)
CONTEXT = 128
#: random LoRA adapters the rows are spread over
ADAPTERS = 3
#: timed steps of each dtype, and the untimed ones before
REPEATS, WARMUP = 5, 1
#: what the cached results were measured with (a change of the probe measures again)
VERSION = 1
#: the cache file, in the cache folder
FILE = "dtype_probe.json"
#: the dtypes compared
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}

#: ``measure(config) -> {"bf16": seconds, "fp32": seconds}``: one estimated decode step of each dtype
#: (and, optionally, ``"ratio"``: the bf16 / fp32 time to decide by; default the seconds' quotient)
Measure = Callable[[Any], dict[str, float]]


def text_config(config: Any) -> Any:
    """The language model's config (a multimodal config's ``text_config``)."""
    return getattr(config, "text_config", None) or config


def model_shape(config: Any) -> dict[str, Any]:
    """What the probe's result depends on in the model: its type and sizes."""
    cfg = text_config(config)
    heads = getattr(cfg, "num_attention_heads", None)
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_key_value_heads", "vocab_size")
    shape = {"model_type": getattr(cfg, "model_type", None), "num_attention_heads": heads}
    shape |= {k: getattr(cfg, k, None) for k in keys}
    shape["head_dim"] = getattr(cfg, "head_dim", None) or (cfg.hidden_size // heads if heads else None)
    shape["tie_word_embeddings"] = bool(getattr(cfg, "tie_word_embeddings", False))
    return shape


def cpu_flags() -> str:
    """The CPU's feature flags (``/proc/cpuinfo``), or "" where that file is not there."""
    try:
        with open("/proc/cpuinfo") as info:
            return next((line.split(":", 1)[1].strip() for line in info if line.startswith("flags")), "")
    except OSError:
        return ""


def probe_key(config: Any, cpu: str) -> str:
    """The cache key of the CPU named ``cpu`` (its model name), its flags, torch and ``config``'s shape (see
    the module docstring)."""
    key = {
        "cpu": cpu,
        "flags": hashlib.sha256(cpu_flags().encode()).hexdigest()[:16],
        "kernels": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "shape": model_shape(config),
        "probe": {
            "version": VERSION,
            "layers": LAYERS,
            "rows": ROWS,
            "context": CONTEXT,
            "adapters": ADAPTERS,
        },
    }
    return json.dumps(key, sort_keys=True)


def cache_path() -> Path:
    from ..models import cache_dir

    return cache_dir() / FILE


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def probed_dtype(
    config: Any, cpu: str, measure: Measure | None = None, path: Path | None = None
) -> tuple[torch.dtype, str]:
    """(the faster dtype for generating with ``config``'s model on this CPU, model name ``cpu``; why), from
    the cache file when it holds this key, else measured (``measure``, default :func:`measure_steps`) and
    written there. The why reads e.g. ``probe: bf16 1.31x slower on this CPU; cached in
    ~/.cache/udpo/dtype_probe.json``."""
    path = cache_path() if path is None else path
    key = probe_key(config, cpu)
    entry = _read(path).get(key)
    how = "cached in"
    if not (isinstance(entry, dict) and entry.get("picked") in DTYPES and _ratio(entry)):
        start = time.perf_counter()
        try:
            seconds = (measure or measure_steps)(config)
        except Exception as e:  # a model the probe cannot build: the rule of the matrix units, said so
            log.warning("dtype probe failed, bf16 taken: %s: %s", e.__class__.__name__, e)
            return torch.bfloat16, f"bf16 matrix units; the probe failed ({e.__class__.__name__}: {e})"
        ratio = seconds.get("ratio", seconds["bf16"] / seconds["fp32"])
        entry = {
            "picked": "bf16" if ratio <= 1 else "fp32",
            "ratio": ratio,
            "bf16_s": seconds["bf16"],
            "fp32_s": seconds["fp32"],
            "probe_s": round(time.perf_counter() - start, 3),
            "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        how = "measured now, cached in"
        try:  # another process may have written its own key meanwhile: re-read, add ours
            from ..jsonl import write_json

            write_json(path, {**_read(path), key: entry})
        except OSError as e:
            how = f"measured now, not cached ({e.__class__.__name__}: {e})"
            log.warning("dtype probe: could not write %s: %s", path, e)
    ratio = _ratio(entry) or 1.0
    speed = f"bf16 {ratio:.2f}x slower" if ratio > 1 else f"bf16 {1 / ratio:.2f}x faster"
    where = f" {_shown(path)}" if how.endswith(" in") else ""
    return DTYPES[entry["picked"]], f"probe: {speed} on this CPU; {how}{where}"


def _ratio(entry: dict[str, Any]) -> float | None:
    """A cached entry's bf16 / fp32 time, None where it is missing or not a positive number."""
    try:
        ratio = float(entry["ratio"])
    except (KeyError, TypeError, ValueError):
        return None
    return ratio if ratio > 0 else None


def _shown(path: Path) -> str:
    """``path`` with the home folder as ``~``."""
    try:
        return "~/" + str(path.resolve().relative_to(Path.home().resolve()))
    except ValueError:
        return str(path)


@torch.no_grad()
def measure_steps(config: Any) -> dict[str, float]:
    """Median seconds of one estimated decode step of ``config``'s model in bf16 and in fp32 (see the
    module docstring). torch's random state is left as it was (the probe's weights are drawn from its
    own seed), so a seeded run samples the same whether or not it probed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        small, fp32 = _small_model(config)
        models = {"bf16": copy.deepcopy(fp32).to(torch.bfloat16), "fp32": fp32}
        depth = text_config(config).num_hidden_layers
        steps = {name: _probe_step(model, small, DTYPES[name], depth) for name, model in models.items()}
        for _ in range(WARMUP):
            for step in steps.values():
                step()
        times: dict[str, list[float]] = {name: [] for name in steps}
        for _ in range(REPEATS):
            for name, step in steps.items():
                times[name].append(step())
    seconds = {name: statistics.median(t) for name, t in times.items()}
    # each bf16 step against the fp32 step right after it: load that comes and goes falls on both
    seconds["ratio"] = statistics.median(b / f for b, f in zip(times["bf16"], times["fp32"], strict=True))
    return seconds


def _small_model(config: Any) -> tuple[Any, Any]:
    """(the config of :data:`LAYERS` layers, its model in fp32 with random weights). Built with a vocabulary
    of 64 (initializing the full embedding would take most of the probe's time), then given embedding and
    output weights of the full vocabulary, filled from a small random block (the values do not change the
    time a matmul takes, only zeros and denormals could)."""
    from transformers import AutoModelForCausalLM

    full = text_config(config)
    small = copy.deepcopy(full)
    small.num_hidden_layers = LAYERS
    if isinstance(getattr(small, "layer_types", None), list):
        small.layer_types = small.layer_types[:LAYERS]
    small.vocab_size, small.pad_token_id = 64, None
    model = AutoModelForCausalLM.from_config(small, dtype=torch.float32).eval()
    small.vocab_size = full.vocab_size
    embedding, output = model.get_input_embeddings(), model.get_output_embeddings()
    embedding.weight = torch.nn.Parameter(_filled(full.vocab_size, full.hidden_size), requires_grad=False)
    embedding.num_embeddings = full.vocab_size
    if output is not None:
        tied = getattr(full, "tie_word_embeddings", False)
        output.weight = (
            embedding.weight
            if tied
            else torch.nn.Parameter(_filled(full.vocab_size, output.in_features), requires_grad=False)
        )
        output.out_features = full.vocab_size
    return small, model


def _filled(*shape: int) -> torch.Tensor:
    """A tensor of ``shape`` holding a random block of numbers (std 0.02) over and over."""
    block = torch.randn(1 << 16) * 0.02
    out = torch.empty(*shape)
    flat, n = out.view(-1), out.numel() // block.numel() * block.numel()
    flat[:n].view(-1, block.numel()).copy_(block)
    flat[n:].copy_(block[: out.numel() - n])
    return out


def _probe_step(model: Any, small: Any, dtype: torch.dtype, depth: int) -> Callable[[], float]:
    """A function running one decode step of ``model`` (``small``'s, in ``dtype``) with the probe's
    adapters, cache and draw, and returning its estimate of the step of the full model (``depth``
    decoder layers), in seconds."""
    from peft import LoraConfig, get_peft_model
    from transformers import StaticCache

    from .decoding import _draw
    from .stacked import StackedAdapters

    targets = [
        n
        for n in ("q_proj", "k_proj", "v_proj", "o_proj")
        if any(m.endswith(n) for m, _ in model.named_modules())
    ]
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=targets or "all-linear", init_lora_weights=False)
    names = [f"probe_{k}" for k in range(ADAPTERS)]
    peft = get_peft_model(model, lora, adapter_name=names[0])  # adapters in fp32, as PEFT keeps them
    for name in names[1:]:
        peft.add_adapter(name, lora)
    peft.eval()
    inner = peft.get_base_model()
    rows_adapters = [names[k % ADAPTERS] for k in range(ROWS)]
    stack = StackedAdapters(peft, capacity=ROWS, names=rows_adapters)
    stack.select(stack.slots(rows_adapters))
    stack.__enter__()  # for the life of this private model

    columns = CONTEXT + WARMUP + REPEATS + 1
    cache = StaticCache(config=small, max_cache_len=columns)
    heads = getattr(small, "num_key_value_heads", None) or small.num_attention_heads
    head_dim = getattr(small, "head_dim", None) or small.hidden_size // small.num_attention_heads
    for layer in range(LAYERS):  # the prompt's keys and values, random
        kv = torch.randn(2, ROWS, heads, CONTEXT, head_dim, dtype=dtype)
        cache.update(kv[0], kv[1], layer)
    attention = torch.ones(ROWS, columns, dtype=torch.long)
    tokens = torch.randint(small.vocab_size, (ROWS, 1))
    position = [CONTEXT]
    uniforms = torch.rand(ROWS, 1)

    blocks = next(m for m in inner.modules() if isinstance(m, torch.nn.ModuleList) and len(m) == LAYERS)
    marks: dict[str, float] = {}
    blocks[0].register_forward_pre_hook(lambda *_: marks.__setitem__("start", time.perf_counter()))
    blocks[-1].register_forward_hook(lambda *_: marks.__setitem__("end", time.perf_counter()))
    more = depth / LAYERS - 1  # the layers not built, in multiples of those timed

    def step() -> float:
        positions = torch.full((ROWS, 1), position[0], dtype=torch.long)
        position[0] += 1
        start = time.perf_counter()
        logits = inner(
            input_ids=tokens,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
        ).logits[:, -1]
        _draw(logits.float(), 0.7, 1.0, uniforms)
        return time.perf_counter() - start + more * (marks["end"] - marks["start"])

    return step
