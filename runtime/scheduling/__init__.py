"""Continuous batching: request state, admission policy, KV budgeting, building each
pass's ``ForwardBatch``, and applying its ``ModelOutput`` (tokens, stop rules,
jump-forward, detokenization, radix inserts). Only this package mutates a
``Request`` once it is queued.

    request           Request (mutable, scheduler-side) -> OutputDelta (what changed)
    policy            AdmissionPolicy: queue order (fcfs / lpm), wait-for-shared-prefix
    kv_budget         KVBudget: slots, req_to_token rows, prefix cache match/lock/insert
    batch_builder     WorkItem -> ScheduledBatch (ForwardBatch, prompt-logprob plan, mask)
    output_processor  OutputProcessor: ModelOutput -> tokens, stops, grammar, finishes
    scheduler         Scheduler: the queues, composing the four above
"""

from radixlm.runtime.scheduling.batch_builder import ScheduledBatch, WorkItem
from radixlm.runtime.scheduling.request import Request, RequestStatus
from radixlm.runtime.scheduling.scheduler import Scheduler
from radixlm.runtime.scheduling.stats import SchedulerStats

__all__ = [
    "Request",
    "RequestStatus",
    "ScheduledBatch",
    "Scheduler",
    "SchedulerStats",
    "WorkItem",
]
