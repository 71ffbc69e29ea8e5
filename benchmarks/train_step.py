"""What one training iteration costs, how fast the update is, and what syncing adapters instead of
weights saves. In one run:

1. the time split of an iteration (rollout / reward / update / sync), from a short real training run;
2. the update's throughput on one real batch of debates, side by side with a bare PEFT forward +
   backward over the same sequences (same model, adapter and tokens, a plain sum-of-log-probs loss:
   the practical limit), and the padding fraction of its forward passes, for the update as it is
   ("after") and the strategy it replaced ("before", kept here only for the comparison: every round a
   sequence of its own, a fixed 8 sequences per left-padded pass, a reference pass per agent);
3. getting new weights into the rollout engine: loading an adapter (PEFT ``load_adapter`` into a live
   HF model; with ``--vllm`` also a new LoRA id in a running vLLM engine) against loading the full
   model again (``from_pretrained``; with ``--vllm`` a new engine);
4. peak memory of N agents as N adapters on one base model against N copies of the model
   (each measured in a fresh subprocess: peak RSS (VmHWM) on CPU, peak CUDA memory on GPU).

    python benchmarks/train_step.py                      # SmolLM2-135M, N=3, T=1, CPU
    python benchmarks/train_step.py --only update        # the update's throughput alone
    python benchmarks/train_step.py --vllm --n_agents 3  # also the vLLM engine (needs vllm)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from udpo.env.run_folder import RunFolder

MEMORY_PROBE = """
import json, resource, sys, torch
from transformers import AutoModelForCausalLM
from udpo.env.models import resolve_model
from udpo.training.memory import status_bytes
from udpo.training.policy import MultiAgentPolicy
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
    peak = status_bytes("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
peak = torch.cuda.max_memory_allocated() if cuda else host_peak()
print(json.dumps({"peak_bytes": peak, "device": "cuda" if cuda else "cpu"}))
"""


#: the update measurement's modes (``--update-modes``), in the order each repeat runs them
UPDATE_MODES = ("bare_rounds", "before", "after", "bare_packed")


def wait_for_gpu() -> None:
    """Wait for the GPU's queued work (nothing on a CPU), so that a timer reads what was run."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, repeat: int = 3) -> float:
    """Median wall-clock seconds of ``fn()``."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def bench_config(args, out: Path, iterations: int):
    from udpo.config import TrainConfig

    return TrainConfig(
        model=args.model, task="arithmetic", task_options={"difficulty": 1, "n_questions": 40},
        n_agents=args.n_agents, rounds=args.rounds, max_tokens=args.max_tokens,
        questions_per_iteration=args.questions, debates_per_question=1, max_iterations=iterations, eval_questions=0,
        warmup_fraction=0.0, alpha=[0.3], beta=[0.3], gamma=[0.3], lambda_=[1.0], eta=[0.01],
        learning_rate=1e-4, warmup_steps=0, output_dir=str(out), save_steps=10_000, progress=False,
        hf_decode=args.decode,
    )  # fmt: skip


def iteration_split(args, out: Path) -> dict[str, float]:
    from udpo.training.trainer import Trainer

    trainer = Trainer(bench_config(args, out / "run", args.iterations))
    trainer.train()
    trainer.close()
    records = [json.loads(line) for line in RunFolder(out / "run").metrics.read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"][1:] or [r for r in records if r["kind"] == "train"]
    keys = ("time/rollout", "time/reward", "time/update", "time/sync")
    split = {k.split("/")[1]: sum(r[k] for r in train) / len(train) for k in keys}
    split["tokens_per_s"] = sum(r["tokens_per_s"] for r in train) / len(train)
    return split


# the update ----------------------------------------------------------------------------------------------
def old_forward_logprobs(model, rows, pad: int, counts: list[int]) -> list[torch.Tensor]:
    """The replaced forward pass: rows left-padded to the longest, logits of the last completion-length
    positions; adds [positions, real tokens] to ``counts``."""
    width = max(len(p) + len(c) for p, c in rows)
    keep = max(len(c) for _, c in rows) + 1
    device = model.device
    ids = torch.tensor([[pad] * (width - len(p) - len(c)) + p + c for p, c in rows], device=device)
    mask = torch.tensor(
        [[0] * (width - len(p) - len(c)) + [1] * (len(p) + len(c)) for p, c in rows], device=device
    )
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep, use_cache=False
    ).logits
    picked = torch.cat([logits[b, keep - 1 - len(c) : keep - 1] for b, (_, c) in enumerate(rows)]).float()
    targets = torch.tensor([t for _, c in rows for t in c], device=device)
    logp = picked.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(picked, dim=-1)
    counts[0], counts[1] = counts[0] + ids.numel(), counts[1] + int(mask.sum())
    return list(logp.split([len(c) for _, c in rows]))


def old_token_logprobs(policy, agent, prompts, completions, reference, counts, batch_size=8):
    """The replaced ``token_logprobs``: every round alone, ``batch_size`` sequences per pass by length."""
    model = policy._set_active(agent)
    grad = torch.is_grad_enabled() and not reference
    model.train(grad)
    out = [None] * len(prompts)
    order = sorted(range(len(prompts)), key=lambda k: len(prompts[k]) + len(completions[k]))
    pad = policy.tokenizer_of(agent).pad_token_id
    with torch.set_grad_enabled(grad):
        for s in range(0, len(order), batch_size):
            chunk = [k for k in order[s : s + batch_size] if completions[k]]
            rows = [(list(prompts[k]), list(completions[k])) for k in chunk]
            if reference:
                with model.disable_adapter():
                    logps = old_forward_logprobs(model, rows, pad, counts)
            else:
                logps = old_forward_logprobs(model, rows, pad, counts)
            for k, lp in zip(chunk, logps, strict=True):
                out[k] = lp
    model.eval()
    return out


def old_update(trainer, batch, advantages, counts: list[int]) -> None:
    """The replaced update loop (one process, one micro-batch, one epoch): per agent, a reference pass,
    a pass with gradients whose values become the behavior log-probs, the loss, backward; one step."""
    from udpo.algorithms.base import Behavior

    total = len(batch)
    for agent in range(trainer.config.n_agents):
        prompts, completions = batch.agent_sequences(agent)
        flat = old_token_logprobs(trainer.policy, agent, prompts, completions, False, counts)
        with torch.no_grad():
            ref = batch.per_debate(
                agent, old_token_logprobs(trainer.policy, agent, prompts, completions, True, counts)
            )
        logp = batch.per_debate(agent, flat)
        behavior = Behavior([lp.detach().float() for lp in logp], [None] * total)
        loss, _ = trainer.algorithm.loss(batch, agent, logp, behavior, ref, advantages.values[:, agent])
        trainer.updater._backward(loss)
    trainer.updater.step(0, trainer._fail_non_finite)


def bare_pass(policy, sequences_of) -> None:
    """A bare PEFT forward + backward per sequence (no padding): -sum of the completion tokens'
    log-probs under the agent's adapter. ``sequences_of(agent)``: (ids, [(start, length), ...]) rows."""
    for agent in range(policy.n_agents):
        model = policy._set_active(agent)
        model.train()
        for ids, spans in sequences_of(agent):
            scored = [q for start, n in spans for q in range(start, start + n)]
            keep = torch.tensor([q - 1 for q in scored], device=model.device)  # logit q - 1 predicts token q
            logits = model(input_ids=torch.tensor([ids], device=model.device), logits_to_keep=keep).logits[0]
            logp = logits.float().log_softmax(-1)
            targets = torch.tensor([ids[q] for q in scored], device=model.device)
            (-logp[torch.arange(len(scored), device=model.device), targets].sum()).backward()
        model.eval()
    for p in policy.trainable_parameters():
        p.grad = None


def update_throughput(args, out: Path) -> dict[str, float]:
    """Median seconds of the update before / after and of the bare passes on one real batch, run
    interleaved ``args.repeats`` times so that other load on the machine hits all of them alike."""
    from udpo.training.logprobs import plan_passes
    from udpo.training.trainer import Trainer

    trainer = Trainer(bench_config(args, out / "update", 1))
    trainer.use_calibration(trainer.calibrate()[0])
    fresh = trainer.debate(trainer.schedule.for_iteration(1), {"phase": "benchmark"})
    batch = trainer.rollout_batch(fresh)
    advantages = trainer.algorithm.advantages(batch)
    policy = trainer.policy

    def per_round(agent):
        prompts, completions = batch.agent_sequences(agent)
        return [
            (list(p) + list(c), [(len(p), len(c))]) for p, c in zip(prompts, completions, strict=True) if c
        ]

    def packed(agent):
        rows, _ = plan_passes(*batch.agent_sequences(agent), batch_size=1, token_budget=1)
        return [(r.ids, [(start, n) for _, start, n in r.spans]) for r in rows]

    def bare(sequences_of) -> None:  # under the trainer's autocast (bf16 where the update runs in bf16)
        with trainer.accelerator.autocast():
            bare_pass(policy, sequences_of)

    counts = [0, 0]
    every = {
        "bare_rounds": lambda: bare(per_round),
        "before": lambda: old_update(trainer, batch, advantages, counts),
        "after": lambda: trainer.update(batch, advantages, fresh_count=len(batch), iteration=1),
        "bare_packed": lambda: bare(packed),
    }
    modes = {m: run for m, run in every.items() if m in args.update_modes.split(",")}
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.repeats):
        for name, run in modes.items():
            wait_for_gpu()
            start = time.perf_counter()
            run()
            wait_for_gpu()
            times[name].append(time.perf_counter() - start)
    trainer.close()
    result = {f"{m}_s": statistics.median(t) for m, t in times.items()}
    pairs = [(m, "bare_rounds") for m in ("before", "after", "bare_packed")] + [("after", "bare_packed")]
    for m, base in pairs:
        if m in times and base in times:  # per-repeat ratios: robust to load that drifts
            key = f"{m}_vs_bare" if base == "bare_rounds" else f"{m}_vs_{base}"
            result[key] = statistics.median(b / t for b, t in zip(times[base], times[m], strict=True))
    result["tokens"] = sum(
        len(p) + len(c) for a in range(args.n_agents) for p, c in zip(*batch.agent_sequences(a), strict=True)
    )
    result["completion_tokens"] = sum(
        len(c) for a in range(args.n_agents) for c in batch.agent_sequences(a)[1]
    )
    if "before" in times:
        result["before_padding"] = 1 - counts[1] / counts[0]
    if "after" in times:
        result["after_padding"] = policy.forward_stats.padding  # of the last update
    result["debates"] = len(batch)
    return result


