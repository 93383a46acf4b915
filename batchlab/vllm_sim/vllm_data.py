"""The constants of vLLM V1 the simulated replica uses, each with its source (``vllm_v1.json``)."""

from __future__ import annotations

import json
from pathlib import Path

ENGINE_DATA = json.loads((Path(__file__).resolve().parent
                          / "vllm_v1.json").read_text(encoding="utf-8"))

__all__ = ["ENGINE_DATA"]
