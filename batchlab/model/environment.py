"""What machine is this? A short report to print at the top of an experiment.

Every measurement in the course depends on the machine: its memory bandwidth, its arithmetic
speed, how many CPU threads torch may use, and what else is running. A result is only worth
sharing together with this report.
"""

from __future__ import annotations

import os
import platform
import re
import sys

import torch


def synchronize(device: str | torch.device) -> None:
    """Wait for the device to finish queued work (CUDA runs asynchronously), so a timer around a
    step measures the step itself. A no-op on the CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def device_name(device: str | torch.device = "cpu") -> str:
    """A readable name: the GPU's model for CUDA devices, the CPU's model name otherwise."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return "CPU: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU: " + (platform.processor() or platform.machine() or "unknown")


def device_slug(name: str) -> str:
    """``"NVIDIA H200"`` -> ``"nvidia-h200"``, ``"CPU: AMD EPYC"`` -> ``"cpu-amd-epyc"``: a file
    name."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def _meminfo_bytes(key: str) -> int | None:
    """A field of /proc/meminfo (Linux) in bytes, or None where there is no such file."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024   # the file counts kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def environment_report(device: str | torch.device = "cpu") -> dict[str, object]:
    """Python, torch, the device, CPU threads and memory, as a flat dict (sizes in GiB)."""
    device = torch.device(device)
    gib = 2**30
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    total = _meminfo_bytes("MemTotal")
    if total is None and hasattr(os, "sysconf"):
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError):
            total = None
    available = _meminfo_bytes("MemAvailable")
    report: dict[str, object] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(terse=True),
        "torch": torch.__version__,
        "device": str(device),
        "device_name": device_name(device),
        "cpu_cores_usable": cores,
        "torch_threads": torch.get_num_threads(),
        "ram_total_gib": round(total / gib, 1) if total else None,
        "ram_available_gib": round(available / gib, 1) if available else None,
    }
    if hasattr(os, "getloadavg"):
        # Runnable processes, averaged over the last minute: above the core count, other work
        # is competing with ours and every timing below is inflated.
        report["load_average_1min"] = round(os.getloadavg()[0], 2)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        report["gpu_memory_gib"] = round(props.total_memory / gib, 1)
        report["cuda"] = torch.version.cuda
    return report
