"""Process-wide CPU settings the engine applies once, when its loop thread starts.

Both were measured (benchmarks/README.md, "CPU engine choices"):
- torch intra-op threads: ``EngineConfig.num_threads`` (default: all cores).
- glibc malloc: by default every buffer above 128 KiB is a fresh mmap, so each
  (T, hidden) temporary of a prefill page-faults its memory in again; raising
  the mmap and trim thresholds keeps freed buffers in the heap for reuse, so a
  prefill's temporaries no longer page-fault on every pass. The price: freed memory
  stays with the process, so an engine that shuts down hands its heap back at once
  (``release_free_memory``).
"""

from __future__ import annotations

import logging

import torch

from radixlm.runtime.host_memory import glibc as _glibc
from radixlm.runtime.host_memory import release_free_memory

__all__ = ["configure_cpu", "release_free_memory"]

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_KEEP_BYTES = 1 << 30


def configure_cpu(num_threads: int) -> None:
    """Sets the calling thread's torch intra-op thread count and glibc's malloc
    thresholds (if glibc)."""
    # torch gives a thread its count lazily, at its first parallel op, from the last
    # count any thread set; a count set before that is then overwritten if another
    # thread set one meanwhile (a resumed loop thread ran with the caller's 1 thread,
    # and torch.compile's graphs, which guard on the count, were compiled again).
    # Reading the count first makes that initialisation happen now.
    torch.get_num_threads()
    torch.set_num_threads(num_threads)
    libc = _glibc()
    if libc is None:  # not glibc (musl, macOS): nothing to tune
        return
    mallopt = libc.mallopt
    if not (mallopt(_M_MMAP_THRESHOLD, _KEEP_BYTES) and mallopt(_M_TRIM_THRESHOLD, _KEEP_BYTES)):
        logger.debug("mallopt refused the thresholds; keeping malloc defaults")
