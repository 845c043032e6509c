"""The scheduler's counters, shared by its parts.

Ownership: one ``SchedulerStats`` per ``Scheduler``; the scheduler and the parts
it composes (``KVBudget``, ``BatchBuilder``, ``OutputProcessor``) add to it on
the engine loop thread; the engine only reads it (``get_stats``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

__all__ = ["SchedulerStats"]


@dataclass
class SchedulerStats:
    num_steps: int = 0
    num_retractions: int = 0
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at admission
    num_generated_tokens: int = 0
    num_finished: int = 0
    num_jump_forward_tokens: int = 0  # output tokens appended by jump-forward, not decoded
    # seconds spent filling grammar bitmasks, one entry per pass that had any (recent ones)
    mask_fill_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=4096))
