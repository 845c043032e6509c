"""How busy other processes kept the machine during a run (Linux ``/proc``): on a
small shared machine a side measured while someone else's tests ran is slower for
reasons of its own, and the figure says so beside it.

    other load = (busy CPU time of the whole machine - that of this process and its
                 descendants, launched servers included) / wall time, in cores

And ``wait_quiet``, before a run: a side must not be measured while another side's
server is still busy. vLLM's CPU worker keeps polling one core for ~1 s after its
last request (measured here: 1.0 core for 1.0 s, then 0), so a side run right after
it shares the cores for that second; on 2 cores a radixlm pass then waits on the
polled core, and the run's first request took ~1,050 ms to its first token against
~95 ms on a quiet machine.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["LoadMeter", "machine_busy_ticks", "process_ticks", "wait_quiet"]

PROC = Path("/proc")


def machine_busy_ticks(stat_text: str) -> int:
    """Busy clock ticks of all CPUs from ``/proc/stat`` (everything but idle and iowait)."""
    fields = stat_text.splitlines()[0].split()
    if fields[0] != "cpu":
        raise ValueError(f"/proc/stat starts with the 'cpu' line, got {fields[0]!r}")
    ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return sum(ticks) - ticks[3] - ticks[4]


def process_ticks(stat_line: str) -> tuple[int, int]:
    """``(parent pid, user + system ticks)`` from a ``/proc/PID/stat`` line (the name,
    in parentheses, may hold spaces)."""
    rest = stat_line[stat_line.rindex(")") + 2 :].split()
    return int(rest[1]), int(rest[11]) + int(rest[12])


def _tree_ticks(root: int) -> int:
    parents, ticks = {}, {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid, t = process_ticks((entry / "stat").read_text())
        except (OSError, ValueError, IndexError):  # it exited meanwhile
            continue
        parents[int(entry.name)], ticks[int(entry.name)] = ppid, t
    total = 0
    for pid, t in ticks.items():
        p = pid
        while p not in (root, 0, 1) and p in parents:
            p = parents[p]
        total += t if p == root else 0
    return total


class LoadMeter:
    """``start()`` then ``stop()`` -> the cores other processes kept busy meanwhile
    (None where /proc is not there)."""

    def start(self) -> None:
        self._begin = self._sample()

    def stop(self) -> float | None:
        end = self._sample()
        if self._begin is None or end is None:
            return None
        (m0, o0, t0), (m1, o1, t1) = self._begin, end
        hz = os.sysconf("SC_CLK_TCK")
        return max(0.0, ((m1 - m0) - (o1 - o0)) / hz / (t1 - t0))

    def _sample(self) -> tuple[int, int, float] | None:
        try:
            busy = machine_busy_ticks((PROC / "stat").read_text())
        except OSError:
            return None
        return busy, _tree_ticks(os.getpid()), time.monotonic()


def _machine_busy_seconds() -> float | None:
    try:
        return machine_busy_ticks((PROC / "stat").read_text()) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return None


def wait_quiet(
    max_cores: float = 0.1,
    window_s: float = 0.25,
    timeout_s: float = 10.0,
    busy_seconds: Callable[[], float | None] = _machine_busy_seconds,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Waits until the whole machine (every process, launched servers included) kept
    at most ``max_cores`` busy over a window of ``window_s``, or ``timeout_s`` passed;
    returns the seconds waited (0.0 where /proc is not there). ``busy_seconds`` and
    ``sleep``: the clock to read and how to wait (tests)."""
    waited = 0.0
    before = busy_seconds()
    while before is not None and waited < timeout_s:
        sleep(window_s)
        waited += window_s
        after = busy_seconds()
        if after is None or (after - before) / window_s <= max_cores:
            break
        before = after
    return waited
