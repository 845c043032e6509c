"""OutputProcessor: the stop rules of a sampled token, in order, and who is retired."""

from __future__ import annotations

from radixlm.runtime.executor.forward_batch import ModelOutput
from radixlm.runtime.io.messages import FinishReason
from radixlm.runtime.scheduling.batch_builder import ScheduledBatch
from radixlm.runtime.scheduling.output_processor import OutputProcessor, deltas
from radixlm.runtime.scheduling.request import Request, RequestStatus
from radixlm.runtime.scheduling.stats import SchedulerStats
from tests.runtime.scheduling.helpers import EOS, FakeDetokenizer, request


def make_processor() -> tuple[OutputProcessor, list[str], SchedulerStats]:
    retired: list[str] = []
    stats = SchedulerStats()
    return OutputProcessor(stats, None, retire=lambda r: retired.append(r.rid)), retired, stats


def running(rid: str, **kwargs) -> Request:
    req = request(rid, [300, 301], **kwargs)
    req.status = RequestStatus.RUNNING
    return req


def feed(processor: OutputProcessor, req: Request, tokens: list[int]) -> None:
    """One pass per token, each sampling only ``req`` (no forward batch needed)."""
    for token in tokens:
        batch = ScheduledBatch(None, (), (req,), ())  # type: ignore[arg-type]
        processor.apply(batch, ModelOutput([token], [], []))


def test_max_new_tokens_ends_with_length_and_flushes_held_text():
    processor, retired, stats = make_processor()
    req = running("r", max_new=3, detokenizer=FakeDetokenizer(held=402))
    feed(processor, req, [400, 401, 402])
    assert req.finish_reason == FinishReason("length", length=3)
    assert req.text == "<400><401><402>"  # the held-back <402> came out on finishing
    assert retired == ["r"] and (stats.num_finished, stats.num_generated_tokens) == (1, 3)


def test_a_stop_id_counts_only_after_min_new_tokens_and_is_trimmed_unless_asked():
    processor, retired, _ = make_processor()
    early = running("early", max_new=5, min_new=2)
    feed(processor, early, [EOS, 400, EOS, 401])  # the last: the request finished already
    assert early.output_ids == [EOS, 400, EOS] and early.finish_reason.matched == EOS
    assert early.text == f"<{EOS}><400>"
    kept = running("kept", max_new=5, no_stop_trim=True)
    feed(processor, kept, [400, EOS])
    assert kept.text == f"<400><{EOS}>"
    assert retired == ["early", "kept"]


def test_a_stop_string_ends_without_flushing_and_a_waiting_request_is_not_retired():
    processor, retired, _ = make_processor()
    req = running("r", max_new=9, detokenizer=FakeDetokenizer(held=401, stop_id=402))
    feed(processor, req, [400, 401, 402])
    assert req.finish_reason == FinishReason("stop", matched="STOP")
    assert req.text == "<400>"  # held text before a stop string is never shown
    queued = request("q", [300])
    processor.finish(queued, FinishReason("abort", message="x"))
    assert retired == ["r"] and queued.finished
    assert [d.rid for d in deltas([req, queued])] == ["r", "q"]
