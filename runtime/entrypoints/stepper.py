"""The engine loop's step: the scheduler's passes through the model runner, one at a
time or overlapped.

One at a time (the CPU's default)::

    schedule N -> launch N (runs) -> apply N, publish -> schedule N+1 -> ...

Overlapped (``overlap=True``, a GPU's default): pass N+1 is scheduled and launched
before pass N's results are applied, so the host's share of a step (scheduling,
building the pass, applying results, detokenising, publishing) runs while the device
computes the next pass; decodes of N+1 carry N's sampled ids on the device
(``Scheduler`` and ``ModelRunner.launch`` say how)::

    host:    schedule N+1 | launch N+1 | apply N, publish | schedule N+2 | launch N+2 | ...
    device:  ... pass N ]              [ pass N+1 ......................]            [ pass N+2

When the scheduler needs pass N's results before it can build N+1 (a grammar, a
penalty, speculation, a retraction), the step applies N first and then schedules:
that step runs one at a time. Outputs are the same either way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from radixlm.runtime.errors import RankFailedError
from radixlm.runtime.executor.model_runner import ModelRunner, PendingOutput
from radixlm.runtime.io.messages import OutputDelta
from radixlm.runtime.scheduling.scheduler import ScheduledBatch, Scheduler

__all__ = ["Stepper"]

logger = logging.getLogger(__name__)

# a launched pass, its results not read yet, and when the step that scheduled it began
# (perf_counter)
Launched = tuple[ScheduledBatch, PendingOutput, float]


class Stepper:
    """Steps ``scheduler``'s passes through ``runner``; ``publish`` hears each step's
    deltas. A pass that raises fails its requests (``Scheduler.fail_batch``), not the
    engine; a ``RankFailedError`` propagates (the ranks are out of step)."""

    def __init__(
        self,
        scheduler: Scheduler,
        runner: ModelRunner,
        overlap: bool,
        publish: Callable[[list[OutputDelta]], None],
    ) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.overlap = overlap
        self._publish = publish
        self._in_flight: Launched | None = None  # launched, results not applied yet
        self._last_end = 0.0  # when the last pass's results were published (perf_counter)

    @property
    def in_flight(self) -> bool:
        """Whether a launched pass's results wait to be applied (by the next step)."""
        return self._in_flight is not None

    def step(self) -> bool:
        """Schedules and launches the next pass and applies the results of the pass
        before it (overlapped) or of its own (one at a time). Returns whether a pass
        was launched."""
        started = time.perf_counter()
        scheduler = self.scheduler
        previous, self._in_flight = self._in_flight, None
        batch = scheduler.schedule()
        if batch is None and previous is not None:  # the next pass needs its results
            self._complete(previous)
            previous = None
            batch = scheduler.schedule()
        launched = None if batch is None else self._launch(batch, previous, started)
        if previous is not None:
            self._complete(previous)
        if launched is not None and self.overlap:
            self._in_flight = launched
        elif launched is not None:
            self._complete(launched)
        return batch is not None

    def _launch(
        self, batch: ScheduledBatch, previous: Launched | None, started: float
    ) -> Launched | None:
        """Starts the pass (after ``previous``, whose sampled ids it may carry)."""
        try:
            pending = self.runner.launch(batch.forward, previous[1] if previous else None)
        except RankFailedError:
            raise
        except Exception as exc:
            self._fail(batch, exc)
            return None
        return batch, pending, started

    def _complete(self, launched: Launched) -> None:
        """Waits for a launched pass's results, applies and publishes them. The pass's
        time goes to the scheduler: from the start of the step that scheduled it (or the
        publishing of the pass before it, when later: overlapped passes) to its own
        publishing, i.e. what a request decoding in it waited for its token."""
        batch, pending, started = launched
        try:
            output = pending.result()
        except RankFailedError:
            raise
        except Exception as exc:
            self._fail(batch, exc)
            return
        self._publish(self.scheduler.process_output(batch, output))
        end = time.perf_counter()
        self.scheduler.observe_pass(batch, end - max(started, self._last_end))
        self._last_end = end

    def _fail(self, batch: ScheduledBatch, exc: Exception) -> None:
        logger.exception("model pass failed")
        self._publish(self.scheduler.fail_batch(batch, f"model pass failed: {exc!r}"))
