"""The pure parts of the Kestrel front: waiters, group ledger, blob, config, and persistence
through MemoryBackend across restarts (spec §3.4-§3.5, §9, §12; docs/kestrel-compat.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kayos.clock import ManualClock
from kestrel_compat import limits
from kestrel_compat.backends.memory import MemoryBackend
from kestrel_compat.core.collection import QueueCollection
from kestrel_compat.core.config import (
    ConfigError,
    QueueConfig,
    load_config,
    load_queue_settings,
)
from kestrel_compat.core.ledger import GroupLedger
from kestrel_compat.core.persistence import (
    BackendError,
    GroupState,
    NewEntry,
    decode_removed,
    encode_removed,
)
from kestrel_compat.core.queue import LogEntry, Waiter
from kestrel_compat.core.status import ServerStatus
from kestrel_compat.sessions.memcache_session import expiry_from_exptime
from kestrel_compat.wire.memcache_replies import END, SERVER_ERROR, STORED
from tests.support.kestrel import CLOSED, Harness, make_config, set_request, value

pytestmark = pytest.mark.unit

# --- waiters (§3.5), without any event loop ------------------------------------------------------


def test_each_add_wakes_exactly_the_oldest_waiter() -> None:
    collection = QueueCollection(make_config().queues, ManualClock())
    queue = collection.queue("q")
    assert queue is not None
    woken: list[str] = []
    for name in ("first", "second", "third"):
        queue.add_waiter(Waiter(lambda name=name: woken.append(name)))  # type: ignore[misc]
    collection.add("q", b"x", None)
    assert woken == ["first"]
    assert queue.waiter_count == 2
    collection.add("q", b"y", None)
    assert woken == ["first", "second"]


def test_abort_wakes_one_waiter_and_close_wakes_all() -> None:
    collection = QueueCollection(make_config().queues, ManualClock())
    queue = collection.queue("q")
    assert queue is not None
    collection.add("q", b"x", None)
    item = queue.remove(transactional=True)
    assert item is not None
    woken: list[int] = []
    for number in range(3):
        queue.add_waiter(Waiter(lambda number=number: woken.append(number)))  # type: ignore[misc]
    queue.unremove(item.xid)
    assert woken == [0]
    collection.delete("q")
    assert woken == [0, 1, 2]


def test_removed_waiter_is_not_woken() -> None:
    collection = QueueCollection(make_config().queues, ManualClock())
    queue = collection.queue("q")
    assert queue is not None
    woken: list[str] = []
    gone = Waiter(lambda: woken.append("gone"))
    queue.add_waiter(gone)
    queue.add_waiter(Waiter(lambda: woken.append("kept")))
    assert queue.remove_waiter(gone)
    assert not queue.remove_waiter(gone)
    collection.add("q", b"x", None)
    assert woken == ["kept"]


# --- expiry numbers (§4) -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exptime", "expected"),
    [
        (0, None),
        (10, 1_000_000 + 10_000),
        (999_999, 1_000_000 + 999_999_000),
        (1_000_000, 1_000_000_000),
        (-1, 1_000_000 - 1000),
    ],
)
def test_expiry_from_exptime(exptime: int, expected: int | None) -> None:
    assert expiry_from_exptime(exptime, 1_000_000) == expected


# --- the group ledger and its blob ---------------------------------------------------------------


def test_ledger_hwm_stops_below_lowest_live_seq() -> None:
    ledger = GroupLedger(hwm=0)
    for seq in (3, 5, 9):
        ledger.live(seq)
    ledger.gone(5)  # Out of order: 3 is still live (an open read).
    state = ledger.state(tail_seq=9)
    assert state.hwm == 2
    assert decode_removed(state.hwm, state.blob) == {5}
    ledger.gone(3)
    state = ledger.state(tail_seq=9)
    assert state.hwm == 8
    assert decode_removed(state.hwm, state.blob) == set()
    ledger.gone(9)
    assert ledger.state(tail_seq=12).hwm == 12


def test_blob_round_trip_and_bound() -> None:
    seqs = [*range(101, 200, 3), 10**12]
    assert decode_removed(100, encode_removed(100, seqs)) == set(seqs)
    assert decode_removed(7, b"") == set()
    many = list(range(1, 200_000, 1000))
    blob = encode_removed(0, many)
    assert len(blob) <= limits.group_blob_bytes_max
    huge = list(range(1, 10**9, 50_000))
    kept = decode_removed(0, encode_removed(0, huge))
    assert kept == set(huge[: len(kept)])  # The highest are the ones left out.
    assert len(encode_removed(0, huge)) <= limits.group_blob_bytes_max


def test_blob_rejects_garbage() -> None:
    with pytest.raises(BackendError):
        decode_removed(0, b"\x09\x00\x00\x00\x00")
    with pytest.raises(BackendError):
        decode_removed(0, encode_removed(0, [5])[:-1])


# --- MemoryBackend -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_memory_backend_contract() -> None:
    backend = MemoryBackend()
    first = await backend.append("a", [NewEntry(b"1", 1, None, ("a",))])
    second = await backend.append("b", [NewEntry(b"2", 1, 5, ("b",)), NewEntry(b"3", 1, None, ())])
    assert first == [1]
    assert second == [2, 3]  # One seq space, so each log has gaps.
    assert [entry.value for entry in await backend.read("b", 0, 10)] == [b"2", b"3"]
    assert [entry.seq for entry in await backend.read("b", 2, 10)] == [3]
    await backend.commit_group("b", "b", GroupState(2, b""))
    assert await backend.load_group("b", "b") == GroupState(2, b"")
    assert await backend.load_group("b", "nope") is None
    assert await backend.list_groups("b") == ["b"]
    assert await backend.last_seq("b") == 3
    await backend.delete_log("b")
    assert await backend.list_logs() == ["a"]
    backend.fail_next = True
    with pytest.raises(BackendError):
        await backend.list_logs()


# --- persistence across restarts -----------------------------------------------------------------

pytest_asyncio_mark = pytest.mark.asyncio


@pytest_asyncio_mark
async def test_items_survive_restart_and_removed_ones_do_not() -> None:
    harness = await Harness().start()
    client = harness.client()
    for data in (b"1", b"2", b"3", b"4"):
        await client.send(set_request("q", data))
    assert await client.send(b"get q\r\n") == value("q", b"1")
    assert await client.send(b"get q/open\r\n") == value("q", b"2")
    restarted = await harness.restart()
    reader = restarted.client()
    # The open read was never confirmed: it is back, at-least-once, in seq order.
    assert await reader.send(b"get q\r\nget q\r\nget q\r\nget q\r\n") == (
        value("q", b"2") + value("q", b"3") + value("q", b"4") + END
    )


@pytest_asyncio_mark
async def test_out_of_order_confirms_survive_restart() -> None:
    harness = await Harness(make_config(server={"max_open_transactions": 3})).start()
    client = harness.client()
    for data in (b"1", b"2", b"3", b"4"):
        await client.send(set_request("q", data))
    await client.send(b"get q/open\r\n")  # 1 stays open
    other = harness.client()
    await other.send(b"get q\r\nget q\r\n")  # 2 and 3 removed above the open read
    restarted = await harness.restart()
    assert await restarted.client().send(b"get q\r\nget q\r\nget q\r\n") == (
        value("q", b"1") + value("q", b"4") + END
    )


@pytest_asyncio_mark
async def test_fanouts_and_deletes_survive_restart() -> None:
    harness = await Harness().start()
    client = harness.client()
    await client.send(set_request("m", b"old"))
    await client.send(b"get m+c\r\n")
    await client.send(set_request("m", b"new"))
    await client.send(set_request("gone", b"x"))
    await client.send(b"delete gone\r\n")
    restarted = await harness.restart()
    assert sorted(restarted.service.collection.queues) == ["m", "m+c"]
    reader = restarted.client()
    assert await reader.send(b"get m+c\r\nget m+c\r\n") == value("m+c", b"new") + END
    assert await reader.send(set_request("m", b"later")) == STORED
    assert await reader.send(b"get m+c\r\n") == value("m+c", b"later")
    assert await reader.send(b"get gone\r\n") == END


@pytest_asyncio_mark
async def test_recreated_child_does_not_see_earlier_incarnation_after_restart() -> None:
    harness = await Harness().start()
    client = harness.client()
    await client.send(b"get m+c\r\n")
    await client.send(set_request("m", b"first"))
    await client.send(b"delete m+c\r\n")
    await client.send(b"get m+c\r\n")
    restarted = await harness.restart()
    assert await restarted.client().send(b"get m+c\r\nget m\r\n") == END + value("m", b"first")


@pytest_asyncio_mark
async def test_backend_failure_on_set_is_server_error_and_close() -> None:
    harness = await Harness().start()
    assert await harness.client().send(b"get q\r\n") == END  # Creates q: its group is stored.
    harness.backend.fail_next = True
    assert await harness.client().send(set_request("q", b"x")) == SERVER_ERROR + CLOSED


@pytest_asyncio_mark
async def test_appends_share_one_seq_per_fanout_set() -> None:
    harness = await Harness().start()
    client = harness.client()
    await client.send(b"get m\r\nget m+a\r\nget m+b\r\n")
    await client.send(set_request("m", b"x"))
    entries = await harness.backend.read("m", 0, 10)
    assert [(entry.value, entry.groups) for entry in entries] == [(b"x", ("m+a", "m+b", "m"))]


@pytest_asyncio_mark
async def test_concurrent_sets_keep_order() -> None:
    harness = await Harness().start()
    clients = [harness.client() for _ in range(5)]
    replies = await asyncio.gather(
        *(c.send(set_request("q", str(n).encode())) for n, c in enumerate(clients))
    )
    assert replies == [STORED] * 5
    restarted = await harness.restart()
    got = await restarted.client().send(b"get q\r\n" * 5)
    assert got == b"".join(value("q", str(n).encode()) for n in range(5))


def test_log_entry_groups_follow_copies() -> None:
    collection = QueueCollection(make_config().queues, ManualClock())
    stored, entries = collection.add("q", b"x", None)
    assert stored
    assert [entry.new_entry().groups for entry in entries] == [("q",)]
    assert isinstance(entries[0], LogEntry)


# --- config (§9) ---------------------------------------------------------------------------------

GUIDE_EXAMPLE = """
[default]
max_memory_size_bytes = 8388608

