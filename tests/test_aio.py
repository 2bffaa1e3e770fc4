"""AsyncEventLog: the EventLog API awaited, shared commits, cancellation, per-session order."""

from __future__ import annotations

import asyncio
import inspect
import random
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from eventlog import ConflictError, EventLog, EventLogError, FlushResult, UnknownSessionError
from eventlog.aio import AsyncEventLog

WAIT = 10.0  # seconds a test waits for another thread before it fails instead of hanging


def turn(n: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"question {n}"}, {"role": "assistant", "content": f"answer {n}"}]


class Gate(Mapping[str, Any]):
    """A message whose first reading (on the worker that flushes it) waits until ``open()``.

    It holds a worker inside a flush, before the write, for as long as a test needs.
    """

    def __init__(self, content: str) -> None:
        self._body = {"role": "user", "content": content}
        self.reading = threading.Event()  # a worker has started reading it
        self._open = threading.Event()

    def open(self) -> None:
        self._open.set()

    def __getitem__(self, key: str) -> Any:
        return self._body[key]

    def __len__(self) -> int:
        return len(self._body)

    def __iter__(self) -> Iterator[str]:
        self.reading.set()
        if not self._open.wait(WAIT):
            raise AssertionError("the gate was never opened")
        return iter(self._body)


async def wait_for(event: threading.Event) -> None:
    """Wait for ``event`` (set on another thread) without blocking the loop."""
    for _ in range(int(WAIT / 0.005)):
        if event.is_set():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("timed out")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_every_method_of_the_issue_is_awaitable() -> None:
    names = [
        "open",
        "flush",
        "flush_many",
        "append",
        "rewind",
        "compact",
        "fork",
        "messages",
        "history",
        "session",
        "head",
        "sessions",
        "verify",
        "update_session",
        "close_session",
        "close",
    ]
    for name in names[1:]:
        assert inspect.iscoroutinefunction(getattr(AsyncEventLog, name)), name
        assert hasattr(EventLog, name), name


def test_open_is_awaited_or_used_with_async_with(tmp_path: Path) -> None:
    async def main() -> AsyncEventLog:
        async with AsyncEventLog.open(tmp_path / "log", durability="process") as log:
            assert log.durability == "process" and not log.closed
            await log.flush("s", turn(1))
        assert log.closed  # the block closed it
        reopened = await AsyncEventLog.open(tmp_path / "log")
        assert await reopened.messages("s") == turn(1)
        await reopened.close()
        return reopened

    run(main())


def test_awaited_calls_give_what_the_sync_log_gives(tmp_path: Path) -> None:
    async def scenario(log: Any, call: Any) -> list[Any]:
        out: list[Any] = []
        first = turn(1)
        out.append(await call(log.flush("a", first)))
        out.append(await call(log.flush("a", first + turn(2))))
        out.append(await call(log.append("a", turn(3), expected_head=None)))
        out.append(await call(log.rewind("a", to=4)))
        out.append(await call(log.fork("a", "b", 2)))
        out.append(
            await call(
                log.compact("a", start=0, end=2, summary=[{"role": "user", "content": "[summary]"}], expected_head=None)
            )
        )
        await call(log.update_session("a", title="chat", input_tokens=3))
        await call(log.update_session("a", input_tokens=4))
        await call(log.close_session("b", reason="done"))
        out.append(await call(log.messages("a")))
        out.append(await call(log.messages("b")))
        out.append(await call(log.head("a")))
        info = await call(log.session("a"))
        out.append((info.length, info.head, info.metadata, info.counters))
        out.append(await call(log.session("nobody")))
        out.append(await call(log.messages("a", last=2)))
        out.append(await call(log.messages("nobody")))
        out.append(await call(log.sessions()))
        out.append([(o.position, o.digest, o.tombstone and o.tombstone.reason) for o in await call(log.history("a"))])
        out.append((await call(log.verify())).ok)
        return out

    async def awaited(value: Any) -> Any:
        return await value

    async def plain(value: Any) -> Any:
        return value

    async def via_async() -> list[Any]:
        async with await AsyncEventLog.open(tmp_path / "async") as log:
            return await scenario(log, awaited)

    with EventLog.open(tmp_path / "sync") as sync:
        expected = run(scenario(sync, plain))
    assert run(via_async()) == expected
    assert expected[-1] is True and expected[-3] == ["a", "b"] and expected[-4] == []


