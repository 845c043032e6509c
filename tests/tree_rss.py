"""The peak resident memory of a command and all its descendants together.

``/usr/bin/time -v`` reports the largest single process of a tree, not the sum; the
suite's budget counts the pytest process *and* its children (grammar compile workers,
``radixlm serve`` processes) at the same moment. This samples the tree's summed RSS::

    .venv/bin/python -m tests.tree_rss [--interval-s 0.5] -- .venv/bin/python -m pytest -q tests

and prints, when the command ends, its exit status, wall time and the peak of the sum
(MB), then exits with the command's status.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["TreePeak", "descendants", "tree_rss_kb"]


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


def tree_rss_kb(root: int) -> tuple[int, int]:
    """(summed RSS in kB, number of processes) of ``root`` and its descendants."""
    tree = {root} | descendants(root)
    return sum(_rss_kb(pid) for pid in tree), len(tree)


class TreePeak:
    """The largest summed RSS seen so far, and how many processes the tree had then."""

    def __init__(self) -> None:
        self.peak_kb = 0
        self.processes_at_peak = 0

    def sample(self, root: int) -> None:
        kb, n = tree_rss_kb(root)
        if kb > self.peak_kb:
            self.peak_kb, self.processes_at_peak = kb, n


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
        f"tree_rss: exit {proc.returncode}, wall {wall:.0f} s, peak {peak.peak_kb // 1024} MB "
        f"summed over {peak.processes_at_peak} processes",
        file=sys.stderr,
    )
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
