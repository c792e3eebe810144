"""The import's decisions without a cluster: batching, expiry, names, and what each queue's result
is when the backend succeeds, fails midway or lands batches out of order (a fake backend)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kestrel_compat.core.persistence import (
    BackendError,
    GroupState,
    NewEntry,
    decode_removed,
    encode_removed,
)
from kestrel_compat.migration import journal
from kestrel_compat.migration.importer import (
    ALREADY,
    CORRUPT,
    DRY_RUN,
    FAILED,
    IMPORTED,
    QueueResult,
    import_queue,
)
from kestrel_compat.migration.journal import JournalItem
from kestrel_compat.migration.plan import batches, live_items, log_and_group, plan

pytestmark = pytest.mark.unit


def test_batches_respect_both_bounds_and_cover_every_item() -> None:
    items = [JournalItem(b"x" * size, 1, None) for size in (3, 3, 3, 10, 1, 1, 1, 1)]
    assert batches(items, entries_max=3, bytes_max=8) == [(0, 2), (2, 3), (3, 4), (4, 7), (7, 8)]
    assert batches([], entries_max=3, bytes_max=8) == []
    assert batches(items, entries_max=100, bytes_max=1000) == [(0, 8)]


def test_live_items_drop_only_what_expired_before_now() -> None:
    items = [
        JournalItem(b"a", 1, None),
        JournalItem(b"b", 1, 999),
        JournalItem(b"c", 1, 1000),
        JournalItem(b"d", 1, 1001),
    ]
    live, expired = live_items(items, 1000)
    assert [item.data for item in live] == [b"a", b"c", b"d"]
    assert expired == 1


def test_children_go_to_their_masters_log() -> None:
    assert log_and_group("jobs") == ("jobs", "jobs")
    assert log_and_group("jobs+audit") == ("jobs", "jobs+audit")


class FakeBackend:
    """Appends get consecutive seqs; ``swap_after`` makes the answer to that append carry seqs
    below the previous one's (a batch that landed out of order); ``fail_at`` fails that append."""

    def __init__(self, *, fail_at: int = -1, swap_at: int = -1) -> None:
        self.seq = 100
        self.calls = 0
        self.fail_at = fail_at
        self.swap_at = swap_at
        self.appended: list[tuple[str, NewEntry]] = []
        self.commits: list[tuple[str, str, GroupState]] = []

    async def append(self, log: str, entries: list[NewEntry]) -> list[int]:
        self.calls += 1
        await asyncio.sleep(0)
        if self.calls == self.fail_at:
            raise BackendError("injected failure")
        if self.calls == self.swap_at:
            return list(range(1, 1 + len(entries)))
        self.appended += [(log, entry) for entry in entries]
        seqs = list(range(self.seq + 1, self.seq + 1 + len(entries)))
        self.seq += len(entries)
        return seqs

    async def last_seq(self, log: str) -> int:
        return self.seq

    async def commit_group(self, log: str, group: str, state: GroupState) -> None:
        self.commits.append((log, group, state))


def write_queue(directory: Path, name: str, count: int) -> None:
    directory.mkdir(exist_ok=True)
    data = b"".join(journal.addx(b"%d" % i, 1_000 + i) for i in range(count))
    (directory / name).write_bytes(data + journal.add(b"old", 1))


def run(
    backend: Any,
    directory: Path,
    queue: str,
    *,
    existing: set[tuple[str, str]] | None = None,
    force: bool = False,
) -> QueueResult:
    (files,), _ = plan(directory, [queue])
    return asyncio.run(
        import_queue(
            backend, directory, files, existing=existing or set(), force=force, now_ms=lambda: 5_000
        )
    )


def test_a_queue_is_written_in_order_then_its_group_committed(tmp_path: Path) -> None:
    write_queue(tmp_path, "jobs+audit", 10_000)
    backend = FakeBackend()
    result = run(backend, tmp_path, "jobs+audit")
    assert result.result == IMPORTED
    assert (result.items, result.expired) == (10_000, 1)
    assert [entry.value for _, entry in backend.appended] == [b"%d" % i for i in range(10_000)]
    assert {(log, entry.groups) for log, entry in backend.appended} == {("jobs", ("jobs+audit",))}
    assert backend.appended[3][1].add_ms == 1_003
    ((log, group, state),) = backend.commits
    assert (log, group, state.hwm) == ("jobs", "jobs+audit", 100)
    assert decode_removed(state.hwm, state.blob) == set()


def test_an_empty_queue_commits_its_group_at_the_tail(tmp_path: Path) -> None:
    (tmp_path / "idle").write_bytes(journal.addx(b"x", 1) + journal.remove())
    backend = FakeBackend()
    result = run(backend, tmp_path, "idle")
    assert (result.result, result.items) == (IMPORTED, 0)
    assert backend.commits == [("idle", "idle", GroupState(100, encode_removed(100, [])))]


def test_a_failure_midway_commits_nothing(tmp_path: Path) -> None:
    write_queue(tmp_path, "jobs", 20_000)
    backend = FakeBackend(fail_at=3)
    result = run(backend, tmp_path, "jobs")
    assert result.result == FAILED
    assert "injected failure" in result.message
    assert result.items == 0
    assert backend.commits == []


def test_batches_that_landed_out_of_order_are_imported_again_one_at_a_time(
    tmp_path: Path,
) -> None:
    write_queue(tmp_path, "jobs", 20_000)
    backend = FakeBackend(swap_at=3)
    result = run(backend, tmp_path, "jobs")
    assert result.result == IMPORTED
    assert "imported again one batch at a time" in result.warnings[0]
    ((_, _, state),) = backend.commits
    # The group starts just below the second, ordered, copy.
    assert [entry.value for _, entry in backend.appended[-20_000:]] == [
        b"%d" % i for i in range(20_000)
    ]
    assert state.hwm == backend.seq - 20_000


def test_existing_queues_are_skipped_unless_forced(tmp_path: Path) -> None:
    write_queue(tmp_path, "jobs", 3)
    backend = FakeBackend()
    skipped = run(backend, tmp_path, "jobs", existing={("jobs", "jobs")})
    assert skipped.result == ALREADY
    assert backend.calls == 0
    forced = run(backend, tmp_path, "jobs", existing={("jobs", "jobs")}, force=True)
    assert (forced.result, forced.items) == (IMPORTED, 3)


def test_dry_run_and_corrupt(tmp_path: Path) -> None:
    write_queue(tmp_path, "jobs", 3)
    (tmp_path / "bad").write_bytes(journal.addx(b"x", 1) + b"\x0a")  # no opcode 10
    dry = run(None, tmp_path, "jobs")
    assert (dry.result, dry.items, dry.expired) == (DRY_RUN, 3, 1)
    backend = FakeBackend()
    corrupt = run(backend, tmp_path, "bad")
    assert corrupt.result == CORRUPT
    assert "bad at offset 22" in corrupt.message
    assert backend.calls == 0


@pytest.mark.parametrize("named", [["nothing"], []])
def test_plan_names_missing_queues(tmp_path: Path, named: list[str]) -> None:
    write_queue(tmp_path, "jobs", 1)
    chosen, warnings = plan(tmp_path, named)
    if named:
        assert chosen == []
        assert warnings == [f"nothing: no journal file in {tmp_path}, nothing to import"]
    else:
        assert [files.queue for files in chosen] == ["jobs"]
