"""nbval runs each notebook cell by cell in a kernel. With BATCHLAB_EXECUTED_DIR set (scripts/test.sh
sets it to executed/), every notebook it ran is also written there with the outputs of that run,
so the static copy of the course (scripts/build_site.py) is built from the very run that checked
its claims, without executing the notebooks a second time."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat


def pytest_runtest_teardown(item, nextitem):
    out_dir = os.environ.get("BATCHLAB_EXECUTED_DIR")
    cell, outputs = getattr(item, "cell", None), getattr(item, "test_outputs", None)
    if not out_dir or cell is None:
        return
    cell["outputs"] = [_as_saved(o) for o in (outputs or [])]
    if nextitem is None or nextitem.parent is not item.parent:     # the notebook's last cell
        path = Path(out_dir) / Path(str(item.parent.fspath)).name
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(item.parent.nb, str(path))


def _as_saved(output):
    """An output as nbformat stores it: nbval keeps `execute_result`s without their count."""
    if output.get("output_type") == "execute_result":
        output.setdefault("execution_count", None)
        output.setdefault("metadata", {})
    if output.get("output_type") == "display_data":
        output.setdefault("metadata", {})
    return output
