"""Engine outputs -> OpenAI's response bodies (plain JSON-ready dicts).

    GenerateOutput (final) --> chat.completion / text_completion choice
                               (with tools: content and tool_calls, by tools.parser)
    StreamChunk            --> chat.completion.chunk / text_completion chunk
    token logprobs         --> chat's logprobs.content[] or completions' parallel lists

One ``ResponseFormatter`` per HTTP request: it holds the response id, the
creation time and the model name every body of that request repeats.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.entrypoints.http.openai.reasoning_output import ReasoningPlan
from radixlm.runtime.entrypoints.http.server.token_text import TokenTexts
from radixlm.runtime.io.messages import FinishReason, GenerateOutput, TokenLogprob
from radixlm.runtime.tools.parser import (
    ParsedOutput,
    ToolCallParser,
    new_call_id,
    tool_finish_reason,
)

__all__ = ["ResponseFormatter", "finish_reason", "tool_message", "usage"]


def finish_reason(reason: FinishReason | None) -> str | None:
    """OpenAI's names: "stop", "length"; an aborted request reads "abort" (as SGLang)."""
    return None if reason is None else reason.type


def usage(
    outputs: Sequence[GenerateOutput], n: int, reasoning: ReasoningPlan | None = None
) -> dict[str, Any]:
    """Token totals; a prompt's tokens count once however many samples it had. With a
    reasoning plan (a chat call to a reasoning model), the completion tokens spent
    reasoning too (``completion_tokens_details.reasoning_tokens``, as OpenAI's)."""
    prompt = sum(out.prompt_tokens for out in outputs[::n])
    cached = sum(out.cached_tokens for out in outputs[::n])
    completion = sum(len(out.output_ids) for out in outputs)
    totals: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    if reasoning is not None:
        thought = sum(reasoning.num_reasoning_tokens(out.output_ids) for out in outputs)
        totals["completion_tokens_details"] = {"reasoning_tokens": thought}
    return totals


def tool_message(parsed: ParsedOutput) -> dict[str, Any]:
    """An assistant message with OpenAI's ``tool_calls`` (only when there are calls)."""
    if not parsed.calls:
        return {"role": "assistant", "content": parsed.content}
    calls = [
        {
            "id": new_call_id(),
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for call in parsed.calls
    ]
    return {"role": "assistant", "content": parsed.content or None, "tool_calls": calls}


@dataclass
class ResponseFormatter:
    """kind: "chat" or "completion"; model: the name the client asked for."""

    kind: str
    model: str
    tokens: TokenTexts
    id: str = field(default_factory=lambda: f"radixlm-{uuid.uuid4().hex}")
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def _prefix(self) -> str:
        return "chatcmpl" if self.kind == "chat" else "cmpl"

    def envelope(self, object_name: str, choices: list[dict], extra: dict | None = None) -> dict:
        return {
            "id": f"{self._prefix}-{self.id}",
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **(extra or {}),
        }

    # ---- chat ---------------------------------------------------------------------------

    def chat_choice(
        self, out: GenerateOutput, tool_parser: ToolCallParser | None = None
    ) -> dict[str, Any]:
        """tool_parser: the request had tools it may call; its text is split into
        content and ``tool_calls`` (content null when the output is only calls)."""
        message: dict[str, Any] = {"role": "assistant", "content": out.text}
        reason = finish_reason(out.finish_reason)
        if tool_parser is not None:
            parsed = tool_parser.parse(out.text)
            message = tool_message(parsed)
            reason = tool_finish_reason(parsed, reason)
        choice = {
            "index": out.index,
            "message": message,
            "logprobs": self.chat_logprobs(out.output_logprobs) if out.logprob.enabled else None,
            "finish_reason": reason,
        }
        if out.grammar_warnings:  # json_schema_lenient dropped keywords: say which
            choice["grammar_warnings"] = list(out.grammar_warnings)
        return choice

    def chat_chunk_choice(
        self, index: int, delta: dict, logprobs: Sequence[TokenLogprob] | None, reason: str | None
    ) -> dict[str, Any]:
        return {
            "index": index,
            "delta": delta,
            "logprobs": None if logprobs is None else self.chat_logprobs(logprobs),
            "finish_reason": reason,
        }

    def chat_logprobs(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        """``{"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}``."""
        return {"content": [self._chat_entry(lp, tok, top) for lp, tok, top in entries]}

    def _chat_entry(self, logprob: float, token_id: int, top: list[tuple[float, int]]) -> dict:
        entry = self._token(logprob, token_id)
        entry["top_logprobs"] = [self._token(lp, tok) for lp, tok in top]
        return entry

    def _token(self, logprob: float, token_id: int) -> dict[str, Any]:
        raw = self.tokens.token_bytes(token_id)
        return {
            "token": raw.decode("utf-8", errors="replace"),
            "logprob": logprob,
            "bytes": list(raw),
        }

    # ---- completions --------------------------------------------------------------------

    def completion_choice(self, out: GenerateOutput, echo_text: str | None) -> dict[str, Any]:
        """echo_text: the prompt's text when the client asked for ``echo``."""
        text = out.text if echo_text is None else echo_text + out.text
        logprobs = None
        if out.logprob.enabled:
            logprobs = self.completion_logprobs(out, echo=echo_text is not None)
        return {
            "index": out.index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": finish_reason(out.finish_reason),
        }

    def completion_logprobs(self, out: GenerateOutput, echo: bool) -> dict[str, Any]:
        """Parallel lists: tokens, token_logprobs, top_logprobs ({text: logprob}),
        text_offset (each token's start in the returned text)."""
        entries: list[tuple[float | None, int, list[tuple[float, int]]]] = []
        if echo:
            computed = dict(out.prompt_logprobs)
            # Position 0 has no context to be predicted from: logprob None (as OpenAI).
            entries += [computed.get(p, (None, t, [])) for p, t in enumerate(out.prompt_ids)]
        entries += list(out.output_logprobs)
        return self._parallel_lists(entries, out.logprob.top_k > 0)

    def completion_chunk_logprobs(self, entries: Sequence[TokenLogprob], offset: int) -> dict:
        return self._parallel_lists(list(entries), with_top=True, offset=offset)

    def _parallel_lists(self, entries: list, with_top: bool, offset: int = 0) -> dict[str, Any]:
        tokens, logprobs, tops, offsets = [], [], [], []
        for lp, tok, top in entries:
            text = self.tokens.text(tok)
            tokens.append(text)
            logprobs.append(lp)
            tops.append({self.tokens.text(t): v for v, t in top} if lp is not None else None)
            offsets.append(offset)
            offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": logprobs,
            "top_logprobs": tops if with_top else None,
            "text_offset": offsets,
        }
