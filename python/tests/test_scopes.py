"""Scopes a program gets wrong (issue 33): a scope closed on another thread is a plain
``RuntimeError``, not a Rust panic, and scopes opened in a loop and never closed are refused
past 1024 levels, counted, while the allocator works on."""

import threading

import pytest

import vramscope


def test_a_scope_closed_on_another_thread_is_a_plain_runtime_error():
    alloc = vramscope.SimAllocator("1 GiB")
    token = alloc.open_scope("forward")
    caught = []

    def close_elsewhere():
        try:
            token.close()
        except BaseException as e:  # noqa: BLE001 - the test is about which exception
            caught.append(e)

    thread = threading.Thread(target=close_elsewhere)
    thread.start()
    thread.join()
    assert len(caught) == 1
    assert type(caught[0]) is RuntimeError, repr(caught[0])
    assert str(caught[0]) == "a scope must be closed on the thread that opened it"
    assert not token.closed, "the scope stays open on its own thread"

    block = alloc.alloc(4096)
    token.close()
    assert token.closed
    token.close()  # again: nothing
    assert block.nbytes == 4096


def test_a_scope_dropped_on_another_thread_does_not_raise_there():
    alloc = vramscope.SimAllocator("1 GiB")
    holder = [alloc.open_scope("forward")]
    caught = []

    def drop_elsewhere():
        try:
            holder.clear()
        except BaseException as e:  # noqa: BLE001
            caught.append(e)

    thread = threading.Thread(target=drop_elsewhere)
    thread.start()
    thread.join()
    assert caught == []
    with alloc.scope("after"):
        alloc.alloc(4096)


def test_scopes_never_closed_are_refused_past_1024_levels_and_counted():
    alloc = vramscope.SimAllocator("1 GiB")
    tokens = []
    with pytest.raises(RuntimeError, match="nest at most 1024 levels"):
        for _ in range(30_000):
            tokens.append(alloc.open_scope("loop"))
    assert len(tokens) == 1024
    assert alloc.scopes_refused == 1
    with pytest.raises(RuntimeError, match="nest at most 1024 levels"):
        with alloc.scope("one more"):
            pass
    assert alloc.scopes_refused == 2

    block = alloc.alloc(4096)
    for token in reversed(tokens):
        token.close()
    with alloc.scope("outer"):
        with alloc.scope("inner"):
            inner = alloc.alloc(8192)
    assert block.nbytes == 4096 and inner.nbytes == 8192
    assert "outer/inner" in alloc.snapshot_json()
