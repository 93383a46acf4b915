"""How many threads torch should use on a CPU: the cores nobody else is using.

The rules and their reasons: ``docs/the-core.md``.
"""

from __future__ import annotations

import os
import time

LOOK_SECONDS = 0.25   # how long the look at /proc/stat lasts


def usable_cpus() -> list[int]:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _cpu_times(stat: str = "/proc/stat") -> dict[int, tuple[int, int]]:
    """Each CPU's (busy, total) time in ticks since boot."""
    times = {}
    with open(stat) as f:
        for line in f:
            name, *fields = line.split()
            if not name.startswith("cpu") or name == "cpu":
                continue
            # user nice system idle iowait irq softirq steal
            ticks = [int(x) for x in fields[:8]]
            idle = ticks[3] + ticks[4]
            times[int(name[3:])] = (sum(ticks) - idle, sum(ticks))
    return times


def cores_busy_elsewhere(cpus: list[int], seconds: float = LOOK_SECONDS,
                         stat: str = "/proc/stat") -> float:
    """Cores' worth of time the ``cpus`` spent busy over ``seconds`` while this thread slept: work
    of other processes (or of this process's other threads); 0.0 where ``/proc/stat`` cannot be
    read (not Linux)."""
    try:
        before = _cpu_times(stat)
        time.sleep(seconds)
        after = _cpu_times(stat)
    except (OSError, ValueError, IndexError):
        return 0.0
    busy = 0.0
    for cpu in cpus:
        if cpu in before and cpu in after:
            d_busy, d_total = (a - b for a, b in zip(after[cpu], before[cpu]))
            busy += d_busy / d_total if d_total > 0 else 0.0
    return busy


def free_cores() -> int:
    """The usable cores nobody else kept busy just now (at least one)."""
    cpus = usable_cpus()
    return max(1, len(cpus) - int(cores_busy_elsewhere(cpus) + 0.5))
