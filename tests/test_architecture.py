"""The package's shape: imports only run downward, the serving core stays readable, the server is split by job.

The layers, lowest first. A module may import from its own layer's unit (its folder, or itself)
and from any lower layer, never from a higher one. Every import counts, those under
``if TYPE_CHECKING:`` and those inside functions too, so the package has no import cycle between
units: the drivers around the step know the engine through ``contract.ServingEngine`` and never
import it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "batchlab"

LAYERS = [
    ["batchlab"],                      # the package root: its version
    ["checks"],
    ["requests"],
    ["plan"],
    ["speculative"],                   # who drafts, and how many tokens a step may check
    ["trace"],
    ["listener"],                      # what an engine tells: one output per step, and each end
    ["kv_space"],
    ["kv_blocks"],
    ["shapes"],                        # models' sizes as data: weights, work and KV bytes per token
    ["engine_args"],                   # vLLM's flags by vLLM's names, parsed once, handed down
    ["model"],                         # tensors: the model, its step, the KV caches' storage
    ["schedulers"],                    # policies: plan against the KV contract, never tensors
    ["steptime"],                      # how long a step takes: cost models, rooflines, measured kernels
    ["backends"],                      # what computes a step: the model, or the simulator
    ["clock", "contract"],             # the contract: what the engine checks, and what it offers
    ["sim"],                           # the simulator: its backend, and its bulk decode runs
    ["loop"],                          # the serving loop around any ServingEngine
    ["offline", "online"],             # the drivers: the loop with their arrivals
    ["engine"],                        # the step (Engine.run and run_online call the drivers)
    ["vllm_sim"],                      # one vLLM replica on simulated GPUs: flags, memory, step time
    ["workloads"],
    ["analysis"],                      # reads traces only
    ["experiments"],                   # the lessons' measurements, calibration among them
    ["loadgen"],                       # the load client, and the tools that read a server from outside
    ["serve"],                         # the HTTP server over the online engine
    ["cluster"],                       # many engines behind a router, on one virtual clock
    ["predict"],                       # a whole vLLM deployment on GPUs, predicted before it is rented
    ["launch"],                        # processes on 127.0.0.1: our server, vLLM's, vllm-router
    ["exercises"],
]
LAYER_OF = {unit: i for i, units in enumerate(LAYERS) for unit in units}

# The serving core: no function longer than this, no class longer than that (docstrings count).
CORE = ["engine.py", "loop.py", "offline.py", "online.py", "sim", "contract.py", "kv_space.py",
        "kv_blocks.py", "schedulers", "backends", "steptime", "model"]
MAX_FUNCTION_LINES, MAX_CLASS_LINES = 40, 200
# The HTTP server: a file per job, none longer than this, and the core's function limit.
SERVER, MAX_SERVER_FILE_LINES = "serve", 300


def unit_of(module: str) -> str:
    """``batchlab.schedulers.continuous`` -> ``schedulers``; ``batchlab`` -> ``batchlab``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def batchlab_imports(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, module)`` for every batchlab import in the file, wherever it stands."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "batchlab":
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "batchlab"]
    return found


def test_every_unit_has_a_layer():
    units = {unit_of(module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert units <= set(LAYER_OF), f"place these in LAYERS: {sorted(units - set(LAYER_OF))}"


def test_imports_only_run_downward():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = unit_of(module_name(path))
        for line, module in batchlab_imports(ast.parse(path.read_text())):
            imported = unit_of(module)
            if imported != importer and LAYER_OF[imported] > LAYER_OF[importer]:
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({importer}) imports {module}")
    assert not upward, "imports that run upward:\n" + "\n".join(upward)


def test_no_import_cycle_between_units():
    """Units of one layer may import each other one way only (the layers order the rest)."""
    edges: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = unit_of(module_name(path))
        for _, module in batchlab_imports(ast.parse(path.read_text())):
            if unit_of(module) != importer:
                edges.setdefault(importer, set()).add(unit_of(module))
    both_ways = sorted({tuple(sorted((a, b))) for a, targets in edges.items() for b in targets
                        if a in edges.get(b, set())})
    assert not both_ways, f"units that import each other: {both_ways}"


def core_files() -> list[Path]:
    files = []
    for name in CORE:
        path = PACKAGE / name
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


@pytest.mark.parametrize("path", core_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_serving_core_reads_in_small_pieces(path):
    too_long = []
    for node in ast.walk(ast.parse(path.read_text())):
        size = node.end_lineno - node.lineno + 1 if hasattr(node, "end_lineno") else 0
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and size > MAX_FUNCTION_LINES:
            too_long.append(f"def {node.name}: {size} lines (at most {MAX_FUNCTION_LINES})")
        elif isinstance(node, ast.ClassDef) and size > MAX_CLASS_LINES:
            too_long.append(f"class {node.name}: {size} lines (at most {MAX_CLASS_LINES})")
    assert not too_long, f"{path.relative_to(PACKAGE)}: " + "; ".join(too_long)


@pytest.mark.parametrize("path", sorted((PACKAGE / SERVER).glob("*.py")), ids=lambda p: p.name)
def test_the_server_is_split_by_job_into_short_files_and_functions(path):
    text = path.read_text()
    too_long = [f"{len(text.splitlines())} lines (at most {MAX_SERVER_FILE_LINES})"] \
        if len(text.splitlines()) > MAX_SERVER_FILE_LINES else []
    for node in ast.walk(ast.parse(text)):
        size = node.end_lineno - node.lineno + 1 if hasattr(node, "end_lineno") else 0
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and size > MAX_FUNCTION_LINES:
            too_long.append(f"def {node.name}: {size} lines (at most {MAX_FUNCTION_LINES})")
    assert not too_long, f"serve/{path.name}: " + "; ".join(too_long)


# --- the 100-column limit (ruff's E501; pyproject's [tool.ruff]) ------------------------------------
def long_lines() -> list[str]:
    """Every line of the package over 100 columns, as ruff reports it (``path:line``)."""
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        pytest.fail(f"no ruff beside {sys.executable}: it is in requirements.txt; run bash scripts/setup.sh")
    out = subprocess.run([str(ruff), "check", "--select", "E501", "--output-format", "json", "--no-cache",
                          "--exit-zero", str(PACKAGE)], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout
    return [f"{Path(v['filename']).relative_to(PACKAGE.parent)}:{v['location']['row']}"
            for v in json.loads(out)]


def test_no_line_of_the_package_is_over_100_columns() -> None:
    found = long_lines()
    assert not found, f"lines over 100 columns (ruff check --select E501 batchlab): {found}"

