#!/usr/bin/env bash
# scripts/gpu_check.sh as one call of a lent device machine, where what is written to $OUT comes back:
#
#   run(command="bash scripts/device_check.sh", carry=[".whl"], timeout_s=600)
#   bash scripts/device_check.sh [BUDGET_SECONDS] [gpu_check.sh arguments, e.g. --parts 7b,study,paths]
#
# Installs the carried wheels (.whl/, made here by scripts/gpu_wheels.sh) into /tmp/site, runs the check in
# /tmp/gc with a budget (default 420 s: no part starts later, so the last one ends inside the call's 600 s)
# and keeps in $OUT the GPU's name, the whole log and, after every part, summary.md and figures.json. A
# call cut short by its limit still returns them.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?device_check.sh runs on a device machine, where OUT names the folder that comes back}
budget=420
if [[ ${1:-} =~ ^[0-9]+$ ]]; then budget=$1; shift; fi
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
bash scripts/gpu_check.sh --out /tmp/gc --report "$out" --budget "$budget" "$@" 2>&1 | tee "$out/gpu_check.log"
