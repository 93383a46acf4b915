#!/usr/bin/env bash
# Set up the environment, then run every test: the unit tests and nbval over the notebooks.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -x -k metrics`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export MPLBACKEND=Agg
exec .venv/bin/python -m pytest tests notebooks --nbval-lax --durations=15 "$@"
