"""The engine's counters as one frozen snapshot, read on the loop thread that owns them."""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixlm.runtime.entrypoints.assembly import Placement, Runtime
from radixlm.runtime.executor.cpu_paths import CpuPaths
from radixlm.runtime.executor.model_runner import PassCounts
from radixlm.runtime.histogram import HistogramSnapshot
from radixlm.runtime.scheduling.stats import LatencyHistograms
from radixlm.runtime.speculative.controller import SpecStats

if TYPE_CHECKING:
    from radixlm.runtime.distributed.group import CommStats
    from radixlm.runtime.scheduling.scheduler import Scheduler

__all__ = ["EngineStats", "read_stats"]


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's counters.

    KV pool: ``kv_capacity == kv_free + kv_cached + kv_used``, where ``kv_cached``
    slots hold prefixes only the radix cache keeps (evictable) and ``kv_used``
    slots belong to running requests (their own tokens and the cached prefixes
    they lock).
    """

    num_running: int
    num_waiting: int
    num_waiting_tokens: int  # prompt and output tokens of the waiting requests
    num_steps: int
    num_steps_ahead: int  # passes built while the one before them ran (overlap scheduling)
    num_retractions: int
    num_paced_passes: int  # passes whose prompt tokens target_tpot_ms cut
    num_prompt_tokens: int
    num_cached_tokens: int
    num_generated_tokens: int
    num_evicted_tokens: int
    num_jump_forward_tokens: int
    num_finished: int
    num_aborted: int  # finished with an abort (caller, failure, shutdown)
    mask_fill_median_s: float | None  # per pass with constrained rows, over recent passes
    latency: LatencyHistograms  # TTFT, inter-token, end-to-end and queue time, seconds
    grammar_compile_s: HistogramSnapshot  # each constraint compile (cache misses only)
    kv_capacity: int
    kv_free: int
    kv_cached: int
    cpu_paths: CpuPaths | None  # the forward path of each pass kind on the CPU
    placement: Placement  # the device, attention backend and CUDA graph sizes
    passes: PassCounts  # the passes each forward path ran
    # tensor parallelism: rank 0's collectives and the seconds they took (None: one rank)
    tensor_parallel: CommStats | None = None
    # speculative decoding: proposals verified and accepted, by source (None: off)
    speculative: SpecStats | None = None

    @property
    def kv_used(self) -> int:
        return self.kv_capacity - self.kv_free - self.kv_cached

    @property
    def cache_hit_rate(self) -> float:
        """Share of submitted prompt tokens served from the prefix cache."""
        return self.num_cached_tokens / self.num_prompt_tokens if self.num_prompt_tokens else 0.0


def read_stats(rt: Runtime) -> EngineStats:
    """The counters of ``rt`` now. Call on the thread that runs its loop (or once no
    loop runs): they are that thread's to change."""
    s, alloc = rt.scheduler, rt.allocator
    fills = tuple(s.stats.mask_fill_seconds)
    return EngineStats(
        num_running=len(s.running),
        num_waiting=len(s.waiting),
        num_waiting_tokens=sum(r.num_total_tokens for r in s.waiting),
        num_steps=s.stats.num_steps,
        num_steps_ahead=s.stats.num_steps_ahead,
        num_retractions=s.stats.num_retractions,
        num_paced_passes=s.stats.num_paced_passes,
        num_prompt_tokens=s.stats.num_prompt_tokens,
        num_cached_tokens=s.stats.num_cached_tokens,
        num_generated_tokens=s.stats.num_generated_tokens,
        num_evicted_tokens=s.cache.num_evicted_tokens,
        num_jump_forward_tokens=s.stats.num_jump_forward_tokens,
        num_finished=s.stats.num_finished,
        num_aborted=s.stats.num_aborted,
        mask_fill_median_s=statistics.median(fills) if fills else None,
        latency=s.stats.latencies(),
        grammar_compile_s=rt.request_builder.grammars.stats.seconds.snapshot(),
        kv_capacity=alloc.capacity,
        kv_free=alloc.num_free,
        kv_cached=s.cache.evictable_size,
        cpu_paths=rt.cpu_paths,
        placement=rt.placement,
        passes=rt.runner.pass_counts(),
        tensor_parallel=_comm_stats(rt),
        speculative=_spec_stats(s),
    )


def _spec_stats(s: Scheduler) -> SpecStats | None:
    """The speculator's counters, with jump-forward's forced tokens as proposals of a
    source of their own, all accepted (None: no speculation)."""
    if s.speculator is None:
        return None
    snapshot = s.speculator.stats.snapshot()
    if s.stats.num_jump_forward_tokens:
        forced = s.stats.num_jump_forward_tokens
        snapshot.proposed["jump_forward"] = snapshot.accepted["jump_forward"] = forced
    return snapshot


def _comm_stats(rt: Runtime) -> CommStats | None:
    ranks = rt.runner.tensor_parallel
    return None if ranks is None else dataclasses.replace(ranks.group.stats)
