"""The C heap's free memory handed back to the OS (glibc; elsewhere nothing).

Lowest layer: the loader hands memory back while it reads a checkpoint, the executor
(``cpu_threads``, which raises glibc's trim thresholds) when an engine shuts down.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["glibc", "release_free_memory"]


def release_free_memory() -> None:
    """Hands the C heap's free pages back to the OS (glibc; elsewhere nothing): a
    few milliseconds where the heap holds many free chunks."""
    libc = glibc()
    if libc is not None:
        libc.malloc_trim(0)


@functools.cache
def glibc() -> ctypes.CDLL | None:
    """The C library where it is glibc (it has mallopt and malloc_trim), else None."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    # glibc has both; musl and macOS do not.
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
