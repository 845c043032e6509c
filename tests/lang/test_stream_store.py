"""The stream store: variables readers wait for, the text's edits, forks' copies and
joins' gathering, reasoning split out of a variable."""

from __future__ import annotations

import threading

import pytest

from radixlm.stream_store import StreamStore, split_reasoning_text


def test_a_reader_of_an_expected_variable_waits_for_its_release():
    store = StreamStore()
    store.expect(["x"])
    assert "x" in store and "y" not in store
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(store.get_var("x")))
    reader.start()
    reader.join(0.05)
    assert reader.is_alive() and got == []
    store.set_var("x", "42")
    store.release(["x"])
    reader.join(1)
    assert got == ["42"]


def test_a_variable_never_set_raises_with_the_failure_note():
    store = StreamStore()
    store.expect(["x"])
    store.release(["x"])  # released after a failure: nothing set
    with pytest.raises(KeyError, match=r"'x' is not set \(the program failed: boom\)"):
        store.get_var("x", " (the program failed: boom)")
    with pytest.raises(KeyError, match="'y' is not set"):
        store.get_meta_info("y")


def test_finish_wakes_every_reader_and_makes_everything_final():
    store = StreamStore()
    store.expect(["x"])
    assert not store.is_final(None) and not store.is_final("x")
    store.finish()
    assert store.finished and store.is_final(None) and store.is_final("x")
    with pytest.raises(KeyError):
        store.get_var("x")


def test_results_scopes_and_a_streamed_tail_land_in_text_and_variables():
    store = StreamStore()
    store.append("Q: ")
    store.open_scope("q")
    store.append("why?")
    store.close_scope("q")
    store.append(" A: ")
    start = len(store.text)
    store.replace_tail(start, "Bec", "a")
    store.replace_tail(start, "Because", "a")
    store.set_result("a", start, "Because", {"finish_reason": None})
    assert store.text == "Q: why? A: Because"
    assert store.variables == {"q": "why?", "a": "Because"}
    assert store.get_meta_info("a") == {"finish_reason": None}
    assert store.get_meta_info("q") is None


def test_split_reasoning_moves_the_think_block_out_of_variable_and_text():
    store = StreamStore()
    store.append("A: ")
    start = len(store.text)
    store.append("<think>hmm</think>\n 4")
    store.set_result("a", start, "<think>hmm</think>\n 4", {})
    store.append(" done")
    store.split_reasoning("a")
    assert store.text == "A: 4 done"
    assert store.variables == {"a": "4", "a_reasoning_content": "hmm"}
    store.set_var("n", ["x", "y"])  # not a string: left as it is
    store.split_reasoning("n")
    assert store.variables["n"] == ["x", "y"]


def test_split_reasoning_text():
    assert split_reasoning_text("a<think>b\nc</think>  d") == ("ad", "b\nc")
    assert split_reasoning_text("plain") == ("plain", "")


def test_a_branch_copies_and_gather_makes_lists_in_branch_order():
    parent = StreamStore()
    parent.append("P")
    parent.set_var("old", "o")
    branches = [parent.branch(), parent.branch()]
    for i, branch in enumerate(branches):
        branch.append(str(i))
        branch.set_result("new", 1, f"v{i}", {"i": i})
        branch.set_var("old", "changed")
    assert parent.text == "P" and [b.text for b in branches] == ["P0", "P1"]
    parent.gather(branches)
    assert parent.variables == {"old": "o", "new": ["v0", "v1"]}
    assert parent.meta_info == {"new": [{"i": 0}, {"i": 1}]}


def test_wait_for_text_returns_once_longer_or_final():
    store = StreamStore()
    store.append("ab")
    assert store.wait_for_text(None, 1) == ("ab", False)
    threading.Timer(0.02, store.finish).start()
    assert store.wait_for_text(None, 2) == ("ab", True)
