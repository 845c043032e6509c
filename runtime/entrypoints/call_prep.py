"""A call's preparation in its caller's context: every request checked and tokenized
(raising on the first bad one, before anything is queued), its constraints compiled
(waited for, or awaited on an event loop), its samples built into a ``Call``.

A large call (prompts and constraints past ``OFF_LOOP_CHARS`` characters) made on an
event loop is checked in a worker thread: tokenizing and parsing megabytes takes
seconds, and every other request on the loop would wait.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from radixlm.runtime.constrained import CompiledGrammar
from radixlm.runtime.constrained.compiler import PendingGrammar
from radixlm.runtime.constrained.spec import GRAMMAR_KINDS
from radixlm.runtime.entrypoints.call_streams import Call
from radixlm.runtime.entrypoints.engine_loop import EngineLoop
from radixlm.runtime.errors import EngineStoppedError, InvalidRequestError
from radixlm.runtime.executor.cpu_threads import release_free_memory
from radixlm.runtime.io.messages import GenerateRequest
from radixlm.runtime.io.request_builder import CheckedRequest, RequestBuilder
from radixlm.runtime.io.sglang_args import requests_of

__all__ = ["OFF_LOOP_CHARS", "CallPreparer"]

# A call whose prompts and constraints hold more characters than this is checked off the
# caller's event loop: past it, tokenizing and parsing cost far more than a thread's
# hand-off (benchmarks/README.md, "Hostile input").
OFF_LOOP_CHARS = 64 * 1024
_CHARS_PER_NODE = 8  # what a JSON container entry costs at least, in characters


class CallPreparer:
    """Prepares the calls of one engine: its request builder, and its loop (which
    drives the constraints' compiles)."""

    def __init__(self, builder: RequestBuilder, loop: EngineLoop) -> None:
        self._builder = builder
        self._loop = loop

    def sglang_call(self, *sglang_args: Any) -> Call:
        """``generate``'s arguments (in its order) as a prepared call."""
        return self.call(*requests_of(*sglang_args, vocab_size=self._builder.vocab_size))

    def call(self, requests: list[GenerateRequest], single: bool) -> Call:
        """Checks every request, waits here for their constraints, builds their samples.

        Raises:
            InvalidRequestError (a ValueError): a bad request; nothing was queued.
            EngineStoppedError: the engine was shut down.
        """
        checked, pending = self._check_and_start(requests)
        grammars = [self._loop.wait_grammar(p) for p in pending]
        return self._build(checked, grammars, single)

    async def call_async(self, requests: list[GenerateRequest], single: bool) -> Call:
        """``call`` on the caller's event loop: a compile is awaited, not waited, and a
        large call is checked in a worker thread, the memory that freed handed back to
        the OS after."""
        if not is_large(requests):
            checked, pending = self._check_and_start(requests)
        else:
            try:
                checked, pending = await asyncio.to_thread(self._check_and_start, requests)
            finally:
                await asyncio.to_thread(release_free_memory)
        grammars = [await self._loop.await_grammar(p) for p in pending]
        return self._build(checked, grammars, single)

    def _check_and_start(
        self, requests: list[GenerateRequest]
    ) -> tuple[list[CheckedRequest], list[PendingGrammar | None]]:
        if self._loop.stopping:
            raise EngineStoppedError("the engine was shut down")
        if not requests:
            raise InvalidRequestError("no requests to generate")
        checked = [self._builder.check(request) for request in requests]
        return checked, [self._builder.start_grammar(c) for c in checked]

    def _build(
        self,
        checked: list[CheckedRequest],
        grammars: list[CompiledGrammar | None],
        single: bool,
    ) -> Call:
        built: list = []
        for request, grammar in zip(checked, grammars, strict=True):
            built += self._builder.build(request, grammar, _new_rid, first_index=len(built))
        self._builder.check_call(built)
        # A single prompt with one sample returns a dict; anything else a list.
        return Call(tuple(built), returns_list=not single or len(built) > 1)


def _new_rid() -> str:
    """Unguessable (122 random bits): a client cannot abort another's request."""
    return uuid.uuid4().hex


def is_large(requests: list[GenerateRequest]) -> bool:
    """Whether a call's prompt texts and constraints hold over ``OFF_LOOP_CHARS``
    characters (a constraint given as a dict or list counts its strings and
    ``_CHARS_PER_NODE`` a node; the count stops at the threshold)."""
    budget = OFF_LOOP_CHARS
    for request in requests:
        params = request.sampling_params
        for value in (request.text, *(getattr(params, f, None) for f in GRAMMAR_KINDS)):
            budget -= _chars_up_to(value, budget + 1)
            if budget < 0:
                return True
    return False


def _chars_up_to(value: object, cap: int) -> int:
    """The characters of ``value``'s strings (and ``_CHARS_PER_NODE`` per container
    entry), counted no further than ``cap``."""
    total, stack = 0, [value]
    while stack and total < cap:
        node = stack.pop()
        if isinstance(node, str):
            total += len(node)
        elif isinstance(node, dict):
            total += _CHARS_PER_NODE * len(node)
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            total += _CHARS_PER_NODE * len(node)
            stack.extend(node)
    return total
