#!/usr/bin/env bash
# The one short check a lent GPU runs (issue 14): every notebook under nbval at the GPU sizes the
# notebooks pick by themselves on CUDA, then the step profiler sweep to batch 256, saving the
# measured profile and both fitted cost models as data/device_profiles/<device>.json, and the
# alone-vs-batched answers in fp32 and bf16 as data/divergence/<device>.json.
# Written to finish in under 8 minutes; it stops itself at $BUDGET_S (default 470 s) and says
# what did not run. On a machine without CUDA it exits 2 at once with one line saying so.
#
#   bash scripts/gpu_check.sh                  # uses .venv/bin/python (PYTHON=... to change)
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
BUDGET_S=${BUDGET_S:-470}
export MPLBACKEND=Agg PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
    echo "gpu_check: $PYTHON cannot import torch; run bash scripts/setup.sh first (or set PYTHON=...)" >&2
    exit 2
fi
if ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_check: no CUDA device (torch.cuda.is_available() is False with $PYTHON); this check needs a GPU" >&2
    exit 2
fi
start=$SECONDS
left() { echo $(( BUDGET_S - (SECONDS - start) )); }
"$PYTHON" -c 'import torch; print("gpu_check:", torch.cuda.get_device_name(0), "torch", torch.__version__)'

# 1. The profile first: it is what a later CPU-only session cannot make.
echo "gpu_check: profiling (sweep to batch 256)"
if ! timeout 180 "$PYTHON" scripts/profile_device.py --max-batch 256; then
    echo "gpu_check: FAILED: the profiler sweep did not finish (see above)" >&2
    exit 1
fi

# 1b. Does batching change the answers here? Alone vs together, fp32 and bf16 (seconds on a GPU).
if ! timeout 90 "$PYTHON" scripts/measure_divergence.py; then
    echo "gpu_check: the divergence measurement did not finish (see above); going on" >&2
fi

# 2. Every notebook under nbval, each within what is left of the budget.
failed=() skipped=()
for nb in notebooks/[0-9][0-9]_*.ipynb; do
    remaining=$(left)
    if (( remaining < 20 )); then skipped+=("$nb"); continue; fi
    echo "gpu_check: $nb (${remaining} s left)"
    if ! timeout "$remaining" "$PYTHON" -m pytest -q --nbval-lax "$nb" -p no:cacheprovider; then
        failed+=("$nb")
    fi
done
echo "gpu_check: $(( SECONDS - start )) s; failed: ${failed[*]:-none}; not run (out of time): ${skipped[*]:-none}"
(( ${#failed[@]} == 0 && ${#skipped[@]} == 0 ))
