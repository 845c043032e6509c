"""``/health_generate``: can the engine generate a token now? (a readiness probe)

    probe: token id 0 as the prompt, one greedy token, ``log_metrics=False``
    200: it came back finished with its one token within the timeout
    503: the engine is stopped (or its loop died), the probe failed or was aborted
         (a failing pass, a shutdown), or no token came within the timeout

``/health`` only says that the HTTP server answers (a liveness probe); this one goes
through the engine's queue, scheduler, model and sampler like any request, so it also
waits behind what is queued (a server saturated past the timeout answers 503: ready to
take no more). The probe counts in none of the engine's metrics and uses no admission
slot; like any request it leaves its two tokens in the radix cache (an LRU: evicted
first when space runs short).

Probes do not pile up: while one runs, every other ``/health_generate`` waits for its
answer instead of starting another, so a flood of calls costs one probe at a time (the
route needs no API key, as SGLang's: Kubernetes probes carry no secrets).
"""

from __future__ import annotations

import asyncio
import logging

from radixlm.runtime.entrypoints.engine import Engine
from radixlm.runtime.io.messages import GenerateOutput, GenerateRequest
from radixlm.runtime.io.sampling_params import SamplingParams

__all__ = ["HealthProbe"]

logger = logging.getLogger("radixlm.http")
_PROBE = GenerateRequest(
    input_ids=(0,),
    sampling_params=SamplingParams(max_new_tokens=1, temperature=0.0),
    log_metrics=False,
)


class HealthProbe:
    """One engine's generation probe; ``check`` shares a running probe's answer."""

    def __init__(self, engine: Engine, timeout_s: float) -> None:
        self._engine = engine
        self._timeout_s = timeout_s
        self._running: asyncio.Future[bool] | None = None

    async def check(self) -> bool:
        """Whether the engine generated the probe's token within the timeout."""
        if self._running is None or self._running.done():
            self._running = asyncio.ensure_future(self._probe())
        # shielded: a caller that leaves does not cancel the probe others wait on
        return await asyncio.shield(self._running)

    async def _probe(self) -> bool:
        try:
            work = self._engine.async_generate_requests([_PROBE])
            (output,) = await asyncio.wait_for(work, self._timeout_s)
        except asyncio.TimeoutError:  # noqa: UP041 (not TimeoutError before Python 3.11)
            logger.warning("health_generate: no token within %g s", self._timeout_s)
            return False
        except Exception as e:  # the engine is stopped, or its loop died
            logger.warning("health_generate: %s: %s", type(e).__name__, e)
            return False
        return _generated(output)


def _generated(output: GenerateOutput) -> bool:
    reason = output.finish_reason
    if reason is None or reason.type == "abort" or len(output.output_ids) != 1:
        message = reason.message if reason is not None else "unfinished"
        logger.warning("health_generate: the probe generated nothing (%s)", message)
        return False
    return True
