#!/usr/bin/env bash
# scripts/gpu_check.sh on a GPU machine that reaches no package index, keeping what it measures in the
# folder OUT names. Bring the checkout there with its .whl/ folder (scripts/gpu_wheels.sh makes it), then:
#
#   OUT=DIR bash scripts/device_check.sh [--budget SECONDS | SECONDS] [gpu_check.sh arguments]
#
# Installs the wheels of .whl/ (trl, which the recipe parser imports, deepspeed and what they need) into
# /tmp/site without an index, then runs the check in runs/device_check (inside the checkout, so that the
# figures name their paths relative to it). --budget SECONDS (or SECONDS alone) is the
# time the whole command may take, counted from this script's start: the check gets what is left of it,
# leaves out the parts that would end past it, stops one that runs past it, and its summary ends with the
# command that runs the parts left out. Without a budget every part runs. OUT keeps the GPU's name
# (gpu.txt), the whole log (gpu_check.log), figures/ (each part's JSON, written as it goes, and the 1B
# run's TORCH_LOGS), summary.md and figures.json, rewritten while each part runs and after it: a check
# stopped early keeps what it finished.
set -uo pipefail
begin=$(date +%s)
cd "$(dirname "$0")/.."
out=${OUT:?OUT names the folder that keeps the check\'s log, figures and summary}
budget=0
if [ "${1:-}" = --budget ]; then budget=${2:?--budget takes a number of seconds}; shift 2
elif [[ ${1:-} =~ ^[0-9]+$ ]]; then budget=$1; shift; fi
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
fi
limit=() rerun="bash scripts/device_check.sh"
if [ "$budget" -gt 0 ]; then
  left=$(( budget - ($(date +%s) - begin) ))
  limit=(--budget "$(( left > 1 ? left : 1 ))") rerun="bash scripts/device_check.sh --budget $budget"
fi
report=$(realpath -m --relative-base="$PWD" "$out")  # relative when OUT is inside the checkout
bash scripts/gpu_check.sh --out runs/device_check --report "$report" "${limit[@]}" --rerun "$rerun" "$@" 2>&1 |
  tee "$out/gpu_check.log"
rc=${PIPESTATUS[0]}
echo "device_check.sh: $(( $(date +%s) - begin )) s${limit[*]:+ of the budget of $budget s}" | tee -a "$out/gpu_check.log"
exit "$rc"
