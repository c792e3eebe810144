"""``kayos import-kestrel``: a Kestrel queue directory into the queues the Kayos front serves.

docs/migrating-from-kestrel.md section 4 is the contract. Per queue: replay its journal files
(``kestrel_compat.migration.plan``), drop what expired, produce the rest in order through
``KayosBackend`` (``acks=all``, all-or-nothing batches), then commit the queue's group just below
the first imported item. The group commit is the one step that makes the queue visible to a
front, so a queue is imported whole or not at all, and a queue whose group exists is skipped
unless ``force``.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kayos.errors import KayosError
from kestrel_compat import limits
from kestrel_compat.backends.kayos_backend import KayosBackend
from kestrel_compat.core.persistence import GroupState, NewEntry, encode_removed
from kestrel_compat.migration.journal import JournalCorrupt, JournalItem, QueueFiles
from kestrel_compat.migration.plan import batches, live_items, log_and_group, replay_queue


class OrderLost(KayosError):
    """Pipelined batches of one queue landed out of order: the queue is not committed."""

    code = "kestrel_import_order_lost"


# Results of one queue, as the final table shows them.
IMPORTED = "imported"
ALREADY = "already imported"
CORRUPT = "corrupt"
FAILED = "failed"
DRY_RUN = "dry run"


@dataclass(slots=True)
class QueueResult:
    queue: str
    result: str = ""
    items: int = 0
    expired: int = 0
    bytes: int = 0
    seconds: float = 0.0
    first_seq: int = 0
    last_seq: int = 0
    message: str = ""
    warnings: list[str] = field(default_factory=list)


# Called with (queue, items written, bytes written) after each batch.
Progress = Callable[[str, int, int], None]
# Called with (queue, items to write, bytes to write) when a queue's writing starts.
Start = Callable[[str, int, int], None]


async def import_queue(
    backend: KayosBackend | None,
    directory: Path,
    files: QueueFiles,
    *,
    existing: set[tuple[str, str]],
    force: bool = False,
    now_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000,
    on_start: Start | None = None,
    on_progress: Progress | None = None,
    window: int = limits.import_batches_in_flight,
) -> QueueResult:
    """Imports one queue; ``backend`` None is a dry run. Never raises for the queue's own
    failures: they are in the result (``corrupt``, ``failed``)."""
    started = time.monotonic()
    result = QueueResult(files.queue)
    log, group = log_and_group(files.queue)
    if backend is not None and (log, group) in existing and not force:
        result.result = ALREADY
        result.message = "the cluster already has this queue (--force imports it again)"
        return result
    try:
        replay = replay_queue(directory, files)
    except JournalCorrupt as exc:
        result.result, result.message = CORRUPT, str(exc)
        return result
    except OSError as exc:
        result.result, result.message = FAILED, f"cannot read the journal: {exc}"
        return result
    result.warnings += replay.warnings
    clock = now_ms()
    items, result.expired = live_items(replay.items, clock)
    total_bytes = sum(len(item.data) for item in items)
    if backend is None:
        result.result, result.items, result.bytes = DRY_RUN, len(items), total_bytes
        result.seconds = time.monotonic() - started
        return result
    if on_start is not None:
        on_start(files.queue, len(items), total_bytes)
    try:
        first, last = await _write_queue(backend, items, clock, result, on_progress, window)
    except OrderLost as exc:
        if window <= 1:
            raise AssertionError("one batch at a time cannot land out of order") from exc
        retry = await import_queue(
            backend, directory, files, existing=existing, force=True, now_ms=now_ms,
            on_start=on_start, on_progress=on_progress, window=1,
        )  # fmt: skip
        retry.warnings.insert(0, f"{exc}: imported again one batch at a time")
        return retry
    except KayosError as exc:
        result.result = FAILED
        result.message = f"nothing imported (the queue stays invisible): {exc}"
        result.items = result.bytes = 0
        result.seconds = time.monotonic() - started
        return result
    result.result = IMPORTED
    result.first_seq, result.last_seq = first, last
    result.seconds = time.monotonic() - started
    return result


async def _write_queue(
    backend: KayosBackend,
    items: list[JournalItem],
    clock: int,
    result: QueueResult,
    on_progress: Progress | None,
    window: int,
) -> tuple[int, int]:
    """Produces a queue's live items in batches, up to ``window`` of them in flight, then commits
    its group just below the first; returns the first and last seqs. On a ``KayosError`` (an
    ``OrderLost`` too) the batches still in flight are cancelled and the group is not committed."""
    log, group = log_and_group(result.queue)
    groups = (group,)
    in_flight: deque[tuple[asyncio.Task[list[int]], int, int]] = deque()
    first = last = 0

    async def land_oldest() -> None:
        nonlocal first, last
        task, count, size = in_flight.popleft()
        seqs = await task
        # Batches are sent before the previous ones are answered; the node gives seqs in the
        # order it takes them, so an answer below an earlier batch's means the order was lost.
        if seqs[0] <= last:
            raise OrderLost(f"batch at seq {seqs[0]} landed before one ending at seq {last}")
        first = first or seqs[0]
        last = seqs[-1]
        result.items += count
        result.bytes += size
        if on_progress is not None:
            on_progress(result.queue, result.items, result.bytes)

    try:
        for start, end in batches(items):
            entries = [
                NewEntry(
                    item.data, clock if item.add_ms is None else item.add_ms, item.expiry_ms, groups
                )
                for item in items[start:end]
            ]
            task = asyncio.create_task(backend.append(log, entries))
            in_flight.append((task, end - start, sum(len(entry.value) for entry in entries)))
            await asyncio.sleep(0)  # the batch goes out before the next one is built
            # The first batch lands alone: it opens the connection to the shard's head, and
            # batches sent while that is under way could leave in any order.
            if len(in_flight) >= window or not first:
                await land_oldest()
        while in_flight:
            await land_oldest()
        # Below the first imported item; for an empty queue, below everything still to come.
        hwm = first - 1 if first else await backend.last_seq(log)
        await backend.commit_group(log, group, GroupState(hwm, encode_removed(hwm, [])))
    except KayosError:
        await _cancel(in_flight)
        raise
    return first, last


async def _cancel(in_flight: deque[tuple[asyncio.Task[list[int]], int, int]]) -> None:
    for task, _, _ in in_flight:
        task.cancel()
    await asyncio.gather(*(task for task, _, _ in in_flight), return_exceptions=True)
    in_flight.clear()


async def existing_groups(backend: KayosBackend) -> set[tuple[str, str]]:
    """Every (log, group) the Kestrel front would recover from the cluster."""
    return await backend.all_groups()