[queues.q]
max_items = 500

[queues."q+fanout"]
max_age_ms = 60000

[queues.x]
max_memory_size_bytes = 16777216
"""


def test_inheritance_matches_the_guide_table(tmp_path: Path) -> None:
    """§9: Kestrel >= 2.3.4 column of the guide's example."""
    path = tmp_path / "k.toml"
    path.write_text(GUIDE_EXAMPLE)
    settings = load_queue_settings(path)
    mib = 1024 * 1024
    assert settings.config_for("q").max_memory_size_bytes == 8 * mib
    assert settings.config_for("q+fanout").max_memory_size_bytes == 8 * mib
    assert settings.config_for("x").max_memory_size_bytes == 16 * mib
    assert settings.config_for("q").max_items == 500
    assert settings.config_for("q+fanout").max_items == 500
    assert settings.config_for("q+fanout").max_age_ms == 60_000
    assert settings.config_for("q").max_age_ms is None
    assert settings.config_for("other") == settings.default
    assert settings.config_for("q+other") == settings.config_for("q")


def test_defaults_are_kestrels() -> None:
    config = QueueConfig()
    assert config.max_items == 2**31 - 1
    assert config.max_size_bytes == 2**63 - 1
    assert not config.discard_old_when_full
    server = load_config(None).server
    assert (server.host, server.port, server.max_open_transactions) == ("127.0.0.1", 22133, 1)
    assert server.default_status is ServerStatus.UP


def test_server_table_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "k.toml"
    path.write_text(
        '[server]\nport = 0\nmax_open_transactions = 100\ndefault_status = "readonly"\n'
    )
    config = load_config(path)
    assert config.server.max_open_transactions == 100
    assert config.server.default_status is ServerStatus.READONLY
    for text in (
        "[queues.q]\nmax_itemz = 1\n",
        "[server]\nport = 70000\n",
        "[queues.q]\nmax_items = -1\n",
        "[aliases.a]\ndestination_queues = 3\n",
        "[bogus]\n",
        "not toml =",
    ):
        path.write_text(text)
        with pytest.raises(ConfigError):
            load_config(path)
    with pytest.raises(ConfigError):
        load_config(tmp_path / "missing.toml")


@pytest_asyncio_mark
async def test_status_file_is_restored(tmp_path: Path) -> None:
    status_file = tmp_path / "status"
    config = make_config(server={"status_file": str(status_file)})
    harness = await Harness(config).start()
    assert await harness.client().send(b"status readonly\r\n") == END
    assert status_file.read_text() == "readonly"
    again = await Harness(config).start()
    assert await again.client().send(b"status\r\n") == b"READONLY\r\n"
