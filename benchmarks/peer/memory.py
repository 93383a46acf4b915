"""Peak memory of one contender: resident memory above what was held before it began."""

from __future__ import annotations

import ctypes
import gc
import threading


# =============================================================================================
# Peak memory
# =============================================================================================

def _read_status_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _release_free_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc), so RSS is what is alive."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


class PeakMemory:
    """Peak RSS while a block runs, as bytes above the RSS when it began (see the module docstring).

    ``method`` says how it was measured: ``"VmHWM"`` (exact, Linux), ``"psutil-sampled-2ms"``, or
    ``"unavailable"`` (``peak_bytes`` is then None).
    """

    def __init__(self) -> None:
        self.method = "unavailable"
        self.peak_bytes: int | None = None
        self._start_rss = 0
        self._sampler: threading.Thread | None = None
        self._stop = threading.Event()
        self._sampled_peak = 0

    def __enter__(self) -> "PeakMemory":
        _release_free_memory()
        rss = _read_status_kib("VmRSS")
        if rss is not None and self._reset_high_water_mark():
            self.method, self._start_rss = "VmHWM", rss * 1024
            return self
        try:
            import psutil
        except ImportError:
            return self
        process = psutil.Process()
        self.method = "psutil-sampled-2ms"
        self._start_rss = self._sampled_peak = process.memory_info().rss

        def sample() -> None:
            while not self._stop.wait(0.002):
                self._sampled_peak = max(self._sampled_peak, process.memory_info().rss)

        self._sampler = threading.Thread(target=sample, daemon=True)
        self._sampler.start()
        return self

    @staticmethod
    def _reset_high_water_mark() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")   # "5" resets the peak RSS (VmHWM) to the current RSS (Linux >= 4.0)
            return True
        except OSError:
            return False

    def __exit__(self, *exc) -> None:
        if self.method == "VmHWM":
            self.peak_bytes = max(0, (_read_status_kib("VmHWM") or 0) * 1024 - self._start_rss)
        elif self._sampler is not None:
            self._stop.set()
            self._sampler.join()
            self.peak_bytes = max(0, self._sampled_peak - self._start_rss)


