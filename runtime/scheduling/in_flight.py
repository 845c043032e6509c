"""The passes scheduled whose results are not applied yet (overlap scheduling).

A pass counts as computed when it is scheduled (``Scheduler.schedule``). While it is in
flight its sampled tokens are unseen by the host: each request it samples for counts
one more ``num_unseen`` token, and a decode built on such a token (a pass scheduled
ahead, ``BatchBuilder.build``) counts one more ``num_ahead`` position. Applying (or
failing) the pass takes both back. The next pass may be built ahead only for requests
whose next step does not need their token on the host (``runs_ahead``).

Ownership: mutates only those two counters and ``sample_index`` of the requests of the
passes it tracks; the ``Scheduler`` calls it.
"""

from __future__ import annotations

from collections import deque

from radixlm.runtime.scheduling.batch_builder import ScheduledBatch
from radixlm.runtime.scheduling.request import Request

__all__ = ["PassesInFlight", "certainly_finishes", "runs_ahead"]


class PassesInFlight:
    """Scheduled passes whose results are not applied yet, oldest first (at most two:
    the one being applied and the one built ahead of it)."""

    def __init__(self) -> None:
        self._passes: deque[ScheduledBatch] = deque()

    def __len__(self) -> int:
        return len(self._passes)

    def start(self, batch: ScheduledBatch) -> ScheduledBatch:
        """The pass is on its way: its tokens count as computed, its samples as unseen."""
        for w in batch.work:
            w.req.num_computed_tokens = w.start + w.num_tokens
        for req in batch.carried:
            req.num_ahead += 1
        for i, req in enumerate(batch.sampled):
            req.num_unseen += 1
            req.sample_index = i
        self._passes.append(batch)
        return batch

    def settle(self, batch: ScheduledBatch) -> None:
        """The pass is over (applied or failed): its samples are no longer unseen."""
        self._passes.remove(batch)
        for req in batch.carried:
            req.num_ahead -= 1
        for req in batch.sampled:
            req.num_unseen -= 1

    def uncached_prefills(self) -> list[Request]:
        """Requests whose prompt chunk a pass in flight computes: not cached until the
        pass is applied, so a queued request sharing it should wait for it."""
        return [w.req for batch in self._passes for w in batch.work if w.num_tokens > 1]


def runs_ahead(req: Request, speculating: bool) -> bool:
    """Whether ``req``'s next pass may be built before the host reads its token: no
    grammar (the mask follows the token), no penalty (the sampler reads the ids), no
    speculation (proposals continue the ids)."""
    params = req.params
    return (
        req.grammar is None
        and not speculating
        and params.repetition_penalty == 1.0
        and params.frequency_penalty == 0
        and params.presence_penalty == 0
    )


def certainly_finishes(req: Request) -> bool:
    """Its token in flight is its last (``max_new_tokens``), whatever the token is."""
    return len(req.output_ids) + req.num_unseen >= req.params.max_new_tokens
