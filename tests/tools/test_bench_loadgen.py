"""The closed loop with in-process fake executors: counts, concurrency bound, hard stop, bugs surface."""

import asyncio
import time

import pytest

from lmi_tools.bench.loadgen import closed_loop
from lmi_tools.bench.records import RequestRecord


class FakeExecutor:
    def __init__(self, hang_from: int | None = None):
        self.in_flight = self.most_in_flight = 0
        self.hang_from = hang_from
        self.indexes = []

    async def send(self, index: int) -> RequestRecord:
        self.indexes.append(index)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(3600 if self.hang_from is not None and index >= self.hang_from else 0)
        finally:
            self.in_flight -= 1
        return RequestRecord(index=index, send=0.0, end=0.0)


def run(executor, concurrency, count, send_for=3600.0, hard_after=3600.0, on_done=None):
    now = time.perf_counter()
    return asyncio.run(closed_loop(executor.send, concurrency, count, now + send_for, now + hard_after, on_done))


@pytest.mark.parametrize("concurrency, count", [(1, 5), (4, 10), (16, 3), (8, 64)])
def test_sends_exactly_count_requests_with_at_most_c_in_flight(concurrency, count):
    executor, done = FakeExecutor(), []
    result = run(executor, concurrency, count, on_done=done.append)
    assert sorted(r.index for r in result.records) == list(range(count)) == sorted(executor.indexes)
    assert executor.most_in_flight == min(concurrency, count)
    assert len(done) == count and result.cancelled == 0


def test_a_passed_deadline_starts_nothing():
    executor = FakeExecutor()
    result = run(executor, 4, 100, send_for=-1.0)
    assert result.records == [] and executor.indexes == []


def test_the_hard_stop_cancels_requests_that_never_end():
    executor = FakeExecutor(hang_from=6)
    result = run(executor, 4, 100, send_for=3600.0, hard_after=0.3)
    assert sorted(r.index for r in result.records) == [0, 1, 2, 3, 4, 5]
    assert result.cancelled == 4 and executor.in_flight == 0


def test_a_bug_in_an_executor_is_raised_not_recorded():
    async def broken(index):
        raise KeyError("bug")

    with pytest.raises(KeyError):
        now = time.perf_counter()
        asyncio.run(closed_loop(broken, 2, 5, now + 10, now + 10))


def test_concurrency_must_be_positive():
    with pytest.raises(ValueError):
        run(FakeExecutor(), 0, 1)
