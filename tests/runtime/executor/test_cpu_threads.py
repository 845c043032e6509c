"""configure_cpu: the calling thread keeps the count it set, whatever other threads
set later (torch initialises a thread's count lazily from the last one set)."""

from __future__ import annotations

import threading

import torch

from radixlm.runtime.executor.cpu_threads import configure_cpu


def _count_after_another_thread_sets(configure) -> int:
    """A fresh thread configures itself; the main thread then sets 1; what the fresh
    thread's torch ops then run with."""
    configured, changed = threading.Event(), threading.Event()
    seen: list[int] = []

    def fresh() -> None:
        configure()
        configured.set()
        changed.wait(5)
        seen.append(torch.get_num_threads())

    thread = threading.Thread(target=fresh)
    before = torch.get_num_threads()
    try:
        thread.start()
        configured.wait(5)
        torch.set_num_threads(1)
        changed.set()
        thread.join(5)
    finally:
        torch.set_num_threads(before)
    return seen[0]


def test_a_thread_keeps_its_count_when_another_sets_one_later():
    assert _count_after_another_thread_sets(lambda: configure_cpu(2)) == 2


def test_without_it_torch_gives_the_thread_the_later_count():
    """Why configure_cpu reads the count first: a plain set is overwritten."""
    assert _count_after_another_thread_sets(lambda: torch.set_num_threads(2)) == 1
