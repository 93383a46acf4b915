"""The default thread count leaves to other processes the cores they keep busy."""

import subprocess
import sys
import time

import pytest
import torch

from batchlab.model import cpu_threads, set_cpu_threads


def _snapshots(monkeypatch, first, second):
    """Make /proc/stat read ``first`` and then ``second``: {cpu: (busy, total)} ticks."""
    reads = iter([first, second])
    monkeypatch.setattr(cpu_threads, "_cpu_times", lambda stat="/proc/stat": next(reads))


def test_a_core_kept_busy_elsewhere_is_left_to_it(monkeypatch):
    # cpu 0 busy the whole look, cpu 1 idle
    _snapshots(monkeypatch, {0: (100, 200), 1: (50, 200)}, {0: (125, 225), 1: (50, 225)})
    assert cpu_threads.cores_busy_elsewhere([0, 1], seconds=0.01) == pytest.approx(1.0)
    _snapshots(monkeypatch, {0: (100, 200), 1: (50, 200)}, {0: (125, 225), 1: (50, 225)})
    monkeypatch.setattr(cpu_threads, "usable_cpus", lambda: [0, 1])
    monkeypatch.setattr(cpu_threads, "LOOK_SECONDS", 0.01)
    assert cpu_threads.free_cores() == 1


def test_a_light_load_keeps_every_core_and_a_full_machine_keeps_one(monkeypatch):
    monkeypatch.setattr(cpu_threads, "usable_cpus", lambda: [0, 1, 2, 3])
    _snapshots(monkeypatch, {c: (0, 100) for c in range(4)}, {c: (10, 200) for c in range(4)})
    assert cpu_threads.free_cores() == 4          # 0.4 of a core in all: not a core taken
    _snapshots(monkeypatch, {c: (0, 100) for c in range(4)}, {c: (100, 200) for c in range(4)})
    assert cpu_threads.free_cores() == 1          # never below one thread


def test_cpus_outside_the_affinity_do_not_count(monkeypatch):
    _snapshots(monkeypatch, {0: (0, 100), 5: (0, 100)}, {0: (0, 200), 5: (100, 200)})
    assert cpu_threads.cores_busy_elsewhere([0], seconds=0.01) == 0.0


def test_without_proc_stat_nothing_counts_as_busy(tmp_path):
    assert cpu_threads.cores_busy_elsewhere([0], seconds=0.01, stat=str(tmp_path / "missing")) == 0.0


@pytest.mark.skipif(len(cpu_threads.usable_cpus()) < 2 or sys.platform != "linux",
                    reason="needs Linux and two cores: one for the hog, one for the look")
def test_a_real_cpu_hog_is_seen():
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        assert cpu_threads.cores_busy_elsewhere(cpu_threads.usable_cpus(), seconds=0.5) > 0.7
    finally:
        hog.kill()
        hog.wait()


def test_set_cpu_threads_uses_the_free_cores_by_default(monkeypatch):
    before = torch.get_num_threads()
    monkeypatch.setattr(cpu_threads, "free_cores", lambda: 1)
    try:
        assert set_cpu_threads(None) == 1 == torch.get_num_threads()
        assert set_cpu_threads(2) == 2 == torch.get_num_threads()
        with pytest.raises(ValueError, match="threads"):
            set_cpu_threads(0)
    finally:
        torch.set_num_threads(before)
