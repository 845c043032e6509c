"""One engine output -> a Responses ``response`` object, whole or as its typed events.

    ResponseBuilder.start()            response.created, response.in_progress
    ResponseBuilder.feed(delta, final) output items opening and growing:
        reasoning      output_item.added, reasoning_text.delta ... (with a reasoning plan)
        message        output_item.added, content_part.added, output_text.delta ...
        function_call  output_item.added, function_call_arguments.delta ...
    ResponseBuilder.finish(output)     per item, in order: output_text.done,
                                       content_part.done / function_call_arguments.done,
                                       output_item.done; then response.completed
                                       (or response.incomplete) carrying the body

A non-streamed response feeds the whole text once and keeps only the body, so both
paths build the same items by the same code. With tools, the text is split by
``ToolCallStream`` (content, then calls as they appear); without, the text is the
message's, untouched (as the chat route's ``content``). A message item opens at
the first content (at once without tools); an output with no item at all gets an
empty message, so ``output`` is never empty.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from radixlm.runtime.entrypoints.http.openai.reasoning_output import ReasoningPlan
from radixlm.runtime.io.messages import GenerateOutput
from radixlm.runtime.reasoning import ReasoningSplitter
from radixlm.runtime.tools.parser import ToolCallParser, ToolCallStream

__all__ = ["ResponseBuilder", "ResponseEcho", "new_response_id"]

Event = dict[str, Any]


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class ResponseEcho:
    """What every body of one response repeats: its id, creation time, and the
    request's settings as OpenAI echoes them (plain JSON-ready values)."""

    model: str
    settings: dict[str, Any]  # instructions, tools, text, temperature, store, ...
    id: str = field(default_factory=new_response_id)
    created_at: int = field(default_factory=lambda: int(time.time()))

    def body(self, status: str, output: list[dict], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "model": self.model,
            "output": output,
            "usage": None,
            **self.settings,
            **extra,
        }


# An output item's ``to_dict(status)`` is the item as OpenAI writes it. ``status``:
# "in_progress", or the finished response's, which a message and the reasoning take; a
# finished call's is its own (cut off or not).


@dataclass
class _Message:
    id: str
    text: str = ""

    def to_dict(self, status: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": [_text_part(self.text)],
        }


@dataclass
class _Reasoning:
    id: str
    text: str = ""

    def to_dict(self, status: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "reasoning",
            "status": status,
            "summary": [],
            "content": [{"type": "reasoning_text", "text": self.text}],
        }


@dataclass
class _Call:
    id: str
    call_id: str
    name: str
    arguments: str = ""
    complete: bool = False

    def to_dict(self, status: str) -> dict[str, Any]:
        if status != "in_progress":
            status = "completed" if self.complete else "incomplete"
        return {
            "id": self.id,
            "type": "function_call",
            "status": status,
            "call_id": self.call_id,
            "name": self.name,
            "arguments": self.arguments,
        }


