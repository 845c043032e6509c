"""Continuous batching: request state, admission, KV budgeting, building each pass's
``ForwardBatch``, and applying its ``ModelOutput`` (tokens, stop rules,
jump-forward, detokenization, radix inserts). Only this package mutates a
``Request`` once it is queued."""

from radixlm.runtime.scheduling.request import Request, RequestStatus
from radixlm.runtime.scheduling.scheduler import ScheduledBatch, Scheduler, SchedulerStats

__all__ = ["Request", "RequestStatus", "ScheduledBatch", "Scheduler", "SchedulerStats"]
