#!/usr/bin/env bash
# Set up AIConfigurator, NVIDIA's static performance model of LLM serving, in its own venv,
# .venv-aiconfigurator/ (idempotent). scripts/check_predictor.py --peers runs its CLI
# (`aiconfigurator cli estimate`) beside batchlab's predictor, to print both errors on the same
# measured stages. It reads a model's config.json from a local folder and its bundled kernel tables
# (nothing is downloaded from a hub).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/own_venv.sh
VENV=.venv-aiconfigurator
want="aiconfigurator==0.12.0"
own_venv_install $VENV "$want"         # a few minutes, once
$VENV/bin/aiconfigurator --help > /dev/null
$VENV/bin/python -m pip show aiconfigurator | grep '^Version'
own_venv_done $VENV "$want"
