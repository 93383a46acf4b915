# Sourced by setup_vllm.sh and setup_aiperf.sh: a tool the course runs as its own process (vLLM's
# server, a benchmark client) lives in a venv of its own, installed once per pinned version; a
# stamp file in the venv records the version that is in it.

# own_venv_install VENV WANT: exits the calling script at once when VENV already holds WANT;
# otherwise creates VENV and installs WANT into it (the caller then checks it and calls
# own_venv_done).
own_venv_install() {
  local venv=$1 want=$2
  if [ "$(cat "$venv/.batchlab-setup" 2>/dev/null)" = "$want" ]; then
    exit 0
  fi
  echo "== installing $want into $venv (once)"
  [ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "$want"
}

# own_venv_done VENV WANT: VENV now holds WANT.
own_venv_done() {
  echo "$2" > "$1/.batchlab-setup"
}