def test_errors_reach_the_awaiting_task_unchanged(tmp_path: Path) -> None:
    async def main() -> None:
        async with await AsyncEventLog.open(tmp_path / "log") as log:
            await log.flush("s", turn(1))
            with pytest.raises(ConflictError):
                await log.flush("s", turn(1) + turn(2), expected_head="0" * 64)
            with pytest.raises(UnknownSessionError):
                await log.rewind("nobody", to=0)
            with pytest.raises(TypeError, match="list of message dicts"):
                await log.flush("s", "not a list")  # type: ignore[arg-type]
            assert await log.messages("s") == turn(1)  # nothing of the failed calls was written

    run(main())


def test_closed_log_refuses_calls_and_closes_what_it_owns(tmp_path: Path) -> None:
    async def main() -> AsyncEventLog:
        log = await AsyncEventLog.open(tmp_path / "log")
        async with log:
            await log.flush("s", turn(1))
        with pytest.raises(EventLogError, match="closed"):
            await log.flush("s", turn(1))
        await log.close()  # twice is harmless
        return log

    run(main())
    with EventLog.open(tmp_path / "log") as reopened:  # the owned log was closed: it opens again
        assert reopened.messages("s") == turn(1)


def test_a_wrapped_log_stays_open(tmp_path: Path) -> None:
    with EventLog.open(tmp_path / "log") as sync:

        async def main() -> None:
            async with AsyncEventLog(sync) as log:
                await log.flush("s", turn(1))
            assert log.sync is sync

        run(main())
        assert sync.messages("s") == turn(1)  # still usable


def test_the_loop_keeps_running_while_a_worker_flushes(tmp_path: Path) -> None:
    # The flush waits (on its worker) for a gate that only another task of the same loop opens:
    # if the log blocked the loop, the gate would never open and the flush would fail.
    async def main() -> None:
        async with await AsyncEventLog.open(tmp_path / "log") as log:
            gate = Gate("held")
            flushing = asyncio.create_task(log.flush("s", [gate]))
            await wait_for(gate.reading)
            assert not flushing.done()
            gate.open()
            assert (await flushing).appended == 1
            assert await log.messages("s") == [{"role": "user", "content": "held"}]

    run(main())


def test_concurrent_flushes_share_commits(tmp_path: Path) -> None:
    # 64 tasks, each flushing its own growing session: the log commits fewer times than
    # there are turns (batches, group commit).  With one worker and batches of one flush
    # every turn is a commit of its own, which shows the count measures what it should.
    async def main(workers: int, batch_size: int = 64) -> tuple[int, int]:
        async with await AsyncEventLog.open(
            tmp_path / f"log-{workers}-{batch_size}", max_workers=workers, batch_size=batch_size
        ) as log:

            async def agent(i: int) -> None:
                history: list[dict[str, Any]] = []
                for n in range(5):
                    history += turn(n)
                    await log.flush(f"session-{i}", history)

            before = (await log.info())["commits"]
            await asyncio.gather(*(agent(i) for i in range(64)))
            commits = (await log.info())["commits"] - before
            for i in (0, 63):
                assert len(await log.messages(f"session-{i}")) == 10
            return commits, 64 * 5

    commits, turns = run(main(32))
    assert commits < turns
    commits, turns = run(main(1))
    assert commits < turns
    serial, turns = run(main(1, batch_size=1))
    assert serial == turns


def test_cancelled_before_a_worker_took_it_never_runs(tmp_path: Path) -> None:
    async def main() -> None:
        async with await AsyncEventLog.open(tmp_path / "log", max_workers=1) as log:
            gate = Gate("occupies the only worker")
            busy = asyncio.create_task(log.flush("other", [gate]))
            await wait_for(gate.reading)
            queued = asyncio.create_task(log.flush("s", turn(1)))
            await asyncio.sleep(0)  # submitted, waiting for the worker
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
            gate.open()
            await busy
            assert "s" not in await log.sessions()
            assert not await log.contains("s")

    run(main())


def test_cancelled_while_a_worker_runs_it_waits_for_the_worker(tmp_path: Path) -> None:
    # The cancelled task hears of it only after the worker finished its flush, so the flush
    # in its finally block comes after the interrupted one and is never undone by it.
    async def main() -> None:
        async with await AsyncEventLog.open(tmp_path / "log") as log:
            history: list[Any] = [*turn(1)]
            await log.flush("s", history)
            gate = Gate("question 2")
            history.append(gate)
            acknowledged: list[int] = []

            async def agent() -> None:
                try:
                    await log.flush("s", history)
                finally:
                    history.append({"role": "assistant", "content": "answer 2"})
                    result = await log.flush("s", history)
                    acknowledged.append(result.unchanged + result.appended)

            task = asyncio.create_task(agent())
            await wait_for(gate.reading)
            task.cancel()
            await asyncio.sleep(0.05)
            assert not task.done()  # still waiting for its worker, though cancelled
            task.cancel()  # a second cancellation does not cut the wait short either
            await asyncio.sleep(0.05)
            assert not task.done()
            gate.open()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert acknowledged == [4]
            stored = await log.messages("s")
            assert [m["content"] for m in stored] == ["question 1", "answer 1", "question 2", "answer 2"]
            assert all(o.tombstone is None for o in await log.history("s"))

    run(main())


