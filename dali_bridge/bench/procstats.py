"""Process-tree accounting from ``/proc`` (Linux): CPU seconds and memory of a process, its
threads and its worker processes, and the monitor that samples a candidate's peak RSS and kills it
when it stalls."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

_MONITOR_INTERVAL_S = 0.05

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
            except OSError:
                continue
    except OSError:
        pass
    return found


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live descendant (threads are part of their process)."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo += _children(current)
    return tree


def tree_cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds (user + system) of ``pid`` (default: this process), its threads and descendants.

    Live processes count their own time plus that of children they reaped; reaped children are
    already inside their parent's ``cutime``/``cstime``, so nothing is counted twice.
    """
    total = 0
    for member in process_tree(os.getpid() if pid is None else pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return total / _CLOCK_TICKS


def tree_rss_mib(pid: int) -> float:
    """RSS of ``pid`` and its descendants in MiB (cheap: ``/proc/*/statm``). Shared pages count
    once per process, so forked workers each count the libraries they share with the parent."""
    rss = 0
    for member in process_tree(pid):
        try:
            rss += int(Path(f"/proc/{member}/statm").read_text().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            continue
    return rss / 2**20


def tree_memory_mib(pid: int) -> tuple[float, float]:
    """(RSS, PSS) of ``pid`` and its descendants in MiB. PSS splits shared pages between the
    processes sharing them, so it is what the loader really occupies. Reading PSS walks every
    mapping (tens of ms for a process with torch loaded): never call it inside a timed window."""
    pss = 0
    for member in process_tree(pid):
        try:
            for line in Path(f"/proc/{member}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
                    break
        except (OSError, IndexError, ValueError):
            continue
    return tree_rss_mib(pid), pss / 2**20


class MemoryMonitor(threading.Thread):
    """Samples a process tree's RSS every 50 ms from the parent (about 0.1 ms a sample); keeps the
    peak. Also the watchdog: a candidate silent for ``stall_s`` seconds (no batch) is killed with
    its whole process group (its workers included)."""

    def __init__(self, pid: int, stall_s: float):
        super().__init__(daemon=True)
        self.pid, self.peak_rss, self.stall_s = pid, 0.0, stall_s
        self.last_activity = time.monotonic()
        self.stalled = False
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak_rss = max(self.peak_rss, tree_rss_mib(self.pid))
            if time.monotonic() - self.last_activity > self.stall_s and not self.stalled:
                self.stalled = True
                kill_group(self.pid)
            self._stop_event.wait(_MONITOR_INTERVAL_S)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def kill_group(pid: int) -> None:
    """Kill a candidate's process group (it runs in its own session: its workers share the group)."""
    import signal

    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass

