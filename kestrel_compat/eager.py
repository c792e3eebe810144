"""Run a coroutine at once, in the caller, up to its first suspension (Python 3.12's eager tasks).

Most requests of the front never wait: a GET that finds an item, a SET whose append the memory
backend takes at once. Running each of them as an asyncio task costs a task, a loop iteration to
start it and another to resume whoever waits for it, which is most of what such a request costs.
``start_eagerly`` steps the coroutine in the caller instead: if it finishes without suspending,
its value comes back at once (``Finished``); if it suspends, the rest of it runs as a task, which
resumes the coroutine exactly where it stopped, so cancellation and exceptions behave as in any
task.

Before its first suspension the coroutine runs outside any task, so it must not need
``asyncio.current_task()`` there (``asyncio.timeout`` does; ``asyncio.wait`` does not).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

ResultT = TypeVar("ResultT")


@dataclass(frozen=True, slots=True)
class Finished(Generic[ResultT]):
    """A coroutine that finished without suspending, and its value."""

    value: ResultT


def start_eagerly(
    coroutine: Coroutine[Any, Any, ResultT],
    *,
    name: str,
    loop: asyncio.AbstractEventLoop | None = None,
) -> Finished[ResultT] | asyncio.Task[ResultT]:
    """Run ``coroutine`` until it suspends or ends; the rest runs as a task on ``loop`` (the
    running loop when None). An exception it raises before suspending propagates to the caller,
    as a call would."""
    try:
        yielded = coroutine.send(None)
    except StopIteration as stop:
        return Finished(stop.value)
    if loop is None:
        loop = asyncio.get_running_loop()
    return loop.create_task(_resume(coroutine, yielded), name=name)


async def _resume(coroutine: Coroutine[Any, Any, ResultT], yielded: Any) -> ResultT:
    return await _Suspended(coroutine, yielded)


class _Suspended(Generic[ResultT]):
    """Awaiting this continues a coroutine that already yielded ``yielded`` (the future it waits
    for): the task sees that same future, and what the task sends or throws back goes on to the
    coroutine, as if the task had run it from the start."""

    __slots__ = ("_coroutine", "_yielded")

    def __init__(self, coroutine: Coroutine[Any, Any, ResultT], yielded: Any) -> None:
        self._coroutine = coroutine
        self._yielded = yielded

    def __await__(self) -> Generator[Any, Any, ResultT]:
        coroutine, yielded = self._coroutine, self._yielded
        while True:
            try:
                sent = yield yielded
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as error:  # Cancellation too goes on to the coroutine.
                try:
                    yielded = coroutine.throw(error)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
            else:
                try:
                    yielded = coroutine.send(sent)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
