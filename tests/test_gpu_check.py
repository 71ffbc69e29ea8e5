"""scripts/gpu_check.sh and what it runs, on CPU (issue 42): the script parses and skips its GPU-only parts
with a line saying so; the 7B shape is Llama-2-7B's and is built in memory, nothing but its config and
tokenizer on disk; benchmarks/iteration.py and benchmarks/study_plan.py run to completion on a tiny model
(slow: each starts processes or trains). The figures themselves need a GPU (docs/training.md)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU_CHECK = ROOT / "scripts" / "gpu_check.sh"


def script(path: Path):
    """The module of a script that is not on the path (scripts/, benchmarks/), loaded from its file."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def check_model():
    return script(ROOT / "scripts" / "check_model.py")


def test_gpu_check_parses_and_says_what_it_skips_without_a_gpu():
    subprocess.run(["bash", "-n", str(GPU_CHECK)], check=True)
    text = GPU_CHECK.read_text()
    assert 'benchmarks/iteration.py --config "$recipe" --shape 7b' in text
    assert 'benchmarks/study_plan.py --model "$model" --workers 2' in text
    assert "skipped (GPU only, not with --quick)" in text


def test_the_7b_shape_is_built_in_memory_with_only_its_config_and_tokenizer_on_disk(check_model, tmp_path):
    import torch

    # two of its 32 layers (check_model.LAYERS), on the meta device: the shape without the bytes
    model, tokenizer = check_model.build_in_memory(tmp_path / "m7b", 2, vocab=512, shape="7b", device="meta")
    config = model.config
    assert (config.hidden_size, config.intermediate_size, check_model.LAYERS["7b"]) == (4096, 11008, 32)
    assert (config.num_attention_heads, config.num_key_value_heads) == (32, 32)
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    assert layer == 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    assert 6.4e9 < 32 * layer < 6.5e9  # Llama-2-7B's layers (its vocabulary is the small one trained here)
    assert next(model.parameters()).dtype == torch.bfloat16
    assert sorted(p.name for p in (tmp_path / "m7b").iterdir() if p.suffix in (".json", ".safetensors")) == [
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert model.name_or_path == str(tmp_path / "m7b") and tokenizer.chat_template


@pytest.mark.slow
def test_one_iteration_of_a_shape_built_in_memory_runs_on_cpu(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "task: arithmetic\ntask_options: {difficulty: 1, n_questions: 40}\nn_agents: 3\nrounds: 1\n"
        "max_tokens: 4\nquestions_per_iteration: 1\ndebates_per_question: 1\nbackend: hf\ndtype: fp32\n"
        "eval_questions: 0\n"
        "warmup_fraction: 0.0\nalpha: [0.3]\nbeta: [0.3]\ngamma: [0.3]\nlambda_: [1.0]\neta: [0.01]\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/iteration.py",
            "--config",
            str(recipe),
            "--layers",
            "1",
            "--iterations",
            "1",
            "--out",
            str(tmp_path / "out"),
            "--json",
            str(tmp_path / "iteration.json"),
            "--profile-update",
            str(tmp_path / "figures" / "update_profile_1b_n3.json"),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "UDPO_NUM_THREADS": "1"},
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "135m shape, 1 layers" in done.stdout and "built on cpu" in done.stdout
    assert "iteration 1: rollout" in done.stdout and "update_rss_peak_gib" in done.stdout
    assert not list((tmp_path / "out" / "model").glob("*.safetensors"))  # no weights written
    record = json.loads((tmp_path / "iteration.json").read_text())
    assert (record["shape"], record["layers"], record["device"], record["n_agents"]) == ("135m", 1, "cpu", 3)
    assert len(record["iterations"]) == 1 and record["after_first"] is None  # one iteration: nothing after it
    assert record["iterations"][0]["iteration"] > 0 and "update_rss_peak_gib" in record["iterations"][0]
    # the last update once more under the profiler, outside the timed figures (still one iteration above)
    assert "profiled on cpu: wall" in done.stdout
    profile = json.loads((tmp_path / "figures" / "update_profile_1b_n3.json").read_text())
    assert profile["device"] == "cpu" and profile["device_busy_s"] is None and profile["wall_s"] > 0
    assert profile["unprofiled_update_s"] == record["iterations"][0]["update"]
    steps = ["reference", "fresh_logprobs", "record", "step", "stats"]
    steps += [f"{kind}/agent_{i}" for kind in ("forward", "loss", "backward") for i in range(3)]
    assert set(profile["phases"]) == {f"update/{step}" for step in steps}  # one micro-batch per agent
    assert all(p["count"] >= 1 and p["host_s"] > 0 for p in profile["phases"].values())
    forward = profile["forward"]  # the reference passes and each agent's
    assert forward["passes"] >= 4 and forward["tokens"] <= forward["positions"] and forward["padding"] >= 0
    assert (forward["rows_per_pass"], forward["micro_batches"]) == (8, 1) and forward[
        "positions_per_pass"
    ] > 0
    # the check model's random debates pack: fewer rows than completions (a row per completion: none shared)
    assert 0 < forward["rows"] < forward["completions"]
    mm = next(op for op in profile["top_ops"] if op["name"] == "aten::mm")
    assert mm["count"] > 0 and mm["self_cpu_s"] > 0 and mm["self_device_s"] is None
    # a small trace comes back beside it, gzipped
    assert (
        profile["trace_bytes"] == (tmp_path / "figures" / "update_profile_1b_n3.trace.json.gz").stat().st_size
    )
    row = script(ROOT / "benchmarks" / "gpu_targets.py").profile_row(profile)
    assert row.measured.startswith(
        f"wall {profile['wall_s']:.2f} s on cpu, no device activity recorded; top op "
    )
    assert "reference " in row.measured and f"{forward['passes']} log-prob passes" in row.measured


def test_the_check_models_random_debates_pack_like_a_real_models(check_model, tmp_path):
    """The check model's tokenizer is word-level so that any completion of the random model, decoded as the
    hf backend decodes it (special tokens dropped) and put back into the conversation by the chat template,
    re-encodes to the tokens generated: the next round's prompt starts with this round's prompt and
    completion, and the update packs the rounds as it does a real model's (a byte-level BPE packed none)."""
    import random

    from udpo.env.backends.chat import chat_prompt_ids

    _, tokenizer = check_model.build_in_memory(tmp_path / "m", 1, shape="135m", device="meta")
    opening = [
        {"role": "system", "content": "You are a careful calculator; show each step."},
        {"role": "user", "content": "What is 417 + 385? Put the final answer in \\boxed{}."},
    ]
    first = chat_prompt_ids(tokenizer, opening)
    assert tokenizer.convert_ids_to_tokens(first[:2]) == ["<|im_start|>", "system"]
    eos = tokenizer.eos_token_id
    specials = set(tokenizer.all_special_ids) - {eos}
    rng = random.Random(0)

    def packs(completion: list[int]) -> bool:
        if eos in completion:  # generation stops at the end-of-turn token
            completion = completion[: completion.index(eos) + 1]
        text = tokenizer.decode(completion, skip_special_tokens=True)
        reply = [
            {"role": "assistant", "content": text},
            {"role": "user", "content": "Others said 802. Again?"},
        ]
        following = chat_prompt_ids(tokenizer, opening + reply)
        return following[: len(first) + len(completion)] == first + completion

    words = [t for t in range(len(tokenizer)) if t not in specials]
    assert all(packs(rng.choices(words, k=64)) for _ in range(200))  # no special token inside: every one
    uniform = [packs(rng.choices(range(len(tokenizer)), k=64)) for _ in range(400)]
    assert sum(uniform) / len(uniform) > 0.85  # a random model's: only a special token inside breaks it


@pytest.mark.slow
def test_a_shortened_study_plan_runs_on_two_workers_and_prints_its_wall_time(check_model, tmp_path):
    model = check_model.build(tmp_path / "model", layers=1)
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/study_plan.py",
            "--model",
            model,
            "--workers",
            "2",
            "--iterations",
            "1",
            "--eval-questions",
            "2",
            "--out",
            str(tmp_path / "out"),
            "--json",
            str(tmp_path / "study.json"),
            "max_tokens",
            "4",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "worker 0: pid" in done.stdout and "GPU memory share 0.5 (on CUDA)" in done.stdout
    assert "task_only seed_0: median iteration" in done.stdout
    assert "2 runs x 1 iterations, 2 held-out questions, 2 workers: wall time" in done.stdout
    record = json.loads((tmp_path / "study.json").read_text())
    assert (record["runs"], record["iterations"], record["workers"]) == (2, 1, 2) and record["wall_s"] > 0
    assert sorted(record["medians"]) == ["coin_control seed_0", "task_only seed_0"]


def write(folder: Path, name: str, record: dict) -> None:
    (folder / f"{name}.json").write_text(json.dumps(record))


def iteration(seconds: float, peak: float) -> dict:
    return {
        "rollout": seconds - 1.0,
        "reward": 0.0,
        "update": 1.0,
        "sync": 0.0,
        "iteration": seconds,
        "peak_gib": peak,
    }


def test_the_targets_table_compares_each_figure_with_its_goal_and_names_what_was_not_measured(tmp_path):
    targets = script(ROOT / "benchmarks" / "gpu_targets.py")
    load, render, table = targets.load, targets.render, targets.table
    decode = [
        {"path": "auto (graph)", "adapters": 3, "tokens_per_s": 14000.0},
        {"path": "graph_static", "adapters": 3, "tokens_per_s": 14700.0, "first_call": 41.23},
        {"path": "stacked", "adapters": 3, "tokens_per_s": 7000.0},
        {"path": "eager", "adapters": 3, "tokens_per_s": 2000.0},
        {"path": "generate(static)", "adapters": 0, "tokens_per_s": 21000.0},
    ]
    write(tmp_path, "decode_135m", {"device": "NVIDIA H100 80GB HBM3", "results": decode})
    plan = {"plan_held_gib": 3.0, "plan_activations_gib": 2.0, "plan_free_gib": 70.0}
    n3 = [{**iteration(30.0, 5.0), "update_peak_gib": 5.4}, {**iteration(2.5, 5.5), "update_peak_gib": 5.6},
          iteration(2.9, 5.2)]  # fmt: skip
    # N = 3's plan set 0.5 GiB aside for the decode buffers; N = 10's record is older, without it
    write(tmp_path, "iteration_1b_n3", {"iterations": n3, "after_first": iteration(2.7, 5.5),
                                         "iterations_asked": 3, **plan, "plan_kept_gib": 0.5})  # fmt: skip
    # N = 10 ran out of memory in its second iteration: the first is kept, with the error
    write(tmp_path, "iteration_1b_n10", {"iterations": [{**iteration(40.0, 7.0), "update_peak_gib": 6.0}],
                                          "iterations_asked": 2, "error": "OutOfMemoryError: CUDA out of memory",
                                          **plan})  # fmt: skip
    write(
        tmp_path, "update_1b", {"update": {"after_s": 2.0, "bare_packed_s": 1.8, "after_vs_bare_packed": 0.9}}
    )
    study = {"wall_s": 95.0, "runs": 2, "iterations": 2, "workers": 2, "share_gib": 40.0,
             "peaks_gib": {"task_only seed_0": 12.5, "coin_control seed_0": 41.0}}  # fmt: skip
    write(tmp_path, "study", study)
    profile = {"device": "NVIDIA H100 80GB HBM3", "wall_s": 9.0, "device_busy_s": 2.25, "idle_share": 0.75,
               "unprofiled_update_s": 6.5, "launches": 41000, "syncs": {"count": 1200, "seconds": 3.1},
               "top_ops": [{"name": "aten::mm", "count": 5200, "self_device_s": 1.4, "self_cpu_s": 0.8}],
               "phases": {"update/reference": {"host_s": 0.5, "device_s": 0.3},
                          "update/forward/agent_0": {"host_s": 1.0, "device_s": 0.2},
                          "update/forward/agent_1": {"host_s": 1.5, "device_s": 0.25},
                          "update/backward/agent_0": {"host_s": 2.0, "device_s": 0.9},
                          "update/step": {"host_s": 0.05, "device_s": 0.01}},
               "forward": {"passes": 9, "positions": 150000, "tokens": 120000, "padding": 0.2, "rows_per_pass": 8,
                           "positions_per_pass": 65536, "rows": 96, "completions": 288}}  # fmt: skip
    write(tmp_path, "update_profile_1b_n3", profile)
    (tmp_path / "update_7b.json").write_text("{not json")  # a file cut short: left out, not fatal
    log = (
        "V1127 [__recompiles] Recompiling function forward in static_decode.py:120\n"
        "    triggered by the following guard failure(s):\n"
        "    - 0/0: tensor 'buf.tokens' size mismatch at index 0. expected 96, actual 48\n"
        "V1127 [__recompiles] Recompiling function forward in static_decode.py:120\n"
        "    triggered by the following guard failure(s):\n"
        "    - 0/1: tensor 'buf.tokens' size mismatch at index 0. expected 96, actual 48\n"
        "V1127 [__graph_breaks] Graph break in user code at decoding.py:40\n"
        "W1127 [0/8] torch._dynamo hit config.recompile_limit (8)\n"
    )
    rows = {r.what: r for r in table(load(tmp_path), log)}
    what = "rollout tokens/s, 135M shape, {} / generate(static) compiled, no adapters"
    graph3 = rows[what.format("auto (graph), 3 adapters")]
    assert graph3.measured.startswith("0.67x") and graph3.met is False  # 14000 / 21000 < 0.7
    static = rows[what.format("graph_static, 3 adapters")]  # the first call (a compile) beside the rate
    assert static.measured == "0.70x (14,700 / 21,000); first call 41.2 s" and static.met is None
    stacked = rows[what.format("stacked, 3 adapters")]
    assert stacked.measured.startswith("0.33x") and stacked.met is None  # reported beside it, no goal
    assert rows[what.format("eager, 3 adapters")].measured.startswith("0.10x")
    assert rows[
        "rollout tokens/s, 1B shape, 3 adapters / generate(static) compiled, no adapters"
    ].measured == ("not measured")
    it = rows["1B shape, N = 3 iteration (median after the first)"]
    assert it.measured == "2.70 s (rollout 1.70, update 1.00); first iteration 30.0 s" and it.met is True
    profiled = rows["1B N = 3 update, profiled (once more, on the last iteration's debates)"]
    assert profiled.measured == (  # the agents' forward passes summed; steps by their larger time
        "device busy 2.25 s of 9.00 s wall (75% idle; un-profiled 6.50 s); 41,000 kernel launches, "
        "1,200 host syncs (3.10 s); top op aten::mm 1.40 s (x5,200); host / device s: forward 2.50 / 0.45, "
        "backward 2.00 / 0.90, reference 0.50 / 0.30, step 0.05 / 0.01; 9 log-prob passes (at most 8 rows / "
        "65,536 positions each), 150,000 positions (20% padding), 96 rows for 288 completions (rounds "
        "sharing a row)"
    )
    failed = targets.profile_row({"error": "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"})
    assert failed.measured == "failed: RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"  # the run itself is fine
    recompiles = rows["1B shape, N = 3 run: dynamo recompiles / graph breaks (TORCH_LOGS)"]
    assert recompiles.measured == (
        "2 recompiles, 1 graph breaks (most: tensor 'buf.tokens' size mismatch at index 0. expected 96, actual 48)"
        "; recompile_limit hit: some calls ran uncompiled"
    )
    n3_runs = rows["1B shape, N = 3: trains with the default sizes"]
    assert n3_runs.measured == "3 of 3 iterations, peak 5.5 GiB" and n3_runs.met is True
    n3_plan = rows[
        "1B shape, N = 3: update peak / the plan autosize printed (held + decode buffers + estimated activations)"
    ]
    # held 3.0 + decode buffers 0.5 + activations 2.0
    assert n3_plan.measured.startswith("1.02x (5.6 / 5.5 GiB") and n3_plan.met is True
    n10 = rows["1B shape, N = 10: trains with the default sizes"]
    assert n10.measured == "1 of 2 iterations, peak 7.0 GiB; OutOfMemoryError: CUDA out of memory"
    assert n10.met is False
    n10_plan = rows[
        "1B shape, N = 10: update peak / the plan autosize printed (held + decode buffers + estimated activations)"
    ]
    assert n10_plan.measured.startswith("1.20x") and n10_plan.met is False  # over by more than 10%
    assert rows["7B shape, N = 3: trains with the default sizes"].measured == "not measured"
    assert rows["7B shape, N = 3: trains with the default sizes"].met is None
    assert rows[
        "1B shape: the update / a bare PEFT forward + backward over the same packed rows"
    ].measured.startswith("0.90x")
    wall = rows["the proof study plan, shortened (runs x iterations, workers sharing the GPU): wall time"]
    assert wall.measured == "95 s (2 runs x 2, 2 workers)"
    share = rows["study workers: the largest run's peak / its share of the card"]
    assert share.measured == "1.02x (41.0 / 40.0 GiB)" and share.met is False
    text = render(
        table(load(tmp_path)),
        "NVIDIA H100 80GB HBM3",
        left=["7b", "paths"],
        rerun="bash x.sh --parts 7b,paths",
    )
    assert (
        text.startswith("GPU targets on NVIDIA H100 80GB HBM3") and "| **no** |" in text and "| yes |" in text
    )
    assert text.rstrip().endswith(
        "Parts left out (the budget): 7b, paths. Run them with:\n\n    bash x.sh --parts 7b,paths"
    )


def test_a_cuda_profile_splits_device_time_by_step_and_counts_launches_syncs_and_idle_time():
    """benchmarks/profiling.py's breakdown of profiler events laid out as a CUDA profile lays them out
    (microseconds): a kernel's time goes to the step its operator started in, on any thread (backward's
    operators run on autograd's device thread); a sync is named by the operator that waited; the
    device-side copy of a label, which spans idle time, is no device work."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import EventList, FunctionEvent

    profiling = script(ROOT / "benchmarks" / "profiling.py")
    made = []

    def event(name, start, end, thread=1, device=DeviceType.CPU, kernels=(), label=False):
        e = FunctionEvent(len(made), name, thread, start, end, stack=[], input_shapes=[], use_device="cuda",
                          device_type=device, is_user_annotation=label)  # fmt: skip
        for kernel, duration in kernels:
            e.append_kernel(kernel, 0, duration)
        made.append(e)

    cuda = DeviceType.CUDA
    event("update/forward/agent_0", 0, 100, label=True)
    event("aten::mm", 10, 20, kernels=[("gemm", 30)])
    event("cudaLaunchKernel", 12, 15)
    event("gemm", 20, 50, device=cuda)
    event("update/forward/agent_0", 20, 89, device=cuda, label=True)  # the label's device-side span
    event("aten::_local_scalar_dense", 60, 90, kernels=[("Memcpy DtoH", 2)])  # .item()
    event("cudaMemcpyAsync", 61, 63)
    event("cudaStreamSynchronize", 63, 89)
    event("Memcpy DtoH", 87, 89, device=cuda)
    event("update/backward/agent_0", 100, 200, label=True)
    event("aten::mm", 110, 130, thread=2, kernels=[("gemm", 40)])  # autograd's thread
    event("cudaLaunchKernel", 115, 118, thread=2)
    event("gemm", 130, 170, device=cuda)
    event("aten::add_", 210, 215, kernels=[("add", 5)])  # after the last label
    event("cudaLaunchKernel", 211, 213)
    event("add", 215, 220, device=cuda)
    events = EventList(made, use_device="cuda")
    events._build_tree()
    result = profiling.breakdown(events, 250e-6, "update/", cuda=True)
    assert result["device_busy_s"] == pytest.approx((30 + 2 + 40 + 5) * 1e-6)
    assert result["idle_share"] == pytest.approx(1 - 77 / 250)
    assert result["launches"] == 3
    assert result["syncs"] == {"count": 1, "seconds": pytest.approx(26e-6),
                               "by_operator": {"aten::_local_scalar_dense": 1}}  # fmt: skip
    phases = result["phases"]
    assert phases["update/forward/agent_0"] == pytest.approx(
        {"count": 1, "host_s": 100e-6, "device_s": 32e-6, "syncs": 1, "sync_s": 26e-6}
    )
    assert phases["update/backward/agent_0"] == pytest.approx(
        {"count": 1, "host_s": 100e-6, "device_s": 40e-6, "syncs": 0, "sync_s": 0}
    )
    assert phases["(outside the labels)"]["device_s"] == pytest.approx(5e-6)
    top = [(op["name"], op["count"], op["self_device_s"]) for op in result["top_ops"][:3]]
    assert top == [("aten::mm", 2, pytest.approx(70e-6)), ("aten::add_", 1, pytest.approx(5e-6)),
                   ("aten::_local_scalar_dense", 1, pytest.approx(2e-6))]  # fmt: skip
    kernels = [(k["name"], k["count"]) for k in result["top_kernels"]]
    assert kernels == [("gemm", 2), ("add", 1), ("Memcpy DtoH", 1)]  # no label among them
    text = profiling.table({"device": "a GPU", **result})
    assert "device busy 0.000 s (69% idle), 3 kernel launches, 1 host syncs" in text


def test_the_iteration_benchmark_writes_its_figures_after_every_iteration(tmp_path):
    """benchmarks/iteration.py's watcher: each iteration the run logs is handed on as it lands (a line
    still being written waits for the next look), so a run stopped mid-way keeps what it finished."""
    import threading

    sys.path.insert(0, str(ROOT / "benchmarks"))
    iteration_py = script(ROOT / "benchmarks" / "iteration.py")
    run = tmp_path / "run"
    run.mkdir()
    seen: list[int] = []
    stop = threading.Event()
    watcher = threading.Thread(
        target=iteration_py.watch, args=(run, lambda t: seen.append(len(t)), stop, 0.01)
    )
    watcher.start()
    record = {"kind": "train", "iteration": 1}
    try:
        assert iteration_py.done_records(run) == []  # no metrics file yet
        (run / "metrics.jsonl").write_text(json.dumps(record) + "\n" + '{"kind": "tr')  # one and a half
        stop.wait(0.2)
        assert seen == []  # the file does not parse yet: nothing handed on
        lines = [json.dumps({**record, "iteration": k}) for k in (1, 2)]
        (run / "metrics.jsonl").write_text("\n".join([*lines, json.dumps({"kind": "eval"})]) + "\n")
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            stop.wait(0.01)
    finally:
        stop.set()
        watcher.join()
    assert seen == [2]  # both iterations, handed on once


def run_check(*args, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``scripts/gpu_check.sh --quick ARGS`` on this CPU, with this interpreter as its ``python`` (and
    ``env`` added to the environment)."""
    return subprocess.run(
        ["bash", str(GPU_CHECK), "--quick", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={
            **os.environ,
            "GPU_CHECK_ALLOW_CPU": "1",
            "UDPO_NUM_THREADS": "1",
            "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            **(env or {}),
        },
        timeout=600,
    )


@pytest.mark.slow
def test_gpu_check_leaves_out_parts_that_would_not_fit_its_budget_and_names_the_command_for_them(tmp_path):
    """The script's frame on CPU: no part runs (each is expected to take longer than the 1 s budget; the
    model, named and absent, is never built or read), each says so, and the summary of what was measured
    (nothing) lands in --report, ending with the command for the parts left."""
    done = run_check("--out", tmp_path / "out", "--report", tmp_path / "report", "--model", tmp_path / "absent",
                     "--budget", 1, "--parts", "decode,7b,paths", "--rerun", "bash scripts/device_check.sh --budget 540")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "== decode: left out (expected ~60 s, " in done.stdout and "left of the budget of 1 s)" in done.stdout
    )
    assert "== 7b: skipped (GPU only, not with --quick)" in done.stdout
    assert "== paths: left out (expected ~300 s" in done.stdout
    assert "decode1b" not in done.stdout  # not asked for: no line
    assert (
        "parts left out: decode,paths; run them with:\n  bash scripts/device_check.sh --budget 540 --parts decode,paths"
        in (done.stdout)
    )
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert summary.startswith("GPU targets on an unnamed device") and summary.count("not measured") == 10
    assert summary.rstrip().endswith("bash scripts/device_check.sh --budget 540 --parts decode,paths")
    assert json.loads((tmp_path / "report" / "figures.json").read_text()) == {}


