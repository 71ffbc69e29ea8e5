"""What one training iteration costs, and what syncing adapters instead of weights saves. In one run:

1. the time split of an iteration (rollout / reward / update / sync), from a short real training run;
2. getting new weights into the rollout engine: loading an adapter (PEFT ``load_adapter`` into a live
   HF model; with ``--vllm`` also a new LoRA id in a running vLLM engine) against loading the full
   model again (``from_pretrained``; with ``--vllm`` a new engine);
3. peak memory of N agents as N adapters on one base model against N copies of the model
   (each measured in a fresh subprocess: peak RSS (VmHWM) on CPU, peak CUDA memory on GPU).

    python benchmarks/train_step.py                      # SmolLM2-135M, N=3, T=1, CPU
    python benchmarks/train_step.py --vllm --n_agents 3  # also the vLLM engine (needs vllm)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

MEMORY_PROBE = """
import json, resource, sys, torch
from transformers import AutoModelForCausalLM
from udpo.env.models import resolve_model
from udpo.policy import MultiAgentPolicy
mode, model, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
cuda = torch.cuda.is_available()
if mode == "adapters":
    keep = MultiAgentPolicy(model, n_agents=n)
elif mode == "copies":
    dtype = torch.bfloat16 if cuda else torch.float32
    keep = [AutoModelForCausalLM.from_pretrained(resolve_model(model), dtype=dtype).to("cuda" if cuda else "cpu")
            for _ in range(n)]
def host_peak():
    # VmHWM starts afresh at exec; ru_maxrss does not on Linux (it keeps the parent's peak)
    try:
        line = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:"))
        return int(line.split()[1]) * 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
peak = torch.cuda.max_memory_allocated() if cuda else host_peak()
print(json.dumps({"peak_bytes": peak, "device": "cuda" if cuda else "cpu"}))
"""


def timed(fn, repeat: int = 3) -> float:
    """Median wall-clock seconds of ``fn()``."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def iteration_split(args, out: Path) -> dict[str, float]:
    from udpo.config import TrainConfig
    from udpo.trainer import Trainer

    config = TrainConfig(
        model=args.model, task="arithmetic", task_options={"difficulty": 1, "n_questions": 40},
        n_agents=args.n_agents, rounds=args.rounds, max_tokens=args.max_tokens,
        questions_per_iteration=args.questions, max_iterations=args.iterations, eval_questions=0,
        warmup_fraction=0.0, alpha=[0.3], beta=[0.3], gamma=[0.3], lambda_=[1.0], eta=[0.01],
        learning_rate=1e-4, warmup_steps=0, output_dir=str(out / "run"), save_steps=10_000, progress=False,
    )  # fmt: skip
    trainer = Trainer(config)
    trainer.train()
    trainer.close()
    records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"][1:] or [r for r in records if r["kind"] == "train"]
    keys = ("time/rollout", "time/reward", "time/update", "time/sync")
    split = {k.split("/")[1]: sum(r[k] for r in train) / len(train) for k in keys}
    split["tokens_per_s"] = sum(r["tokens_per_s"] for r in train) / len(train)
    return split


def sync_vs_reload(args, out: Path) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    from udpo.env.backends.hf import HFBackend
    from udpo.env.models import resolve_model
    from udpo.policy import MultiAgentPolicy

    path = resolve_model(args.model)
    policy = MultiAgentPolicy(args.model, n_agents=args.n_agents)
    served = HFBackend(model=args.model)
    folders = iter(range(1000))

    def save_and_load_adapters():
        paths = policy.save_adapters(out / "sync" / str(next(folders)))
        for name, folder in paths.items():
            served.load_adapter(name, folder)

    def reload_full_model():
        AutoModelForCausalLM.from_pretrained(path, dtype=policy.dtype).to(policy.device)

    result = {"hf_adapters_s": timed(save_and_load_adapters), "hf_full_model_s": timed(reload_full_model)}
    served.close()
    if args.vllm:
        from udpo.env.backends.base import ChatRequest, SamplingParams
        from udpo.env.backends.vllm import VLLMBackend

        request = [ChatRequest([{"role": "user", "content": "What is 2 + 2?"}], SamplingParams(max_tokens=1))]
        start = time.perf_counter()
        engine = VLLMBackend(model=args.model, max_loras=args.n_agents)
        engine.generate(request)
        result["vllm_new_engine_s"] = time.perf_counter() - start

        def new_lora_ids():  # vLLM loads an adapter on its first use, so time that use too
            paths = policy.save_adapters(out / "sync" / str(next(folders)))
            for name, folder in paths.items():
                engine.load_adapter(name, folder)
            engine.generate([ChatRequest(request[0].messages, request[0].sampling, adapter=n) for n in paths])

        result["vllm_adapters_s"] = timed(new_lora_ids)
        engine.close()
    return result


