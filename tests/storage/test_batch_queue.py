"""``storage.group_commit.BatchQueue``: a writer waiting for work wakes for each write put,
and a write put while no writer waits is taken by the next batch; none is ever lost."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from delivery.write_future import WriteFuture
from storage.group_commit import Batch, BatchQueue


def _item(name: str) -> tuple[str, WriteFuture[None], bool]:
    return (name, WriteFuture(), False)


def _take(queue: BatchQueue, busy: bool = False) -> list[str] | None:
    with queue.cv:
        batch = queue.next_batch(lambda: busy)
    return None if batch is None else [op for op, _waiter, _durable in batch]


def _until(condition: Callable[[], bool], queue: BatchQueue) -> None:
    """Until ``condition`` holds, asked under the queue's lock; fails after 5 s."""
    deadline = time.monotonic() + 5
    while True:
        with queue.cv:
            if condition():
                return
        assert time.monotonic() < deadline, "the writer thread never got there"
        time.sleep(0.001)


def test_a_waiting_writer_wakes_for_a_write_and_a_write_meanwhile_waits_for_a_batch() -> None:
    queue = BatchQueue(max_batch=2)
    taken: list[list[str] | None] = []
    writer = threading.Thread(target=lambda: taken.append(_take(queue)))
    writer.start()
    _until(lambda: queue._waiting > 0, queue)  # it counts itself under the queue's lock
    queue.put(_item("first"))
    writer.join(timeout=5)
    assert not writer.is_alive() and taken == [["first"]]

    # Nobody waits now: the writes stay queued, in order, batches of at most two.
    for name in ("a", "b", "c"):
        queue.put(_item(name))
    assert queue._waiting == 0
    assert _take(queue) == ["a", "b"] and _take(queue) == ["c"]


def test_a_busy_writer_waits_and_a_stopping_queue_ends_it() -> None:
    queue = BatchQueue(max_batch=8)
    busy = threading.Event()
    busy.set()
    taken: list[Batch | None] = []

    def writer() -> None:
        with queue.cv:
            taken.append(queue.next_batch(busy.is_set))
            taken.append(queue.next_batch(busy.is_set))

    thread = threading.Thread(target=writer)
    thread.start()
    queue.put(_item("x"))  # wakes it; still busy, it waits again
    with queue.cv:
        busy.clear()
        queue.cv.notify_all()  # what a writer's release does
    _until(lambda: bool(taken) and queue._waiting > 0, queue)
    with queue.cv:
        queue.stopping = True
        queue.cv.notify_all()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert [None if b is None else [item[0] for item in b] for b in taken] == [["x"], None]
