"""A stream's text (or one variable) read in pieces while it is generated:
``text_iter`` and ``text_async_iter``.

Each piece is what was added since the last one; the pieces concatenate to the
final text. A streamed gen replaces its own text as chunks come (``replace_tail``),
and the text only grows at its end, so the characters already sent stay valid.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

from radixlm.stream_store import StreamStore

__all__ = ["iter_pieces_async", "iter_text"]


def iter_text(store: StreamStore, name: str | None) -> Iterator[str]:
    """The store's text (``name`` None) or variable ``name``'s, as it grows, until
    it is final; blocks between pieces."""
    sent = 0
    while True:
        current, final = store.wait_for_text(name, sent)
        if len(current) > sent:
            yield current[sent:]
            sent = len(current)
        if final and sent >= len(store.current(name)):
            return


async def iter_pieces_async(pieces: Iterator[str]) -> AsyncIterator[str]:
    """``pieces`` for asyncio: each blocking wait runs in the loop's default executor."""
    loop = asyncio.get_running_loop()
    done = object()
    while (piece := await loop.run_in_executor(None, next, pieces, done)) is not done:
        yield piece  # type: ignore[misc]
