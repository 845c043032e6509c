"""The peak resident memory of a command and all its descendants together.

``/usr/bin/time -v`` reports the largest single process of a tree, not the sum; the
suite's budget counts the pytest process *and* its children (grammar compile workers,
``radixlm serve`` processes) at the same moment. This samples the tree's summed RSS::

    .venv/bin/python -m tests.tree_rss [--interval-s 0.5] -- .venv/bin/python -m pytest -q tests

and prints, when the command ends, its exit status, wall time and the peaks of two sums
(MB), then exits with the command's status: of RSS, which counts a page shared by several
processes (torch's libraries, mapped in each) once per process, and of PSS (proportional
set size: a shared page split among its sharers), which counts each page once, i.e. the
memory the tree takes from the machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["TreePeak", "descendants", "tree_pss_kb", "tree_rss_kb"]


def _parents() -> dict[int, int]:
    """pid -> parent pid for every live, non-zombie process."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])
    return parents


def _rss_kb(pid: int) -> int:
    try:
        for line in (Path("/proc") / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def descendants(root: int) -> set[int]:
    """The live (non-zombie) descendants of process ``root``."""
    parents = _parents()
    found: set[int] = set()
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                frontier.append(pid)
    return found


def _pss_kb(pid: int) -> int:
    try:
        for line in (Path("/proc") / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_kb(root: int) -> tuple[int, int]:
    """(summed RSS in kB, number of processes) of ``root`` and its descendants."""
    tree = {root} | descendants(root)
    return sum(_rss_kb(pid) for pid in tree), len(tree)


def tree_pss_kb(root: int) -> int:
    """Summed PSS in kB of ``root`` and its descendants."""
    return sum(_pss_kb(pid) for pid in {root} | descendants(root))


class TreePeak:
    """The largest summed RSS and PSS seen so far, and how many processes the tree had
    at the RSS peak."""

    def __init__(self) -> None:
        self.peak_kb = 0
        self.peak_pss_kb = 0
        self.processes_at_peak = 0

    def sample(self, root: int) -> None:
        kb, n = tree_rss_kb(root)
        if kb > self.peak_kb:
            self.peak_kb, self.processes_at_peak = kb, n
        self.peak_pss_kb = max(self.peak_pss_kb, tree_pss_kb(root))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval-s", type=float, default=0.5)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("expected a command after --")
    start = time.monotonic()
    proc = subprocess.Popen(command)
    peak = TreePeak()
    while proc.poll() is None:
        peak.sample(proc.pid)
        time.sleep(args.interval_s)
    wall = time.monotonic() - start
    print(
        f"tree_rss: exit {proc.returncode}, wall {wall:.0f} s, peak RSS {peak.peak_kb // 1024} MB "
        f"summed over {peak.processes_at_peak} processes, peak PSS {peak.peak_pss_kb // 1024} MB",
        file=sys.stderr,
    )
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
