"""What one streamed chunk costs between the engine and the SSE writer, early and late in
a long stream: the chunk's deltas against its whole output so far.

A 4,000-token stream with 5 top logprobs per token, as the engine loop publishes it
(``OutputDelta``s), goes through the caller's ``OutputAssembler`` and becomes, per chunk:

  chat        a ``chat.completion.chunk`` SSE event with the new tokens' logprobs
  generate    SGLang's streamed ``/generate`` event, incremental (text, ids and
              logprobs new since the previous event)

each built two ways in the same run:

  delta       from the chunk's deltas (``new_output_logprobs``, ``event_dict``): what
              the routes do
  whole       from the chunk's whole output so far (``chunk.output``, ``to_dict``) and
              sliced to what is new: what they did while every chunk rebuilt the output

It prints the median microseconds per chunk over the first and the last 100 chunks and
their ratio (last / first: 1 is flat in the stream's length). No model: the deltas are
made up, the formatting is the routes' own.

Usage: python benchmarks/bench_stream_chunks.py [--tokens 4000] [--top 5] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace

from radixlm.runtime.entrypoints.http.openai.format import ResponseFormatter
from radixlm.runtime.entrypoints.http.server.sse import sse_event
from radixlm.runtime.io.messages import FinishReason, LogprobSpec, OutputDelta, StreamChunk
from radixlm.runtime.io.output_assembler import OutputAssembler

PROMPT = tuple(range(100, 164))
WINDOW = 100


class _Texts:
    """Token texts without a tokenizer: token i is ``w<i>``."""

    def token_bytes(self, token_id: int) -> bytes:
        return f"w{token_id}".encode()

    def text(self, token_id: int) -> str:
        return f"w{token_id}"


def _deltas(num_tokens: int, top: int) -> list[OutputDelta]:
    deltas = []
    for i in range(num_tokens):
        token = 1000 + i % 30000
        alternatives = [(-0.1 * (k + 1), token + k) for k in range(top)]
        last = i == num_tokens - 1
        deltas.append(
            OutputDelta(
                rid="r",
                text=f" w{token}",
                num_kept_ids=i,
                new_ids=(token,),
                output_logprobs=((-0.1, token, alternatives),),
                prompt_logprobs=(),
                cached_tokens=0,
                e2e_latency=0.0,
                ttft=None,
                finish_reason=FinishReason("length") if last else None,
            )
        )
    return deltas


def _chat_delta(fmt: ResponseFormatter) -> Callable[[StreamChunk, dict], bytes]:
    def event(chunk: StreamChunk, sent: dict) -> bytes:
        new = list(chunk.new_output_logprobs)
        choice = fmt.chat_chunk_choice(chunk.index, {"content": chunk.delta}, new, None)
        return sse_event(fmt.envelope("chat.completion.chunk", [choice]))

    return event


def _chat_whole(fmt: ResponseFormatter) -> Callable[[StreamChunk, dict], bytes]:
    def event(chunk: StreamChunk, sent: dict) -> bytes:
        out = chunk.output
        new = list(out.output_logprobs[sent.get("logprobs", 0) :])
        sent["logprobs"] = len(out.output_logprobs)
        choice = fmt.chat_chunk_choice(out.index, {"content": chunk.delta}, new, None)
        return sse_event(fmt.envelope("chat.completion.chunk", [choice]))

    return event


def _generate_delta(chunk: StreamChunk, sent: dict) -> bytes:
    return sse_event(chunk.event_dict(incremental=True))


def _generate_whole(chunk: StreamChunk, sent: dict) -> bytes:
    event = chunk.to_dict()
    meta = dict(event["meta_info"])
    ids = event["output_ids"]
    for key in ("output_token_logprobs", "output_top_logprobs"):
        meta[key] = meta[key][sent.get("logprobs", 0) :]
    event = {
        **event,
        "meta_info": meta,
        "text": chunk.delta,
        "output_ids": ids[sent.get("ids", 0) :],
    }
    sent["logprobs"], sent["ids"] = len(ids), len(ids)
    return sse_event(event)


def _per_chunk_us(
    deltas: list[OutputDelta], top: int, event: Callable[[StreamChunk, dict], bytes]
) -> list[float]:
    request = SimpleNamespace(
        rid="r",
        index=0,
        prompt_ids=PROMPT,
        logprob=LogprobSpec(enabled=True, start_len=len(PROMPT), top_k=top),
        grammar_warnings=(),
    )
    assembler = OutputAssembler([request])  # type: ignore[list-item]
    sent: dict = {}
    times = []
    for delta in deltas:
        start = time.perf_counter()
        event(assembler.apply(delta), sent)
        times.append((time.perf_counter() - start) * 1e6)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    deltas = _deltas(args.tokens, args.top)
    fmt = ResponseFormatter("chat", "bench", _Texts())  # type: ignore[arg-type]
    ways = {
        ("chat", "delta"): _chat_delta(fmt),
        ("chat", "whole"): _chat_whole(fmt),
        ("generate", "delta"): _generate_delta,
        ("generate", "whole"): _generate_whole,
    }
    print(f"{args.tokens}-token stream, {args.top} top logprobs, median us per chunk")
    print(f"{'event':<10} {'built from':<10} {'first 100':>10} {'last 100':>10} {'last/first':>11}")
    for (kind, way), event in ways.items():
        firsts, lasts = [], []
        for _ in range(args.repeats):
            times = _per_chunk_us(deltas, args.top, event)
            firsts.append(statistics.median(times[:WINDOW]))
            lasts.append(statistics.median(times[-WINDOW:]))
        first, last = statistics.median(firsts), statistics.median(lasts)
        print(f"{kind:<10} {way:<10} {first:>10.1f} {last:>10.1f} {last / first:>10.2f}x")


if __name__ == "__main__":
    main()
