"""What ``kayos import-kestrel`` imports: the queues of a journal directory and their live items.

``plan`` picks the queues of a directory (all, or the ones named) and their files in replay order
(``kestrel_compat.migration.journal``); ``replay_queue`` reads one queue's files through the
sans-IO reader; ``live_items`` drops what expired and ``batches`` cuts the rest into the bounded
produces ``kestrel_compat.migration.importer`` sends (docs/migrating-from-kestrel.md section 4).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from kestrel_compat import limits
from kestrel_compat.migration.journal import JournalItem, JournalReplay, QueueFiles, plan_directory


def log_and_group(queue: str) -> tuple[str, str]:
    """The Kestrel log (master queue) and group a queue's items go to: ``m+c`` is group ``m+c``
    on log ``m`` (docs/kestrel-compat.md section 10)."""
    return queue.split("+", 1)[0], queue


def live_items(items: Sequence[JournalItem], now_ms: int) -> tuple[list[JournalItem], int]:
    """The items not yet expired at ``now_ms``, in order, and how many were expired (an item is
    expired when its expiry is strictly before now, as in the front)."""
    live = [item for item in items if item.expiry_ms is None or item.expiry_ms >= now_ms]
    return live, len(items) - len(live)


def batches(
    items: Sequence[JournalItem],
    entries_max: int = limits.import_batch_entries_max,
    bytes_max: int = limits.import_batch_bytes_max,
) -> list[tuple[int, int]]:
    """``[start, end)`` index ranges of consecutive items, each within both bounds (an item
    larger than ``bytes_max`` goes alone)."""
    ranges: list[tuple[int, int]] = []
    start = 0
    size = 0
    for index, item in enumerate(items):
        length = len(item.data)
        if index > start and (index - start >= entries_max or size + length > bytes_max):
            ranges.append((start, index))
            start, size = index, 0
        size += length
    if start < len(items):
        ranges.append((start, len(items)))
    return ranges


def replay_queue(directory: Path, files: QueueFiles) -> JournalReplay:
    """Reads a queue's files in replay order through the sans-IO reader, a chunk at a time."""
    replay = JournalReplay(files.queue)
    for name in files.files:
        replay.begin_file(name)
        with open(directory / name, "rb") as handle:
            while chunk := handle.read(limits.journal_read_chunk_bytes):
                replay.feed(chunk)
        replay.end_file()
    replay.finish()
    return replay


def plan(directory: Path, queues: Sequence[str] = ()) -> tuple[list[QueueFiles], list[str]]:
    """The queues to import (all, or the ones named, in name order) and the directory warnings."""
    names = [entry.name for entry in os.scandir(directory) if entry.is_file()]
    found = plan_directory(names)
    warnings = list(found.warnings)
    wanted = sorted(set(queues)) if queues else sorted(found.queues)
    chosen: list[QueueFiles] = []
    for queue in wanted:
        files = found.queues.get(queue)
        if files is None:
            warnings.append(f"{queue}: no journal file in {directory}, nothing to import")
            continue
        chosen.append(files)
    return chosen, warnings
