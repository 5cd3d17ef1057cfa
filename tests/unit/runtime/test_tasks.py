"""TaskSet: the background-task bookkeeping every service shares (services/runtime/tasks.py)."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from services.runtime.tasks import TaskSet


def test_a_task_is_kept_while_it_runs_and_forgotten_once_done() -> None:
    async def scenario() -> None:
        tasks = TaskSet()
        release = asyncio.Event()
        task = tasks.spawn(release.wait(), name="waiting")
        await asyncio.sleep(0)
        assert list(tasks) == [task] and task.get_name() == "waiting"
        release.set()
        await task
        await asyncio.sleep(0)
        assert len(tasks) == 0

    asyncio.run(scenario())


def test_a_failure_is_logged_with_the_owners_message_when_it_happens() -> None:
    async def fail() -> None:
        raise ValueError("boom")

    async def scenario() -> None:
        tasks = TaskSet("lease operation failed")
        tasks.spawn(fail(), name="failing")
        for _ in range(3):
            await asyncio.sleep(0)
        assert len(tasks) == 0

    with capture_logs() as logs:
        asyncio.run(scenario())
    failed = [entry for entry in logs if entry["event"] == "lease operation failed"]
    assert len(failed) == 1
    assert failed[0]["task"] == "failing" and "boom" in failed[0]["error"]


def test_cancel_all_cancels_every_running_task_and_waits_for_it() -> None:
    ended: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            ended.append(name)

    async def scenario() -> None:
        tasks = TaskSet()
        running = [tasks.spawn(forever(name), name=name) for name in ("a", "b")]
        await asyncio.sleep(0)
        await tasks.cancel_all()
        assert all(task.cancelled() for task in running)
        assert len(tasks) == 0

    with capture_logs() as logs:
        asyncio.run(scenario())
    assert sorted(ended) == ["a", "b"]
    assert logs == [], "a cancelled task is not a failure"
