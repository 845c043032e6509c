"""bench_peers.py's side processes: the sides not measured are stopped, whole trees."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import bench_peers as bench  # noqa: E402

# A side that starts a child of its own, says it is ready, and answers "1.5" per line.
SIDE = f"""
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print({bench.ANSWER!r} + "ready", flush=True)
for line in sys.stdin:
    print({bench.ANSWER!r} + "1.5", flush=True)
child.kill()
"""


def state(pid: int) -> str:
    """The process's state letter: T stopped, S sleeping, R running."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def wait_for(pid: int, letters: str) -> str:
    for _ in range(200):  # 2 s at most
        if state(pid) in letters:
            break
        time.sleep(0.01)
    return state(pid)


def test_the_other_sides_stop_while_one_runs_and_go_on_after(monkeypatch) -> None:
    monkeypatch.setattr(bench, "SETTLE_S", 0.0)
    procs = {
        name: bench.SideProcess([sys.executable, "-c", SIDE], dict(os.environ)) for name in "ab"
    }
    try:
        trees = {name: bench.process_tree(p.proc.pid) for name, p in procs.items()}
        assert all(len(tree) == 2 for tree in trees.values())  # the side and its child
        assert bench.run_alone(procs, "a", "w") == 1.5
        assert [wait_for(pid, "T") for pid in trees["b"]] == ["T", "T"]
        assert all(wait_for(pid, "SR") in "SR" for pid in trees["a"])
        assert bench.run_alone(procs, "b", "w") == 1.5
        assert [wait_for(pid, "T") for pid in trees["a"]] == ["T", "T"]
        assert all(wait_for(pid, "SR") in "SR" for pid in trees["b"])
    finally:
        for p in procs.values():
            p.close()  # resumes a stopped side first, or it would never read its EOF
    assert all(p.proc.returncode == 0 for p in procs.values())