def memory(args) -> dict[str, float]:
    out = {}
    for mode in ("imports", "adapters", "copies"):  # imports: the same process with no model loaded
        proc = subprocess.run(
            [sys.executable, "-c", MEMORY_PROBE, mode, args.model, str(args.n_agents)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        probe = json.loads(proc.stdout.strip().splitlines()[-1])
        out[f"{mode}_peak_gib"] = probe["peak_bytes"] / 2**30
        out["device"] = probe["device"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--n_agents", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--max_tokens", type=int, default=32)
    parser.add_argument("--questions", type=int, default=4, help="questions per iteration")
    parser.add_argument("--iterations", type=int, default=3, help="the first is a warm-up and not counted")
    parser.add_argument("--vllm", action="store_true", help="also time a vLLM engine (needs vllm)")
    parser.add_argument("--json", default=None, help="also write the numbers to this file")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    with tempfile.TemporaryDirectory() as tmp:
        split = iteration_split(args, Path(tmp))
        sync = sync_vs_reload(args, Path(tmp))
    mem = memory(args)

    total = sum(split[k] for k in ("rollout", "reward", "update", "sync"))
    print(f"model {args.model}, N={args.n_agents}, T={args.rounds}, {args.questions} questions/iteration, "
          f"max_tokens {args.max_tokens}, torch threads {torch.get_num_threads()}, "
          f"device {'cuda' if torch.cuda.is_available() else 'cpu'}")  # fmt: skip
    print(f"\niteration time split (mean of {max(args.iterations - 1, 1)} iterations, {total:.2f} s each):")
    for k in ("rollout", "reward", "update", "sync"):
        print(f"  {k:8s} {split[k]:8.3f} s  {100 * split[k] / total:5.1f} %")
    print(f"  rollout throughput {split['tokens_per_s']:.1f} generated tokens/s")
    print(f"\nnew weights into the engine ({args.n_agents} adapters):")
    print(f"  hf: save + load_adapter  {sync['hf_adapters_s']:8.3f} s")
    print(f"  hf: from_pretrained      {sync['hf_full_model_s']:8.3f} s   "
          f"ratio {sync['hf_full_model_s'] / sync['hf_adapters_s']:.1f}x")  # fmt: skip
    if args.vllm:
        print(f"  vllm: new LoRA ids       {sync['vllm_adapters_s']:8.3f} s")
        print(f"  vllm: new engine         {sync['vllm_new_engine_s']:8.3f} s   "
              f"ratio {sync['vllm_new_engine_s'] / sync['vllm_adapters_s']:.1f}x")  # fmt: skip
    base = mem["imports_peak_gib"] if mem["device"] == "cpu" else 0.0
    net = {m: mem[f"{m}_peak_gib"] - base for m in ("adapters", "copies")}
    print(
        f"\npeak memory, {args.n_agents} agents ({mem['device']}"
        + (
            f"; net of the {base:.3f} GiB a process with the same imports and no model takes):"
            if base
            else "):"
        )
    )
    print(f"  {args.n_agents} adapters on one base  {net['adapters']:7.3f} GiB")
    print(f"  {args.n_agents} model copies          {net['copies']:7.3f} GiB   "
          f"ratio {net['copies'] / net['adapters']:.2f}x")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), **split, **sync, **mem}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
