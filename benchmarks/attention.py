"""Benchmark: one attention layer with grouped key/value heads, copied first (``sdpa``) or not (``sdpa_gqa``).

    python benchmarks/attention.py [--rows 48] [--columns 320] [--queries 1 200] [--dtype bf16|fp32]
                                   [--repeats 30]

SmolLM2-135M's shapes (9 query heads over 3 key/value heads of 64): ``--rows`` rows attend over a KV
cache of ``--columns`` positions with a padding mask, ``--queries`` new positions each (1: a decode
step, more: a prompt pass). transformers' ``sdpa`` attention on CPU with a mask first copies each
key/value head three times (``repeat_kv``), then calls torch's SDPA; ``sdpa_gqa``
(``udpo.env.backends.attention``) calls SDPA with the grouped heads (``enable_gqa``). Prints the
milliseconds of each, their ratio and the largest difference of the outputs. A model has 30 such
layers per forward. Threads: torch's current setting (``OMP_NUM_THREADS``).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--columns", type=int, default=320, help="KV cache positions")
    parser.add_argument("--queries", type=int, nargs="+", default=[1, 200])
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    from transformers.integrations.sdpa_attention import repeat_kv

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    torch.manual_seed(0)
    key = torch.randn(args.rows, KV_HEADS, args.columns, HEAD_DIM, dtype=dtype)
    value = torch.randn_like(key)
    print(
        f"{args.rows} rows, {args.columns} cached positions, {args.dtype}, {torch.get_num_threads()} threads"
    )
    for q in args.queries:
        query = torch.randn(args.rows, q, HEADS, HEAD_DIM, dtype=dtype).transpose(1, 2)
        mask = torch.rand(args.rows, 1, q, args.columns) > 0.1
        mask[..., -1] = True  # every query sees at least one position

        def copied(query=query, mask=mask):
            k, v = repeat_kv(key, HEADS // KV_HEADS), repeat_kv(value, HEADS // KV_HEADS)
            return F.scaled_dot_product_attention(query, k, v, attn_mask=mask)

        def grouped(query=query, mask=mask):
            return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)

        repeats = max(1, args.repeats // q) if q > 1 else args.repeats
        a, b = timed(copied, repeats), timed(grouped, repeats)
        diff = (copied().float() - grouped().float()).abs().max().item()
        print(
            f"{q:4d} queries per row: sdpa (heads copied) {a:7.2f} ms, sdpa_gqa {b:7.2f} ms, "
            f"{a / b:.2f}x; largest difference {diff:.1e}"
        )


if __name__ == "__main__":
    main()
