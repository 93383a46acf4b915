#!/usr/bin/env bash
# Open the course in JupyterLab from the environment setup made (course.sh runs setup first).
#   bash scripts/lab.sh [jupyter lab options]      e.g. --no-browser, --ip=0.0.0.0
# It picks a free port (from 8888, or $BATCHLAB_PORT; a --port you give wins), makes a token,
# starts JupyterLab (with
# --allow-root only when run as root, as in many containers and cloud VMs), and once the server
# answers prints the one URL to open. Ctrl-C stops it. BATCHLAB_LAB_PYTHON names the interpreter
# whose JupyterLab runs (default: .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${BATCHLAB_LAB_PYTHON:-.venv/bin/python}
# A --port N or --port=N among the options is the user's choice: take it out of the options
# (JupyterLab accepts one) and use it as is.
user_port="" rest=()
while (( $# )); do
  case "$1" in
    --port=*) user_port=${1#--port=} ;;
    --port) shift; user_port=${1:-} ;;
    *) rest+=("$1") ;;
  esac
  shift
done
set -- ${rest[@]+"${rest[@]}"}
if [ -n "$user_port" ]; then
  [[ "$user_port" =~ ^[0-9]+$ ]] && (( user_port >= 1 && user_port <= 65535 )) || {
    echo "lab.sh: --port=$user_port; must be a port number in 1..65535" >&2; exit 2; }
  port=$user_port
else
port=$("$PY" - "${BATCHLAB_PORT:-8888}" <<'PYCODE'
import socket, sys
start = int(sys.argv[1])
for port in range(start, start + 100):  # the first free port from the asked one
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
        print(port)
        break
else:
    sys.exit(f"lab.sh: no free port in {start}-{start + 99}; set BATCHLAB_PORT to another start")
PYCODE
)
fi
token=$("$PY" -c 'import secrets; print(secrets.token_hex(24))')
args=(--port="$port" --ServerApp.port_retries=0 --IdentityProvider.token="$token")
[ "$(id -u)" = 0 ] && args+=(--allow-root)
"$PY" -m jupyter lab notebooks/ "${args[@]}" "$@" &
lab=$!
trap 'kill "$lab" 2>/dev/null; wait "$lab" 2>/dev/null; exit 130' INT TERM
url="http://127.0.0.1:$port/lab?token=$token"
# Wait (up to 60 s) until the server answers, then say where it is in one line.
for _ in $(seq 600); do
  if ! kill -0 "$lab" 2>/dev/null; then
    wait "$lab" && rc=0 || rc=$?; echo "JupyterLab exited (status $rc) before it answered; see its log above." >&2; exit 1
  fi
  if "$PY" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)" \
       "http://127.0.0.1:$port/api/status?token=$token" 2>/dev/null; then
    echo "== The course is open at: $url   (Ctrl-C stops JupyterLab)"
    url=""
    break
  fi
  sleep 0.1
done
[ -z "$url" ] || echo "JupyterLab has not answered in 60 s; it may still come up at: $url" >&2
wait "$lab"