def sync_vs_reload(args, out: Path) -> dict[str, float]:
    from transformers import AutoModelForCausalLM

    from udpo.env.backends.hf import HFBackend
    from udpo.env.models import resolve_model
    from udpo.training.policy import MultiAgentPolicy

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
    parser.add_argument(
        "--repeats", type=int, default=3, help="interleaved repeats of each update measurement"
    )
    parser.add_argument(
        "--update-modes",
        default=",".join(UPDATE_MODES),
        help="the update measurement's modes, comma-separated (default: all): " + ", ".join(UPDATE_MODES),
    )
    parser.add_argument(
        "--decode",
        choices=["auto", "eager", "stacked", "graph"],
        default="auto",
        help="the rollouts' decode path (hf_decode); --only update needs no compiled one: eager skips the "
        "CUDA graph's compiles (tens of seconds each on a GPU)",
    )
    parser.add_argument("--only", choices=["iteration", "update", "sync", "memory"], default=None)
    parser.add_argument("--vllm", action="store_true", help="also time a vLLM engine (needs vllm)")
    parser.add_argument("--json", default=None, help="also write the numbers to this file")
    args = parser.parse_args()
    unknown = set(args.update_modes.split(",")) - set(UPDATE_MODES)
    if unknown:
        parser.error(f"--update-modes: unknown {', '.join(sorted(unknown))}; use {', '.join(UPDATE_MODES)}")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parts = [args.only] if args.only else ["iteration", "update", "sync", "memory"]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if "iteration" in parts:
            results["iteration"] = iteration_split(args, Path(tmp))
        if "update" in parts:
            results["update"] = update_throughput(args, Path(tmp))
        if "sync" in parts:
            results["sync"] = sync_vs_reload(args, Path(tmp))
    if "memory" in parts:
        results["memory"] = memory(args)

    print(f"model {args.model}, N={args.n_agents}, T={args.rounds}, {args.questions} questions/iteration, "
          f"max_tokens {args.max_tokens}, torch threads {torch.get_num_threads()}, "
          f"device {'cuda' if torch.cuda.is_available() else 'cpu'}")  # fmt: skip
    if "iteration" in results:
        split = results["iteration"]
        total = sum(split[k] for k in ("rollout", "reward", "update", "sync"))
        print(
            f"\niteration time split (mean of {max(args.iterations - 1, 1)} iterations, {total:.2f} s each):"
        )
        for k in ("rollout", "reward", "update", "sync"):
            print(f"  {k:8s} {split[k]:8.3f} s  {100 * split[k] / total:5.1f} %")
        print(f"  rollout throughput {split['tokens_per_s']:.1f} generated tokens/s")
    if "update" in results:
        u = results["update"]
        print(f"\nupdate on one batch of {u['debates']} debates ({u['tokens']} tokens: every round's prompt + "
              f"completion, all agents; {u['completion_tokens']} completion tokens), median of {args.repeats} "
              f"interleaved repeats:")  # fmt: skip
        print(f"  {'':40s} {'seconds':>8s} {'tokens/s':>9s} {'x bare':>7s} {'padding':>8s}")
        rows = [
            ("bare PEFT forward+backward, every round", "bare_rounds", None),
            ("update before (old strategy)", "before", "before_padding"),
            ("update after", "after", "after_padding"),
            ("bare PEFT forward+backward, packed rows", "bare_packed", None),
        ]
        ratios = {**u, "bare_rounds_vs_bare": 1.0}
        for label, key, padding in rows:
            if f"{key}_s" not in u:
                continue
            ratio = f"{ratios[f'{key}_vs_bare']:.2f}" if f"{key}_vs_bare" in ratios else "-"
            print(f"  {label:40s} {u[f'{key}_s']:8.2f} {u['tokens'] / u[f'{key}_s']:9.1f} {ratio:>7s} "
                  f"{'' if padding is None else f'{100 * u[padding]:7.1f}%':>8s}")  # fmt: skip
        if "bare_rounds_s" in u:
            print(
                "  (x bare: median over repeats of bare-every-round seconds / this row's seconds, from the same repeat)"
            )
        if "after_vs_bare_packed" in u:
            print(
                f"  the update / a bare forward + backward over the same packed rows: {u['after_vs_bare_packed']:.2f}x"
            )
    if "sync" in results:
        sync = results["sync"]
        print(f"\nnew weights into the engine ({args.n_agents} adapters):")
        print(f"  hf: save + load_adapter  {sync['hf_adapters_s']:8.3f} s")
        print(f"  hf: from_pretrained      {sync['hf_full_model_s']:8.3f} s   "
              f"ratio {sync['hf_full_model_s'] / sync['hf_adapters_s']:.1f}x")  # fmt: skip
        if args.vllm:
            print(f"  vllm: new LoRA ids       {sync['vllm_adapters_s']:8.3f} s")
            print(f"  vllm: new engine         {sync['vllm_new_engine_s']:8.3f} s   "
                  f"ratio {sync['vllm_new_engine_s'] / sync['vllm_adapters_s']:.1f}x")  # fmt: skip
    if "memory" in results:
        mem = results["memory"]
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
        Path(args.json).write_text(json.dumps({"args": vars(args), **results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
