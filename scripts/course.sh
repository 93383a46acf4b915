#!/usr/bin/env bash
# The course on the embedded default model.
#   bash scripts/course.sh             set up, then open the notebooks in JupyterLab (scripts/lab.sh:
#                                      prints the URL to open, with its token; works as root too;
#                                      further options go to jupyter lab, e.g. --no-browser)
#   bash scripts/course.sh --headless  set up, then execute every notebook in order and write the
#                                      executed copies (with all outputs) to executed/
#   bash scripts/course.sh --site      the same, then build the course site from them (Sphinx:
#                                      site/index.html, a page per notebook and note, search) and
#                                      check it in a browser
set -euo pipefail
cd "$(dirname "$0")/.."
BATCHLAB_ENTRY=course.sh bash scripts/setup.sh
if [ "${1:-}" = "--headless" ] || [ "${1:-}" = "--site" ]; then
  mkdir -p executed
  for nb in notebooks/[0-9][0-9]_*.ipynb; do
    echo "== running $nb"
    start=$(date +%s)
    .venv/bin/jupyter nbconvert --to notebook --execute --ExecutePreprocessor.timeout=1800 \
      --output-dir executed "$nb" >/dev/null 2>&1 || {
        echo "FAILED: $nb (rerun: .venv/bin/jupyter nbconvert --to notebook --execute $nb)"; exit 1; }
    echo "   done in $(( $(date +%s) - start )) s -> executed/$(basename "$nb")"
  done
  echo "Executed notebooks are in executed/ (open them in JupyterLab or any notebook viewer)."
  if [ "$1" = "--site" ]; then
    .venv/bin/python scripts/build_site.py --check
    # Then open it in a real browser (Debian's chromium; without one it says what to install).
    .venv/bin/python scripts/check_site.py || (( $? == 2 ))
  fi
else
  exec bash scripts/lab.sh "$@"
fi