@dataclass
class ResponseBuilder:
    """One response's items and events; ``sequence_number`` counts every event.

    tool_parser: the request has tools it may call (its text is split into content
    and calls); None: the text is all content.
    """

    echo: ResponseEcho
    tool_parser: ToolCallParser | None
    reasoning: ReasoningPlan | None = None  # the reasoning goes in an item of its own
    items: list[_Message | _Call | _Reasoning] = field(default_factory=list, init=False)
    sequence_number: int = field(default=0, init=False)
    _message: int | None = field(default=None, init=False)  # the message's output index
    _calls: dict[int, int] = field(default_factory=dict, init=False)  # call -> output index
    _parser: ToolCallStream = field(init=False)
    _splitter: ReasoningSplitter | None = field(default=None, init=False)
    _thought: int | None = field(default=None, init=False)  # the reasoning's output index

    def __post_init__(self) -> None:
        self._parser = ToolCallStream(self.tool_parser or ToolCallParser())
        if self.reasoning is not None:
            self._splitter = self.reasoning.splitter()

    def start(self) -> list[Event]:
        body = self.echo.body("in_progress", [])
        return [
            self._event("response.created", response=body),
            self._event("response.in_progress", response=body),
        ]

    def feed(self, delta: str, final: bool) -> list[Event]:
        """The events for ``delta``, the output's next text (``final``: its last)."""
        if self.reasoning is None:
            return self._answer(delta, final)
        assert self._splitter is not None
        parts = self._splitter.feed(delta, final)
        thought = self.reasoning.shown(parts)
        events = self._reasoning_text(thought) if thought else []
        return events + self._answer(parts.content, final)

    def _answer(self, delta: str, final: bool) -> list[Event]:
        """The events for the answer's next text: content, or content and calls."""
        if self.tool_parser is None:
            opens = self._message is None and self.reasoning is None  # at once, as ever
            return self._content(delta) if delta or opens else []
        parsed = self._parser.feed(delta, final)
        events = self._content(parsed.content) if parsed.content else []
        for entry in parsed.tool_calls:
            if "id" in entry:
                events += self._open_call(entry)
            else:
                events += self._arguments(entry["index"], entry["function"]["arguments"])
        if final:
            for i, call in enumerate(self._parser.parsed.calls):
                self._item(self._calls[i]).complete = call.complete
        return events

    def finish(self, out: GenerateOutput) -> tuple[list[Event], dict[str, Any]]:
        """The closing events and the finished body (with its usage)."""
        answered = any(not isinstance(item, _Reasoning) for item in self.items)
        events = [] if answered else self._open_message()
        status, details = _status(out)
        for index, item in enumerate(self.items):
            events += self._close(index, item, status)
        body = self.echo.body(
            status,
            [item.to_dict(status) for item in self.items],
            incomplete_details=details,
            usage=usage(out, self.reasoning),
            completed_at=int(time.time()) if status == "completed" else None,
        )
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return [*events, self._event(kind, response=body)], body

    def error(self, body: dict[str, Any]) -> Event:
        """An ``error`` event from OpenAI's error body (``{"error": {...}}``)."""
        e = body["error"]
        return self._event("error", code=e["code"], message=e["message"], param=e["param"])

    def assistant_message(self) -> dict[str, Any]:
        """The output as one chat message: what the next turn's history holds."""
        message: dict[str, Any] = {"role": "assistant", "content": None}
        calls = []
        for item in self.items:
            if isinstance(item, _Message):
                message["content"] = item.text
            elif isinstance(item, _Call):  # the reasoning is not carried to the next turn
                function = {"name": item.name, "arguments": item.arguments}
                calls.append({"id": item.call_id, "type": "function", "function": function})
        if calls:
            message["tool_calls"] = calls
        return message

    # ---- items ---------------------------------------------------------------------------

    def _content(self, text: str) -> list[Event]:
        events = self._open_message() if self._message is None else []
        assert self._message is not None
        message = self._item(self._message)
        message.text += text
        if text:
            events.append(
                self._event(
                    "response.output_text.delta",
                    item_id=message.id,
                    output_index=self._message,
                    content_index=0,
                    delta=text,
                    logprobs=[],
                )
            )
        return events

    def _reasoning_text(self, text: str) -> list[Event]:
        events = []
        if self._thought is None:
            self._thought = len(self.items)
            item = _Reasoning(f"rs_{uuid.uuid4().hex}")
            self.items.append(item)
            added = {**item.to_dict("in_progress"), "content": []}
            events.append(
                self._event("response.output_item.added", output_index=self._thought, item=added)
            )
        reasoning = self._item(self._thought)
        reasoning.text += text
        events.append(
            self._event(
                "response.reasoning_text.delta",
                item_id=reasoning.id,
                output_index=self._thought,
                content_index=0,
                delta=text,
            )
        )
        return events

    def _open_message(self) -> list[Event]:
        self._message = len(self.items)
        message = _Message(f"msg_{uuid.uuid4().hex}")
        self.items.append(message)
        return [
            self._event(
                "response.output_item.added",
                output_index=self._message,
                item={**message.to_dict("in_progress"), "content": []},
            ),
            self._event(
                "response.content_part.added",
                item_id=message.id,
                output_index=self._message,
                content_index=0,
                part=_text_part(""),
            ),
        ]

    def _open_call(self, entry: dict[str, Any]) -> list[Event]:
        index = len(self.items)
        self._calls[entry["index"]] = index
        call = _Call(f"fc_{uuid.uuid4().hex}", entry["id"], entry["function"]["name"])
        self.items.append(call)
        added = self._event(
            "response.output_item.added",
            output_index=index,
            item=call.to_dict("in_progress"),
        )
        return [added, *self._arguments(entry["index"], entry["function"]["arguments"])]

    def _arguments(self, call_index: int, fragment: str) -> list[Event]:
        if not fragment:
            return []
        index = self._calls[call_index]
        call = self._item(index)
        call.arguments += fragment
        return [
            self._event(
                "response.function_call_arguments.delta",
                item_id=call.id,
                output_index=index,
                delta=fragment,
            )
        ]

    def _close(self, index: int, item: _Message | _Call | _Reasoning, status: str) -> list[Event]:
        where = {"item_id": item.id, "output_index": index}
        if isinstance(item, _Reasoning):
            events = [
                self._event(
                    "response.reasoning_text.done", **where, content_index=0, text=item.text
                )
            ]
        elif isinstance(item, _Call):
            events = [
                self._event(
                    "response.function_call_arguments.done",
                    **where,
                    name=item.name,
                    arguments=item.arguments,
                )
            ]
        else:
            events = [
                self._event(
                    "response.output_text.done",
                    **where,
                    content_index=0,
                    text=item.text,
                    logprobs=[],
                ),
                self._event(
                    "response.content_part.done",
                    **where,
                    content_index=0,
                    part=_text_part(item.text),
                ),
            ]
        item_dict = item.to_dict(status)
        return [
            *events,
            self._event("response.output_item.done", output_index=index, item=item_dict),
        ]

    def _item(self, index: int) -> Any:
        return self.items[index]

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return event


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _status(out: GenerateOutput) -> tuple[str, dict[str, Any] | None]:
    """ "completed" when the model stopped by itself; else "incomplete", with the
    reason OpenAI names when ``max_output_tokens`` cut it off."""
    reason = None if out.finish_reason is None else out.finish_reason.type
    if reason == "stop":
        return "completed", None
    return "incomplete", {"reason": "max_output_tokens" if reason == "length" else None}


def usage(out: GenerateOutput, reasoning: ReasoningPlan | None = None) -> dict[str, Any]:
    num_output_tokens = len(out.output_ids)
    num_reasoning = 0 if reasoning is None else reasoning.num_reasoning_tokens(out.output_ids)
    return {
        "input_tokens": out.prompt_tokens,
        "input_tokens_details": {"cached_tokens": out.cached_tokens},
        "output_tokens": num_output_tokens,
        "output_tokens_details": {"reasoning_tokens": num_reasoning},
        "total_tokens": out.prompt_tokens + num_output_tokens,
    }
