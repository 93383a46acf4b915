"""How many threads torch should use on a CPU: the cores nobody else is using.

torch splits every product over its threads, and each thread waits at the end for the others
(OpenMP's barrier, spinning a while before it sleeps). When another process keeps one of the
cores busy (a browser on a laptop, another job on a shared VM), the thread that shares that core
runs at a fraction of its speed and the other spins waiting for it, at every one of a step's
hundreds of products. On the course's 2-core VM with one core kept busy by a CPU hog, an engine
run took 2.6 s with two threads, 0.93 s with one (1.0 s with two and ``OMP_WAIT_POLICY=PASSIVE``,
which costs 45% on a quiet machine); quiet, two threads took 0.63 s.

So the default is one thread per core that was free when the model was loaded: the cores' busy
time over a short look at ``/proc/stat`` (while this thread sleeps), rounded to whole cores, is
left to whoever is using them.
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
            ticks = [int(x) for x in fields[:8]]          # user nice system idle iowait irq softirq steal
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
