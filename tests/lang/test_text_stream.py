"""Text in pieces while a writer appends: the pieces concatenate to the final text,
for the whole text and for one variable, synchronously and with asyncio."""

from __future__ import annotations

import asyncio
import threading
import time

from radixlm.stream_store import StreamStore
from radixlm.text_stream import iter_pieces_async, iter_text


def write_slowly(store: StreamStore) -> None:
    store.expect(["v"])
    for piece in ("a", "bc", "d"):
        time.sleep(0.01)
        store.append(piece)
        store.set_var("v", store.text)
    store.release(["v"])
    time.sleep(0.01)
    store.append("!")
    store.finish()


def test_pieces_concatenate_to_the_final_text_and_variable():
    store = StreamStore()
    writer = threading.Thread(target=write_slowly, args=(store,))
    writer.start()
    whole = list(iter_text(store, None))
    writer.join()
    assert "".join(whole) == "abcd!" and len(whole) > 1
    assert "".join(iter_text(store, "v")) == "abcd"


def test_a_variable_ends_when_released_before_the_stream_does():
    store = StreamStore()
    store.expect(["v"])
    store.set_var("v", "xy")
    store.release(["v"])
    assert list(iter_text(store, "v")) == ["xy"]
    assert not store.finished


def test_async_pieces():
    store = StreamStore()
    writer = threading.Thread(target=write_slowly, args=(store,))
    writer.start()

    async def collect() -> list[str]:
        return [p async for p in iter_pieces_async(iter_text(store, None))]

    assert "".join(asyncio.run(collect())) == "abcd!"
    writer.join()