def test_calls_of_one_session_run_in_the_order_they_were_made(tmp_path: Path) -> None:
    # Task A's append holds a worker before it writes; task B then flushes, on another worker,
    # the list that A's append makes.  B runs after A: had it run first, A's append would add
    # its message a second time after B's turn.
    async def main() -> None:
        async with await AsyncEventLog.open(tmp_path / "log", max_workers=4) as log:
            await log.flush("s", turn(1))
            gate = Gate("question 2")
            first = asyncio.create_task(log.append("s", [gate]))
            await wait_for(gate.reading)
            second = asyncio.create_task(
                log.flush("s", [*turn(1), {"role": "user", "content": "question 2"}, *turn(2)[1:]])
            )
            await asyncio.sleep(0.05)
            assert not second.done()  # waiting behind the first
            gate.open()
            assert (await first).appended == 1
            assert (await second).appended == 1
            assert [m["content"] for m in await log.messages("s")] == [
                "question 1",
                "answer 1",
                "question 2",
                "answer 2",
            ]
            assert all(o.tombstone is None for o in await log.history("s"))

    run(main())


def test_cancellation_never_loses_an_acknowledged_turn_nor_half_writes_one(tmp_path: Path) -> None:
    # Many agents flush growing sessions while a canceller cancels their tasks at random
    # moments; each restarts from where it was (as a supervisor would) and flushes its list
    # again.  Every acknowledged flush is stored, nothing is stored that a task never flushed,
    # each flush landed whole (the stored length is one a flush asked for), and no flush was
    # undone by an older one (no tombstone anywhere).
    rng = random.Random(17)
    agents, turns_each = 16, 12

    async def main() -> None:
        async with await AsyncEventLog.open(tmp_path / "log", durability="process", max_workers=8) as log:
            histories: dict[int, list[dict[str, Any]]] = {i: [] for i in range(agents)}
            flushed: dict[int, set[int]] = {i: {0} for i in range(agents)}
            acked: dict[int, int] = dict.fromkeys(range(agents), 0)

            async def agent(i: int) -> None:
                history = histories[i]
                while True:
                    if len(history) == acked[i]:  # the last flush was acknowledged: next turn
                        if len(history) == 2 * turns_each:
                            return
                        history += turn(len(history) // 2)
                    flushed[i].add(len(history))
                    result = await log.flush(f"s{i}", history)
                    assert result.unchanged + result.appended == len(history)
                    acked[i] = len(history)

            async def supervise(i: int) -> int:
                cancelled = 0
                window = 0.004
                while True:
                    progress = acked[i]
                    task = asyncio.create_task(agent(i))
                    await asyncio.sleep(rng.random() * window)
                    task.cancel()
                    try:
                        await task
                        return cancelled
                    except asyncio.CancelledError:
                        cancelled += 1
                        # Backing off while the agent gets nowhere (on a slow machine its flushes can
                        # outlast the window every time), as a supervisor would: the run always ends.
                        window = 0.004 if acked[i] > progress else min(1.5 * window, 0.25)

            counts = await asyncio.gather(*(supervise(i) for i in range(agents)))
            assert sum(counts) > agents  # the cancellations did happen
            for i in range(agents):
                stored = await log.messages(f"s{i}")
                assert stored == histories[i] and len(stored) in flushed[i]
                assert len(stored) >= acked[i]
                assert all(o.tombstone is None for o in await log.history(f"s{i}"))
            assert (await log.verify()).ok

    run(main())


def test_constructor_arguments_are_checked(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="wraps an EventLog"):
        AsyncEventLog(str(tmp_path))  # type: ignore[arg-type]
    with EventLog.open(tmp_path / "log") as sync:
        with pytest.raises(ValueError, match="max_workers"):
            AsyncEventLog(sync, max_workers=0)
        with pytest.raises(ValueError, match="max_batches"):
            AsyncEventLog(sync, max_batches=0)
        with pytest.raises(ValueError, match="batch_size"):
            AsyncEventLog(sync, batch_size=True)
        with pytest.raises(ValueError, match="batch_cpu"):
            AsyncEventLog(sync, batch_cpu=0)


# -- flushes awaited together are written in batches ---------------------------------


def _failing_batch(log: Any) -> list[tuple[str, list[dict[str, Any]], dict[str, Any]]]:
    """Eight flushes, three of which fail each in its own way: (session, list, options)."""
    calls: list[tuple[str, list[dict[str, Any]], dict[str, Any]]] = []
    for i in range(8):
        calls.append((f"s{i}", turn(0) + turn(1), {}))
    calls[1] = ("s1", turn(0) + turn(1), {"expected_head": "0" * 64})  # ConflictError
    calls[4] = ("s4", turn(9), {})  # HistoryMismatchError: shares no prefix with the stored turn
    calls[6] = ("s6", [*turn(0), {"role": "user", "content": {1, 2}}], {})  # InvalidMessageError
    return calls


def test_a_flush_failing_in_a_batch_fails_its_own_call_alone(tmp_path: Path) -> None:
    # Eight tasks flush at once (one batch); three of the flushes fail.  Each of those gets the
    # error its own EventLog.flush gives (same type, same message), the other five are written
    # and acknowledged, and the failing sessions keep what they had.
    with EventLog.open(tmp_path / "sync") as sync:
        for i in range(8):
            sync.flush(f"s{i}", turn(0))
        expected: list[Any] = []
        for session_id, messages, options in _failing_batch(sync):
            try:
                expected.append(sync.flush(session_id, messages, **options))
            except Exception as e:
                expected.append(e)

    async def main() -> None:
        # batch_cpu: one batch for the eight, however long this machine takes per flush.
        async with await AsyncEventLog.open(tmp_path / "log", batch_cpu=60.0) as log:
            for i in range(8):
                await log.flush(f"s{i}", turn(0))
            before = (await log.info())["commits"]
            calls = _failing_batch(log)
            got = await asyncio.gather(
                *(log.flush(session_id, messages, **options) for session_id, messages, options in calls),
                return_exceptions=True,
            )
            assert [type(g) for g in got] == [type(e) for e in expected]
            assert [str(g) for g in got if isinstance(g, Exception)] == [
                str(e) for e in expected if isinstance(e, Exception)
            ]
            # The same results but for seq, which the order of the commits decides.
            assert [(g.appended, g.tombstoned, g.unchanged, g.head) for g in got if isinstance(g, FlushResult)] == [
                (e.appended, e.tombstoned, e.unchanged, e.head) for e in expected if isinstance(e, FlushResult)
            ]
            assert sum(isinstance(g, ConflictError) for g in got) == 1
            for (session_id, messages, _), outcome in zip(calls, got):
                stored = await log.messages(session_id)
                assert stored == (turn(0) if isinstance(outcome, Exception) else messages), session_id
            # The five were not written one commit each (the batch failed, then its halves).
            assert (await log.info())["commits"] - before < 5

    run(main())


def test_flushes_of_one_session_made_together_land_in_order(tmp_path: Path) -> None:
    # Two flushes of one session made on the same pass of the loop, without waiting, go in
    # two batches, the older first: the other way round the older list would rewind the newer.
    async def main() -> None:
        async with await AsyncEventLog.open(tmp_path / "log", max_workers=1) as log:
            first = asyncio.create_task(log.flush("s", turn(0)))
            others = [asyncio.create_task(log.flush(f"o{i}", turn(0))) for i in range(3)]
            second = asyncio.create_task(log.flush("s", turn(0) + turn(1)))
            appended = asyncio.create_task(log.append("s", turn(2)))
            third = asyncio.create_task(log.flush("s", turn(0) + turn(1) + turn(2) + turn(3)))
            assert (await first).appended == 2
            assert (await second).appended == 2
            assert (await appended).appended == 2
            assert (await third).appended == 2
            assert [r.appended for r in await asyncio.gather(*others)] == [2, 2, 2]
            assert await log.messages("s") == turn(0) + turn(1) + turn(2) + turn(3)
            assert all(o.tombstone is None for o in await log.history("s"))

    run(main())


def test_a_cancelled_flush_of_a_batch_a_worker_runs_lands_whole_with_the_others(tmp_path: Path) -> None:
    # One task of a batch is cancelled while a worker writes the batch: the batch lands whole,
    # the others are acknowledged, and the cancelled task hears of it only once it has landed.
    async def main() -> None:
        async with await AsyncEventLog.open(tmp_path / "log") as log:
            gate = Gate("question 1")
            held = [*turn(0), gate]
            tasks = [asyncio.create_task(log.flush("held", held))]
            tasks += [asyncio.create_task(log.flush(f"s{i}", turn(0) + turn(1))) for i in range(4)]
            await wait_for(gate.reading)
            tasks[0].cancel()
            await asyncio.sleep(0.05)
            assert not tasks[0].done()  # waiting for the batch, though cancelled
            gate.open()
            with pytest.raises(asyncio.CancelledError):
                await tasks[0]
            assert all(r.appended == 4 for r in await asyncio.gather(*tasks[1:]))
            assert [m["content"] for m in await log.messages("held")] == ["question 0", "answer 0", "question 1"]
            for i in range(4):
                assert await log.messages(f"s{i}") == turn(0) + turn(1)

    run(main())


def test_a_cancelled_flush_of_a_batch_no_worker_took_yet_never_runs(tmp_path: Path) -> None:
    # A batch waits for the only worker; one of its tasks is cancelled meanwhile.  The others
    # are written, the cancelled one never is, and its session can be flushed afresh.
    async def main() -> None:
        async with await AsyncEventLog.open(tmp_path / "log", max_workers=1) as log:
            gate = Gate("occupies the only worker")
            busy = asyncio.create_task(log.flush("busy", [gate]))
            await wait_for(gate.reading)
            tasks = [asyncio.create_task(log.flush(f"s{i}", turn(0))) for i in range(4)]
            await asyncio.sleep(0.05)  # the batch is handed to the pool, behind the busy worker
            tasks[2].cancel()
            with pytest.raises(asyncio.CancelledError):
                await tasks[2]
            gate.open()
            await busy
            assert [r.appended for i, r in enumerate(await asyncio.gather(*tasks[:2], tasks[3]))] == [2, 2, 2]
            assert not await log.contains("s2")
            assert (await log.flush("s2", turn(0))).appended == 2

    run(main())


def test_a_cancelled_flush_keeps_the_calls_after_it_in_line(tmp_path: Path) -> None:
    # A (a flush) waits for an append of its session that a worker holds; B, a flush of the
    # same session made after A, is cancelled before a worker takes it; then C flushes the
    # session.  C still runs after A, though the call right before it (B) never runs: had C
    # overtaken A, A's older list would have rewound C's turns.
    async def main() -> None:
        async with await AsyncEventLog.open(tmp_path / "log", max_workers=4, max_batches=3) as log:
            await log.flush("s", turn(0))
            gate = Gate("question 1")
            held = asyncio.create_task(log.append("s", [gate]))
            await wait_for(gate.reading)
            first = [*turn(0), {"role": "user", "content": "question 1"}, turn(1)[1]]
            a = asyncio.create_task(log.flush("s", first))
            await asyncio.sleep(0.02)  # A's batch waits for the append on a worker
            b = asyncio.create_task(log.flush("s", first + turn(2)))
            await asyncio.sleep(0.02)  # B's batch waits for A's on another
            b.cancel()
            with pytest.raises(asyncio.CancelledError):
                await b
            c = asyncio.create_task(log.flush("s", first + turn(2) + turn(3)))
            await asyncio.sleep(0.02)  # C's batch on a third worker
            gate.open()
            assert (await held).appended == 1
            assert (await a).appended == 1
            assert (await c).appended == 4  # B never ran: C wrote its turns
            assert await log.messages("s") == first + turn(2) + turn(3)
            assert all(o.tombstone is None for o in await log.history("s"))

    run(main())


def test_a_cancelled_call_keeps_the_calls_after_it_in_line(tmp_path: Path) -> None:
    # The same for calls that each take a worker (append): B, cancelled while it waits for A,
    # never runs, and C still runs after A.
    async def main() -> None:
        async with await AsyncEventLog.open(tmp_path / "log", max_workers=4) as log:
            await log.flush("s", turn(0))
            gate = Gate("question 1")
            a = asyncio.create_task(log.append("s", [gate]))
            await wait_for(gate.reading)
            b = asyncio.create_task(log.append("s", [{"role": "assistant", "content": "never"}]))
            await asyncio.sleep(0.02)  # B waits for A on a worker
            b.cancel()
            with pytest.raises(asyncio.CancelledError):
                await b
            c = asyncio.create_task(log.flush("s", [*turn(0), {"role": "user", "content": "question 1"}, *turn(2)]))
            await asyncio.sleep(0.02)
            gate.open()
            assert (await a).appended == 1
            assert (await c).appended == 2
            assert [m["content"] for m in await log.messages("s")] == [
                "question 0",
                "answer 0",
                "question 1",
                "question 2",
                "answer 2",
            ]
            assert all(o.tombstone is None for o in await log.history("s"))

    run(main())