@pytest.mark.slow
def test_a_part_that_runs_past_the_budget_is_stopped_and_keeps_what_it_wrote(tmp_path):
    """Three parts, each told it needs 1 s (GPU_CHECK_EXPECT), more work than a 30 s budget holds: the part
    running at the budget is stopped, with every process it started, and the summary (rewritten while it
    ran and after) and the parts left say so. Which part that is depends on the machine: the budget counts
    the check's set-up (three Python starts importing torch: 5 s on a quiet 2-core machine, about 20 s
    beside two busy processes) and decode1b takes 14 s on a quiet one."""
    begin = time.monotonic()
    done = run_check("--out", tmp_path / "out", "--budget", 30, "--parts", "decode1b,decode,study",
                     env={"GPU_CHECK_EXPECT": "decode1b=1,decode=1,study=1"})  # fmt: skip
    assert time.monotonic() - begin < 90
    assert done.returncode == 0, done.stderr[-3000:]
    assert "== decode1b (" in done.stdout and "expected ~1 s)" in done.stdout
    stopped = re.search(r"== (\w+): STOPPED at the budget \(", done.stdout)
    assert stopped is not None, done.stdout[-3000:]
    left = re.search(r"parts left out: ([\w,]+); run them with:", done.stdout)
    assert left is not None and stopped.group(1) in left.group(1).split(",")
    summary = (tmp_path / "out" / "summary.md").read_text().rstrip()
    assert summary.endswith(f"--parts {left.group(1)}")
    running = subprocess.run(["pgrep", "-f", str(tmp_path / "out")], capture_output=True, text=True)
    assert running.stdout == ""  # nothing of the part still running


