#!/usr/bin/env bash
# Set up AIPerf, NVIDIA's benchmark client for OpenAI-compatible servers, in its own venv,
# .venv-aiperf/ (idempotent). tests/test_aiperf.py runs it unchanged against batchlab's server, as
# a user of a real serving stack would. It is a client only: it talks HTTP to the server and reads
# the course's tokenizer from the converted model's folder (nothing is downloaded from a hub).
#
# BATCHLAB_SKIP_AIPERF=1 skips this setup (the AIPerf test then skips, except in CI).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/own_venv.sh
VENV=.venv-aiperf
want="aiperf==0.13.0"
if [ "${BATCHLAB_SKIP_AIPERF:-0}" = 1 ]; then
  echo "== BATCHLAB_SKIP_AIPERF=1: not setting up $VENV"
  exit 0
fi
own_venv_install $VENV "$want"         # about a minute, once
$VENV/bin/aiperf --version
own_venv_done $VENV "$want"
