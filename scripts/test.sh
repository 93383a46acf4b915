#!/usr/bin/env bash
# Set up the environment, then run every test: the unit tests and nbval over the notebooks.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -x -k metrics`).
set -euo pipefail
cd "$(dirname "$0")/.."
BATCHLAB_ENTRY=test.sh bash scripts/setup.sh
# vLLM's CPU build in its own venv (.venv-vllm/), the reference server the tests and notebook 10
# measure beside batchlab's (BATCHLAB_SKIP_VLLM=1 skips it; those tests then skip, except in CI).
bash scripts/setup_vllm.sh
export MPLBACKEND=Agg
exec .venv/bin/python -m pytest tests notebooks --nbval-lax --durations=15 "$@"
