#!/usr/bin/env bash
# Debian's Chromium, the real browser scripts/check_site.py opens the course site in (idempotent).
# It installs with apt, so as root (CI, a container) only; elsewhere it says what to run and the
# site's browser check is skipped (except in CI, where a missing browser fails it).
set -euo pipefail
if command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "setup_browser: no Chromium; the course site's browser check needs one (Debian: sudo apt-get install chromium)"
  exit 0
fi
echo "== installing Debian's chromium (the course site's browser check; once)"
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -q chromium >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }
echo "== $(chromium --version)"