@pytest.mark.slow
def test_decode_and_update_figures_reach_the_targets_table(check_model, tmp_path):
    """The two benchmarks the GPU-only parts run that the tests above do not: decode.py's figures (here on
    CPU, the eager path under auto) become the table's rollout row; train_step.py runs only the update
    modes asked for and writes the update's ratio to a bare pass over the same packed rows."""
    model = check_model.build(tmp_path / "model", layers=1)
    figures = tmp_path / "figures"
    figures.mkdir()
    env = {**os.environ, "UDPO_NUM_THREADS": "1"}
    decode = [sys.executable, "benchmarks/decode.py", "--model", model, "--rows", "4", "--max-tokens", "4",
              "--paths", "auto", "--anchor", "--repeats", "1", "--json", str(figures / "decode_135m.json")]  # fmt: skip
    done = subprocess.run(decode, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((figures / "decode_135m.json").read_text())
    by = {(r["path"], r["adapters"]): r for r in record["results"]}
    assert set(by) == {("auto (eager)", 3), ("auto (eager)", 0), ("generate(static)", 0)}
    ratio = by["auto (eager)", 3]["tokens_per_s"] / by["generate(static)", 0]["tokens_per_s"]
    rows = {r.what: r for r in script(ROOT / "benchmarks" / "gpu_targets.py").table({"decode_135m": record})}
    row = rows[
        "rollout tokens/s, 135M shape, auto (eager), 3 adapters / generate(static) compiled, no adapters"
    ]
    assert row.measured.startswith(f"{ratio:.2f}x") and row.met == (ratio >= 0.7)

    update = [sys.executable, "benchmarks/train_step.py", "--only", "update", "--model", model, "--rounds", "1",
              "--questions", "1", "--max_tokens", "4", "--repeats", "1", "--update-modes", "after,bare_packed",
              "--json", str(tmp_path / "update.json")]  # fmt: skip
    done = subprocess.run(update, capture_output=True, text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads((tmp_path / "update.json").read_text())["update"]
    assert sorted(k for k in figures if k.endswith("_s")) == ["after_s", "bare_packed_s"]  # no other mode ran
    assert figures["after_vs_bare_packed"] == pytest.approx(figures["bare_packed_s"] / figures["after_s"])
    assert "update before" not in done.stdout and "over the same packed rows: " in done.stdout


@pytest.mark.slow
def test_a_failing_part_is_reported_and_the_parts_after_it_still_run(tmp_path):
    """A model folder that does not exist fails both parts asked for: the first's failure does not stop the
    check, the second runs and fails too, the summary names both and the script exits non-zero."""
    done = run_check("--out", tmp_path / "out", "--model", tmp_path / "absent", "--parts", "decode,paths")
    assert done.returncode != 0
    assert "== decode: FAILED (exit" in done.stdout and "== paths: FAILED (exit" in done.stdout
    assert done.stdout.index("== decode: FAILED") < done.stdout.index("== paths (")
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert summary.startswith(
        "GPU targets on an unnamed device; parts that FAILED (see the log): decode, paths"
    )
    assert done.stdout.rstrip().endswith("FAILED: decode paths")
