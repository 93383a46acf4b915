#!/usr/bin/env bash
# Set up the environment, then run every test: the unit tests and nbval over the notebooks.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -x -k metrics`).
set -euo pipefail
cd "$(dirname "$0")/.."
# Three venvs and a browser, set up side by side (on a fresh clone the venvs take about 150 s so,
# 245 s one after the other: much of an install is waiting on files): the course's .venv; vLLM's CPU build in its own
# venv (.venv-vllm/), the reference server the tests and notebook 10 measure beside batchlab's
# (BATCHLAB_SKIP_VLLM=1 skips it; those tests then skip, except in CI); and AIPerf, a third-party
# benchmark client (.venv-aiperf/), that tests/test_aiperf.py runs against batchlab's server
# (BATCHLAB_SKIP_AIPERF=1 skips it; that test then skips, except in CI); and Debian's Chromium,
# which the course site is checked in (as root; elsewhere it says what to install). Each
# one's output is printed when it ends; the first that fails stops the run.
setup_logs=$(mktemp -d)
bash scripts/setup_vllm.sh > "$setup_logs/vllm" 2>&1 & vllm_setup=$!
bash scripts/setup_aiperf.sh > "$setup_logs/aiperf" 2>&1 & aiperf_setup=$!
bash scripts/setup_browser.sh > "$setup_logs/browser" 2>&1 & browser_setup=$!
BATCHLAB_ENTRY=test.sh bash scripts/setup.sh || { kill "$vllm_setup" "$aiperf_setup" "$browser_setup" 2>/dev/null; exit 1; }
for job in vllm:$vllm_setup aiperf:$aiperf_setup browser:$browser_setup; do
  wait "${job#*:}" && rc=0 || rc=$?
  cat "$setup_logs/${job%%:*}"
  (( rc == 0 )) || { echo "test.sh: scripts/setup_${job%%:*}.sh failed (exit $rc), as printed above" >&2; exit "$rc"; }
done
rm -rf "$setup_logs"
# The notebooks' kernels draw with matplotlib's inline backend, as in JupyterLab (MPLBACKEND=Agg
# would draw nothing); they are written with their outputs to executed/, which the course site is
# built from and checked against (scripts/build_site.py).
unset MPLBACKEND
export BATCHLAB_EXECUTED_DIR=${BATCHLAB_EXECUTED_DIR:-$PWD/executed}
# The suite's claims are fp32's (bit-identical answers however requests are batched, logits
# within 2e-3 of transformers'): on a CPU with bf16 units dtype="auto" would pick bf16, so the
# main pass names its dtype. BATCHLAB_DTYPE=bfloat16 bash scripts/test.sh runs it in bf16 instead.
export BATCHLAB_DTYPE=${BATCHLAB_DTYPE:-float32}
if (( $# )); then        # arguments pick the tests: one pass, as given
    exec .venv/bin/python -m pytest tests notebooks --nbval-lax --durations=15 "$@"
fi
# The whole suite, in two passes. First the tests that time nothing on the wall clock
# (tests/conftest.py: PARALLEL_MODULES), BATCHLAB_TEST_WORKERS at a time (default 2); then the
# rest one at a time, so no claim about measured time shares the CPU with another test: the
# servers, vLLM and every notebook. At the end: the 25 slowest tests of both, the 10 slowest
# files, and the total. BATCHLAB_TEST_REPORTS=DIR keeps both passes' JUnit reports there.
reports=${BATCHLAB_TEST_REPORTS:-$(mktemp -d)}
mkdir -p "$reports"
started=$SECONDS
status=0
.venv/bin/python -m pytest tests -m parallel -n "${BATCHLAB_TEST_WORKERS:-2}" -q \
    --junitxml="$reports/1-parallel.xml" || status=1
.venv/bin/python -m pytest tests notebooks -m "not parallel" --nbval-lax \
    --junitxml="$reports/2-alone.xml" || status=1
.venv/bin/python scripts/slowest_tests.py "$reports"/{1-parallel,2-alone}.xml --top 25 --files 10 || status=1
echo "test.sh: pytest, both passes: $((SECONDS - started)) s"
[ -n "${BATCHLAB_TEST_REPORTS:-}" ] || rm -rf "$reports"
(( status == 0 )) || exit "$status"
# Then the course site, and the cheap checks on other machines' shapes
# (scripts/check_machine_shapes.sh: one core busy, oneDNN capped at AVX2 and at AVX-512 bf16,
# and the notebooks whose claims depend on the dtype in bf16; docs/machines-and-dtypes.md:
# "Other machines").
echo "test.sh: the course site, from this run's executed notebooks, then opened in a browser"
.venv/bin/python scripts/build_site.py --executed "$BATCHLAB_EXECUTED_DIR" --check
.venv/bin/python scripts/check_site.py || { rc=$?; (( rc == 2 )) && [ -z "${CI:-}" ] || exit "$rc"; }
echo "test.sh: other machines' shapes, the cheap set"
bash scripts/check_machine_shapes.sh --cheap
