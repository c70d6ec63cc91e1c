"""Peak resident memory of a process and all its descendants, sampled from /proc (Linux).

``ru_maxrss`` of RUSAGE_CHILDREN misses pool workers (children of the forkserver, never waited
for by the driver) and reports only the largest one: this samples every descendant's VmRSS."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(int(d.name))
    return kids


def status_kib(pid: int, field: str = "VmRSS") -> int:
    """A memory figure of /proc/PID/status in KiB (VmRSS now, VmHWM the peak); 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def children_of(pid: int) -> list[int]:
    """The process's child processes."""
    return _children().get(pid, [])


def tree_rss_kb(root: int) -> tuple[int, int, int]:
    """(sum over the tree, largest process, number of processes) of resident memory now."""
    kids = _children()
    todo, pids = [root], []
    while todo:
        p = todo.pop()
        pids.append(p)
        todo.extend(kids.get(p, []))
    rss = [status_kib(p) for p in pids]
    return sum(rss), max(rss, default=0), len(pids)


class PeakRSS:
    """``with PeakRSS(pid) as m: ...`` then ``m.peak_mb`` (whole tree), ``m.largest_mb`` (one process)."""

    def __init__(self, pid: int | None = None, interval_s: float = 0.05) -> None:
        self.pid = pid or os.getpid()
        self.interval_s = interval_s
        self.peak_kb = self.largest_kb = self.max_procs = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            total, largest, n = tree_rss_kb(self.pid)
            self.peak_kb, self.largest_kb = max(self.peak_kb, total), max(self.largest_kb, largest)
            self.max_procs = max(self.max_procs, n)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_mb(self) -> float:
        return self.peak_kb / 1024

    @property
    def largest_mb(self) -> float:
        return self.largest_kb / 1024
