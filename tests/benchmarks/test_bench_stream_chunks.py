"""bench_stream_chunks.py builds the same events both ways: from a chunk's deltas and
from its whole output cut back (so its comparison is of costs, not of contents)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import bench_stream_chunks as bench  # noqa: E402

from radixlm.runtime.io.messages import StreamChunk  # noqa: E402


def _events(event, num_tokens: int = 40) -> list[dict]:
    """The events of a made-up stream, each decoded from its SSE bytes."""
    out: list[dict] = []

    def record(chunk: StreamChunk, sent: dict) -> bytes:
        data = event(chunk, sent)
        out.append(json.loads(data.removeprefix(b"data: ")))
        return data

    bench._per_chunk_us(bench._deltas(num_tokens, top=3), 3, record)
    return out


def test_both_ways_build_the_same_events():
    fmt = bench.ResponseFormatter("chat", "bench", bench._Texts())
    chat_delta, chat_whole = _events(bench._chat_delta(fmt)), _events(bench._chat_whole(fmt))
    strip = lambda e: {k: v for k, v in e.items() if k != "created"}  # noqa: E731
    assert [strip(e) for e in chat_delta] == [strip(e) for e in chat_whole]
    assert len(chat_delta) == 40
    assert all(len(e["choices"][0]["logprobs"]["content"]) == 1 for e in chat_delta)
    generate_delta = _events(bench._generate_delta)
    generate_whole = _events(bench._generate_whole)
    for a, b in zip(generate_delta, generate_whole, strict=True):
        assert (a["text"], a["output_ids"]) == (b["text"], b["output_ids"])
        assert a["meta_info"]["output_token_logprobs"] == b["meta_info"]["output_token_logprobs"]
