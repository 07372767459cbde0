"""The task hub's wake-ups and its in-memory tail (pure logic, in memory)."""

from __future__ import annotations

from agentic_sandbox.controller.store import TaskEvent
from agentic_sandbox.controller.tasks.hub import TAIL_EVENTS, TaskHub


def event(seq: int) -> TaskEvent:
    return TaskEvent(task_id="t", seq=seq, kind="artifact", body={}, at=float(seq))


def seqs(events: list[TaskEvent] | None) -> list[int] | None:
    return None if events is None else [e.seq for e in events]


async def test_the_tail_is_told_in_order_even_when_stored_events_are_told_out_of_order() -> None:
    """Two writers whose writes finished in the other order tell the hub 3 before 2: a reader at 1
    gets 2, 3 once both are told, and never 3 before 2 (which would show 2 again after it)."""
    hub = TaskHub()
    with hub.watch("t") as watch:
        changed = watch.changed()
        hub.pulse("t", event(1))
        assert changed.is_set()
        assert seqs(watch.tail_after(0)) == [1]
        hub.pulse("t", event(3))
        assert seqs(watch.tail_after(1)) == []  # 2 is stored but not told yet: its pulse comes
        hub.pulse("t", event(2))
        assert seqs(watch.tail_after(1)) == [2, 3]
        assert seqs(watch.tail_after(3)) == []


async def test_a_tail_that_does_not_reach_back_sends_the_reader_to_the_store() -> None:
    hub = TaskHub()
    assert hub.watchers("t") == 0
    with hub.watch("t") as watch:
        assert hub.watchers("t") == 1
        assert watch.tail_after(0) is None  # nothing told since the watch began
        hub.pulse("t", event(5))
        assert watch.tail_after(3) is None  # 4 was told before: only the store has it
        for seq in range(6, 7 + TAIL_EVENTS):
            hub.pulse("t", event(seq))
        assert watch.tail_after(5) is None  # 6 fell off the tail
        assert seqs(watch.tail_after(6)) == list(range(7, 7 + TAIL_EVENTS))
        assert seqs(watch.tail_after(5 + TAIL_EVENTS)) == [6 + TAIL_EVENTS]
    assert hub.watchers("t") == 0
    hub.pulse("t", event(1))  # nobody watches: nothing is kept


async def test_news_from_another_controller_says_what_is_missing_and_an_event_told_twice_is_kept_once() -> None:
    hub = TaskHub()
    assert hub.behind("t", 4) is None and hub.watched() == []  # nobody waits here
    with hub.watch("t") as watch:
        assert hub.watched() == ["t"]
        assert hub.behind("t", 4) == 0  # nothing told yet: the waiters read the store...
        assert hub.behind("t", 4) is None  # ...and it counts as seen
        hub.pulse("t", event(5))
        assert hub.behind("t", 5) is None
        assert hub.behind("t", 7) == 5  # 6 and 7 are to be read from the store and told
        hub.pulse("t", event(6))
        hub.pulse("t", event(6))  # a notification of this controller's own write, or a racing catch-up
        hub.pulse("t", event(7))
        assert seqs(watch.tail_after(4)) == [5, 6, 7]
    assert hub.watched() == []


async def test_an_event_in_the_tail_is_encoded_once_per_key_for_every_reader() -> None:
    """Readers of one task share each event's encodings (made by the first that asks, per key)."""
    hub = TaskHub()
    made: list[object] = []

    def make(key: object) -> bytes:
        made.append(key)
        return repr(key).encode()

    with hub.watch("t") as first, hub.watch("t") as second:
        hub.pulse("t", event(1))
        [a] = first.told_after(0) or []
        [b] = second.told_after(0) or []
        assert a is b and a.event.seq == 1
        for _ in range(3):
            assert a.encoded(("1.0", False), lambda: make(("1.0", False))) == b"('1.0', False)"
            assert b.encoded(("0.3", False), lambda: make(("0.3", False))) == b"('0.3', False)"
        assert made == [("1.0", False), ("0.3", False)]
        assert first.told_after(1) == []
