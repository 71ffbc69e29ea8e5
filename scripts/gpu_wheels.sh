#!/usr/bin/env bash
# The wheels a GPU machine without a package index lacks: trl, deepspeed and what they need
# beyond that machine's image, for its Python 3.12 on x86-64, into .whl/ (ignored by git). The versions are
# those of this checkout's environment (the ones CI tests), read from PYTHON (default: .venv/bin/python).
# deepspeed has no wheel on PyPI: it is built here without its compiled ops (DS_BUILD_OPS=0).
#
#   bash scripts/gpu_wheels.sh [PYTHON]
#
# Bring the checkout with its .whl/ folder to that machine: scripts/device_check.sh installs them there.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-.venv/bin/python}
exclude=$(git rev-parse --git-path info/exclude)
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo /.whl/ >> "$exclude"
mkdir -p .whl
# trl and datasets, deepspeed's pydantic and hjson, gguf: none is in the GPU image (docs/lab/measurements.md)
pins=$("$py" - <<'PY'
import importlib.metadata as md
names = ["trl", "datasets", "dill", "multiprocess", "pydantic", "pydantic-core", "annotated-types",
         "typing-inspection", "hjson", "gguf"]
print(" ".join(f"{n}=={md.version(n)}" for n in names))
PY
)
# shellcheck disable=SC2086  # $pins is a list of NAME==VERSION words
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $pins
ds=$("$py" -c 'import importlib.metadata as md; print(md.version("deepspeed"))')
ls .whl/deepspeed-"$ds"-*.whl >/dev/null 2>&1 ||
  DS_BUILD_OPS=0 "$py" -m pip wheel -q --no-deps --no-build-isolation "deepspeed==$ds" -w .whl
ls .whl && du -sh .whl
