#!/usr/bin/env bash
# scripts/gpu_check.sh as one call of a lent device machine, where what is written to $OUT comes back:
#
#   run(command="bash scripts/device_check.sh", carry=[".whl"], timeout_s=600)
#   bash scripts/device_check.sh [BUDGET_SECONDS] [gpu_check.sh arguments, e.g. --parts 7b,paths]
#
# Installs the carried wheels (.whl/, made here by scripts/gpu_wheels.sh: trl, which the recipe parser
# imports, deepspeed and what they need) into /tmp/site, then runs the check in /tmp/gc with what is left
# of the budget (default 540 s, counted from this script's start: the parts that would end past it are
# left out, one that runs past it is stopped, so the whole call ends inside a 600 s limit). $OUT keeps the
# GPU's name, the whole log, figures/ (each part's JSON, written as it goes, and the 1B run's TORCH_LOGS),
# summary.md and figures.json, rewritten while each part runs and after it: a call cut short keeps what it
# finished. The summary ends with the command that runs the parts left out (a second call).
set -uo pipefail
begin=$(date +%s)
cd "$(dirname "$0")/.."
out=${OUT:?device_check.sh runs on a device machine, where OUT names the folder that comes back}
budget=540
if [[ ${1:-} =~ ^[0-9]+$ ]]; then budget=$1; shift; fi
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
fi
left=$(( budget - ($(date +%s) - begin) ))
bash scripts/gpu_check.sh --out /tmp/gc --report "$out" --budget "$(( left > 1 ? left : 1 ))" \
  --rerun "bash scripts/device_check.sh $budget" "$@" 2>&1 | tee "$out/gpu_check.log"
rc=${PIPESTATUS[0]}
echo "device_check.sh: $(( $(date +%s) - begin )) s of the budget of $budget s" | tee -a "$out/gpu_check.log"
exit "$rc"
