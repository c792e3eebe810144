"""Kestrel queue semantics through the real codec and Session, exact bytes (spec §2-§8).

One test per spec table row where practical; each names its section. Time is a ManualClock;
blocked fetches wait on the event loop with bounds of at most a few hundred milliseconds.
"""

from __future__ import annotations

import asyncio

import pytest

from kestrel_compat.wire.memcache_replies import (
    CLIENT_ERROR,
    DELETED,
    END,
    ERROR,
    FLUSHED_ALL,
    NOT_STORED,
    RELOADED,
    SERVER_ERROR,
    STORED,
)
from tests.support.kestrel import (
    CLOSED,
    Harness,
    make_config,
    set_request,
    start_blocked,
    stats_dict,
    value,
)

pytestmark = [pytest.mark.unit, pytest.mark.asyncio]


async def started(**config: object) -> Harness:
    return await Harness(make_config(**config) if config else None).start()  # type: ignore[arg-type]


# --- §2 commands ---------------------------------------------------------------------------------


async def test_set_then_get_returns_flags_zero() -> None:
    """§1.2, §2: flags are never stored; VALUE always says 0."""
    client = (await started()).client()
    assert await client.send(set_request("q", b"hello", flags=123)) == STORED
    assert await client.send(b"get q\r\n") == value("q", b"hello")
    assert await client.send(b"get q\r\n") == END


async def test_fifo_order() -> None:
    client = (await started()).client()
    for data in (b"a", b"b", b"c"):
        await client.send(set_request("q", data))
    assert await client.send(b"get q\r\nget q\r\nget q\r\n") == (
        value("q", b"a") + value("q", b"b") + value("q", b"c")
    )


async def test_noreply_is_answered() -> None:
    """§1.1: there is no noreply."""
    client = (await started()).client()
    assert await client.send(b"set q 0 0 1 noreply\r\nx\r\n") == STORED


async def test_get_reads_only_first_key() -> None:
    """§2: `get a b` = `get a`."""
    client = (await started()).client()
    await client.send(set_request("b", b"x"))
    assert await client.send(b"get a b\r\n") == END


async def test_zero_length_and_binary_items() -> None:
    """§4: zero-length items are legal; data is opaque bytes."""
    client = (await started()).client()
    await client.send(set_request("q", b""))
    await client.send(set_request("q", b"a\r\nb\x00c\n"))
    assert await client.send(b"get q\r\n") == b"VALUE q 0 0\r\n\r\nEND\r\n"
    assert await client.send(b"get q\r\n") == value("q", b"a\r\nb\x00c\n")


async def test_delete_always_deleted_and_does_not_create() -> None:
    """§2: DELETED even if absent; delete does not create."""
    harness = await started()
    client = harness.client()
    assert await client.send(b"delete nothing\r\n") == DELETED
    assert "nothing" not in harness.service.collection.queues
    await client.send(set_request("q", b"x"))
    assert await client.send(b"delete q\r\n") == DELETED
    assert "q" not in harness.service.collection.queues
    assert await client.send(b"get q\r\n") == END


async def test_delete_drops_open_reads() -> None:
    harness = await started()
    a, b = harness.client(), harness.client()
    await a.send(set_request("q", b"x"))
    await a.send(b"get q/open\r\n")
    await b.send(b"delete q\r\n")
    a.disconnect()  # The abort hits the deleted queue: nothing comes back.
    assert await b.send(b"get q\r\n") == END


async def test_flush_removes_available_items_only() -> None:
    """§2: flush removes available items, open reads untouched, does not create."""
    harness = await started()
    a, b = harness.client(), harness.client()
    assert await a.send(b"flush nothing\r\n") == END
    assert "nothing" not in harness.service.collection.queues
    for data in (b"1", b"2", b"3"):
        await a.send(set_request("q", data))
    assert await a.send(b"get q/open\r\n") == value("q", b"1")
    assert await b.send(b"flush q\r\n") == END
    stats = stats_dict(await b.send(b"stats\r\n"))
    assert stats["queue_q_items"] == "0"
    assert stats["queue_q_open_transactions"] == "1"
    assert stats["queue_q_total_flushes"] == "1"
    assert await a.send(b"get q/abort\r\n") == END
    assert await b.send(b"get q\r\n") == value("q", b"1")


async def test_flush_all() -> None:
    client = (await started()).client()
    await client.send(set_request("a", b"1") + set_request("b", b"2"))
    assert await client.send(b"flush_all\r\n") == FLUSHED_ALL
    assert await client.send(b"get a\r\nget b\r\n") == END + END


async def test_version_reload_quit_shutdown() -> None:
    """§2: version, reload, quit (nothing, closed), shutdown (nothing, closed)."""
    harness = await started()
    client = harness.client()
    assert await client.send(b"version\r\n") == b"VERSION 2.4.1\r\n"
    assert await client.send(b"reload\r\n") == RELOADED
    assert await client.send(b"quit\r\n") == CLOSED
    other = harness.client()
    assert await other.send(b"shutdown\r\n") == CLOSED
    assert harness.shutdowns == 1


async def test_unknown_and_removed_commands_close() -> None:
    """§1.3: unknown command and dump_config: CLIENT_ERROR and close."""
    harness = await started()
    assert await harness.client().send(b"incr q 1\r\n") == CLIENT_ERROR + CLOSED
    assert await harness.client().send(b"dump_config\r\n") == CLIENT_ERROR + CLOSED


async def test_quit_aborts_open_reads() -> None:
    """§3.4: quit aborts the connection's open reads."""
    harness = await started()
    a = harness.client()
    await a.send(set_request("q", b"x"))
    await a.send(b"get q/open\r\n")
    assert await a.send(b"quit\r\n") == CLOSED
    assert await harness.client().send(b"get q\r\n") == value("q", b"x")


# --- §3 GET --------------------------------------------------------------------------------------


async def test_unknown_option_is_ignored() -> None:
    """§3.1: `get q/xyz` = `get q`."""
    client = (await started()).client()
    await client.send(set_request("q", b"x"))
    assert await client.send(b"get q/xyz\r\n") == value("q", b"x")


async def test_plain_get_with_open_read_is_error_and_close() -> None:
    """§3.3 row 1: ERROR + close; the disconnect puts the open read back."""
    harness = await started()
    a = harness.client()
    await a.send(set_request("q", b"1") + set_request("q", b"2"))
    assert await a.send(b"get q/open\r\n") == value("q", b"1")
    assert await a.send(b"get q\r\n") == ERROR + CLOSED
    assert await harness.client().send(b"get q\r\n") == value("q", b"1")


async def test_peek_does_not_remove_and_is_allowed_with_open_read() -> None:
    """§3.3 row 2."""
    client = (await started()).client()
    await client.send(set_request("q", b"1") + set_request("q", b"2"))
    assert await client.send(b"get q/peek\r\n") == value("q", b"1")
    assert await client.send(b"get q/open\r\n") == value("q", b"1")
    assert await client.send(b"get q/peek\r\n") == value("q", b"2")
    assert await client.send(b"get q/peek/t=10\r\n") == value("q", b"2")


async def test_second_open_is_error_and_close_by_default() -> None:
    """§3.3 row 3: maxOpenTransactions defaults to 1."""
    client = (await started()).client()
    await client.send(set_request("q", b"1") + set_request("q", b"2"))
    assert await client.send(b"get q/open\r\n") == value("q", b"1")
    assert await client.send(b"get q/open\r\n") == ERROR + CLOSED


async def test_second_open_allowed_with_more_transactions() -> None:
    """§9: shipped configs use 100; then a second /open is accepted."""
    client = (await started(server={"max_open_transactions": 2})).client()
    await client.send(set_request("q", b"1") + set_request("q", b"2") + set_request("q", b"3"))
    assert await client.send(b"get q/open\r\nget q/open\r\n") == value("q", b"1") + value("q", b"2")
    assert await client.send(b"get q/open\r\n") == ERROR + CLOSED


async def test_close_confirms_and_close_without_read_is_silent_end() -> None:
    """§3.3 row 4."""
    harness = await started()
    a = harness.client()
    assert await a.send(b"get q/close\r\n") == END
    await a.send(set_request("q", b"1"))
    await a.send(b"get q/open\r\n")
    assert await a.send(b"get q/close\r\n") == END
    a.disconnect()
    assert await harness.client().send(b"get q\r\n") == END


async def test_close_open_confirms_then_opens() -> None:
    """§3.3 row 5."""
    client = (await started()).client()
    await client.send(set_request("q", b"1") + set_request("q", b"2"))
    assert await client.send(b"get q/open\r\n") == value("q", b"1")
    assert await client.send(b"get q/close/open\r\n") == value("q", b"2")
    assert await client.send(b"get q/close/open\r\n") == END
    assert await client.send(b"get q\r\n") == END


async def test_abort_puts_back_at_head() -> None:
    """§3.3 row 6; abort without an open read is END."""
    client = (await started()).client()
    assert await client.send(b"get q/abort\r\n") == END
    await client.send(set_request("q", b"1") + set_request("q", b"2"))
    await client.send(b"get q/open\r\n")
    assert await client.send(b"get q/abort\r\n") == END
    assert await client.send(b"get q\r\n") == value("q", b"1")


async def test_reads_on_different_queues_are_independent() -> None:
    """§3.3: one open read per queue per connection."""
    client = (await started()).client()
    await client.send(set_request("a", b"1") + set_request("b", b"2"))
    assert await client.send(b"get a/open\r\nget b/open\r\n") == value("a", b"1") + value("b", b"2")
    assert await client.send(b"get a/close\r\nget b/abort\r\n") == END + END


async def test_disconnect_aborts_oldest_first_newest_ends_first() -> None:
    """§3.4: each abort pushes to the head, so the newest open read is served first."""
    harness = await started(server={"max_open_transactions": 2})
    a = harness.client()
    await a.send(set_request("q", b"1") + set_request("q", b"2") + set_request("q", b"3"))
    await a.send(b"get q/open\r\nget q/open\r\n")
    a.disconnect()
    b = harness.client()
    assert await b.send(b"get q\r\nget q\r\nget q\r\n") == (
        value("q", b"2") + value("q", b"1") + value("q", b"3")
    )


async def test_command_counters() -> None:
    """§3.3: cmd_get counts fetches incl. /open; cmd_peek peeks; /close and /abort nothing."""
    harness = await started()
    client = harness.client()
    await client.send(set_request("q", b"1"))
    await client.send(b"get q/peek\r\nget q/open\r\nget q/close\r\nget q/abort\r\nget q\r\n")
    stats = stats_dict(await client.send(b"stats\r\n"))
    assert (stats["cmd_get"], stats["cmd_peek"], stats["cmd_set"]) == ("2", "1", "1")
    assert (stats["get_hits"], stats["get_misses"]) == ("2", "1")
    assert stats["queue_q_transactions"] == "1"


async def test_close_and_abort_do_not_create_queues() -> None:
    """§8.1."""
    harness = await started()
    await harness.client().send(b"get q/close\r\nget r/abort\r\nconfirm s 1\r\n")
    assert harness.service.collection.queues == {}


# --- §3.5 waiters --------------------------------------------------------------------------------


async def test_blocked_get_receives_later_add() -> None:
    harness = await started()
    a, b = harness.client(), harness.client()
    pending = await start_blocked(a, b"get q/t=2000\r\n")
    assert await b.send(set_request("q", b"x")) == STORED
    assert await asyncio.wait_for(pending, 2) == value("q", b"x")


async def test_blocked_get_times_out_with_end() -> None:
    harness = await started()
    loop = asyncio.get_running_loop()
    started_at = loop.time()
    assert await harness.client().send(b"get q/t=50\r\n") == END
    assert loop.time() - started_at >= 0.04
    stats = stats_dict(await harness.client().send(b"stats\r\n"))
    assert stats["get_misses"] == "1"
    assert stats["queue_q_waiters"] == "0"


async def test_t_zero_and_negative_do_not_wait() -> None:
    client = (await started()).client()
    assert await asyncio.wait_for(client.send(b"get q/t=0\r\nget q/t=-5\r\n"), 0.5) == END + END


async def test_waiters_are_fifo_one_wake_per_add() -> None:
    """§3.5: each add wakes exactly the oldest waiter."""
    harness = await started()
    first, second, producer = harness.client(), harness.client(), harness.client()
    one = await start_blocked(first, b"get q/t=2000\r\n")
    two = await start_blocked(second, b"get q/t=2000\r\n")
    await producer.send(set_request("q", b"x"))
    assert await asyncio.wait_for(one, 2) == value("q", b"x")
    assert not two.done()
    await producer.send(set_request("q", b"y"))
    assert await asyncio.wait_for(two, 2) == value("q", b"y")


async def test_woken_peek_consumes_the_wakeup() -> None:
    """§3.5: a blocked GET behind a woken peek stays blocked until the next add."""
    harness = await started()
    peeker, getter, producer = harness.client(), harness.client(), harness.client()
    peek = await start_blocked(peeker, b"get q/peek/t=2000\r\n")
    get = await start_blocked(getter, b"get q/t=2000\r\n")
    await producer.send(set_request("q", b"x"))
    assert await asyncio.wait_for(peek, 2) == value("q", b"x")
    await asyncio.sleep(0.05)
    assert not get.done()
    await producer.send(set_request("q", b"y"))
    assert await asyncio.wait_for(get, 2) == value("q", b"x")


async def test_departed_waiter_never_eats_an_item() -> None:
    """§3.4: a cancelled blocked fetch never consumes an item."""
    harness = await started()
    gone, producer, reader = harness.client(), harness.client(), harness.client()
    pending = await start_blocked(gone, b"get q/t=5000\r\n")
    queue = harness.service.collection.queues["q"]
    gone.disconnect()
    assert await asyncio.wait_for(pending, 2) == CLOSED
    assert queue.waiter_count == 0
    await producer.send(set_request("q", b"x"))
    assert await reader.send(b"get q\r\n") == value("q", b"x")


async def test_wakeup_passes_on_when_woken_waiter_left() -> None:
    """§3.4-§3.5: a waiter woken as its client leaves hands the wake-up to the next one."""
    harness = await started()
    gone, staying, producer = harness.client(), harness.client(), harness.client()
    first = await start_blocked(gone, b"get q/t=5000\r\n")
    second = await start_blocked(staying, b"get q/t=5000\r\n")
    # The add wakes `gone`'s waiter; its client leaves before the fetch re-runs.
    producer_task = producer.start(set_request("q", b"x"))
    gone.disconnect()
    assert await asyncio.wait_for(producer_task, 2) == STORED
    assert await asyncio.wait_for(first, 2) == CLOSED
    assert await asyncio.wait_for(second, 2) == value("q", b"x")


async def test_abort_wakes_a_waiter() -> None:
    """§3.5: each abort wakes one waiter."""
    harness = await started()
    owner, waiter = harness.client(), harness.client()
    await owner.send(set_request("q", b"x"))
    await owner.send(b"get q/open\r\n")
    pending = await start_blocked(waiter, b"get q/t=2000\r\n")
    await owner.send(b"get q/abort\r\n")
    assert await asyncio.wait_for(pending, 2) == value("q", b"x")


async def test_delete_wakes_waiters_with_end() -> None:
    """§3.4: deleting a queue wakes its waiters, which answer END."""
    harness = await started()
    waiter, deleter = harness.client(), harness.client()
    pending = await start_blocked(waiter, b"get q/t=5000\r\n")
    await deleter.send(b"delete q\r\n")
    assert await asyncio.wait_for(pending, 2) == END


# --- §4 expiry and limits ------------------------------------------------------------------------


async def test_relative_expiry_is_strict() -> None:
    """§4: 0 < e < 1000000 is now + e s; expired iff expiry < now (strict)."""
    harness = await started()
    client = harness.client()
    await client.send(set_request("q", b"x", exptime=10))
    harness.clock.advance(10)
    assert await client.send(b"get q/peek\r\n") == value("q", b"x")
    harness.clock.advance(0.001)
    assert await client.send(b"get q\r\n") == END
    stats = stats_dict(await client.send(b"stats\r\n"))
    assert stats["queue_q_expired_items"] == "1"


async def test_absolute_and_negative_expiry() -> None:
    """§4: e >= 1000000 is absolute Unix seconds (1000000 = 1970, expired); negative expired."""
    harness = await started()
    client = harness.client()
    await client.send(set_request("q", b"old", exptime=1_000_000))
    await client.send(set_request("q", b"neg", exptime=-1))
    future_s = int(harness.clock.now_s()) + 100
    await client.send(set_request("q", b"live", exptime=future_s))
    assert await client.send(b"get q\r\n") == value("q", b"live")


async def test_expiry_is_lazy_and_head_only() -> None:
    """§4: an expired item behind a live head stays (and counts in items) until it is the head."""
    harness = await started()
    client = harness.client()
    await client.send(set_request("q", b"live"))
    await client.send(set_request("q", b"short", exptime=1))
    await client.send(set_request("q", b"tail"))
    harness.clock.advance(5)
    stats = stats_dict(await client.send(b"stats\r\n"))
    assert stats["queue_q_items"] == "3"
    assert await client.send(b"get q\r\nget q\r\n") == value("q", b"live") + value("q", b"tail")


async def test_max_age_caps_expiry() -> None:
    """§4, §9: effective expiry = min(item expiry, add time + maxAge)."""
    harness = await started(default={"max_age_ms": 1000})
    client = harness.client()
    await client.send(set_request("q", b"x"))
    harness.clock.advance(1.5)
    assert await client.send(b"get q\r\n") == END


async def test_expire_to_queue() -> None:
    """§4: expired items move to expireToQueue, with no expiry."""
    harness = await started(queues={"q": {"expire_to_queue": "dead"}})
    client = harness.client()
    await client.send(set_request("q", b"x", exptime=1))
    harness.clock.advance(2)
    assert await client.send(b"get q\r\n") == END
    assert await client.send(b"get dead\r\n") == value("dead", b"x")


async def test_flush_expired_counts() -> None:
    """§2: flush_expired and flush_all_expired reply with the number discarded."""
    harness = await started()
    client = harness.client()
    await client.send(set_request("a", b"1", exptime=1) + set_request("a", b"2", exptime=1))
    await client.send(set_request("b", b"3", exptime=1))
    harness.clock.advance(2)
    assert await client.send(b"flush_expired a\r\n") == b"2\r\n"
    assert await client.send(b"flush_expired nothing\r\n") == b"0\r\n"
    assert await client.send(b"flush_all_expired\r\n") == b"1\r\n"


async def test_full_queue_refuses() -> None:
    """§4: full when items >= maxItems before the add."""
    client = (await started(default={"max_items": 2})).client()
    await client.send(set_request("q", b"1") + set_request("q", b"2"))
    assert await client.send(set_request("q", b"3")) == NOT_STORED


async def test_big_item_fits_below_max_size() -> None:
    """§4: the size check is 'already >= maxSize', so a big item fits in a queue below it."""
    client = (await started(default={"max_size_bytes": 10})).client()
    assert await client.send(set_request("q", b"x" * 20)) == STORED
    assert await client.send(set_request("q", b"y")) == NOT_STORED


async def test_max_item_size() -> None:
    """§4: len > maxItemSize refused; = limit ok."""
    client = (await started(default={"max_item_size_bytes": 3})).client()
    assert await client.send(set_request("q", b"abc")) == STORED
    assert await client.send(set_request("q", b"abcd")) == NOT_STORED


async def test_discard_old_when_full() -> None:
    """§4: drop heads until below both limits; `discarded` counts them."""
    harness = await started(default={"max_items": 2, "discard_old_when_full": True})
    client = harness.client()
    for data in (b"1", b"2", b"3"):
        assert await client.send(set_request("q", data)) == STORED
    assert await client.send(b"get q\r\nget q\r\n") == value("q", b"2") + value("q", b"3")
    assert stats_dict(await client.send(b"stats\r\n"))["queue_q_discarded"] == "1"


async def test_fanout_only_master_stores_nothing() -> None:
    """§4, §8.2: fanoutOnly master: STORED, nothing kept; children still get copies."""
    harness = await started(queues={"m": {"fanout_only": True}})
    client = harness.client()
    await client.send(b"get m+c\r\n")
    assert await client.send(set_request("m", b"x")) == STORED
    assert await client.send(b"get m\r\nget m+c\r\n") == END + value("m+c", b"x")


# --- §5 MONITOR / CONFIRM ------------------------------------------------------------------------


async def test_monitor_zero_seconds_is_end() -> None:
    client = (await started()).client()
    await client.send(set_request("q", b"x"))
    assert await client.send(b"monitor q 0\r\n") == END


async def test_monitor_yields_one_item_by_default_as_open_read() -> None:
    """§5: default config => at most one item; items are open reads; confirm closes them."""
    harness = await started()
    client = harness.client()
    await client.send(set_request("q", b"x") + set_request("q", b"y"))
    assert await client.send(b"monitor q 1\r\n") == b"VALUE q 0 1\r\nx\r\nEND\r\nEND\r\n"
    assert stats_dict(await client.send(b"stats\r\n"))["queue_q_open_transactions"] == "1"
    assert await client.send(b"confirm q 1\r\n") == END
    assert await client.send(b"get q\r\n") == value("q", b"y")


async def test_monitor_max_items_with_more_transactions() -> None:
    harness = await started(server={"max_open_transactions": 5})
    client = harness.client()
    await client.send(set_request("q", b"1") + set_request("q", b"2") + set_request("q", b"3"))
    assert await client.send(b"monitor q 1 2\r\n") == value("q", b"1") + value("q", b"2") + END


async def test_monitor_waits_until_deadline_for_items() -> None:
    harness = await started()
    client = harness.client()
    loop = asyncio.get_running_loop()
    started_at = loop.time()
    assert await client.send(b"monitor q 1\r\n") == END
    assert loop.time() - started_at >= 0.9


async def test_confirm_over_count_confirms_nothing() -> None:
    """§5: n > open count or n = 0 -> ERROR, connection stays, nothing confirmed."""
    client = (await started()).client()
    await client.send(set_request("q", b"x"))
    await client.send(b"get q/open\r\n")
    assert await client.send(b"confirm q 2\r\n") == ERROR
    assert await client.send(b"confirm q 0\r\n") == ERROR
    assert await client.send(b"get q/abort\r\n") == END
    assert await client.send(b"get q\r\n") == value("q", b"x")


async def test_confirm_closes_get_open_reads() -> None:
    client = (await started()).client()
    await client.send(set_request("q", b"x"))
    await client.send(b"get q/open\r\n")
    assert await client.send(b"confirm q 1\r\n") == END
    assert await client.send(b"get q\r\n") == END


# --- §6 stats ------------------------------------------------------------------------------------

GLOBAL_STATS = [
    "uptime",
    "time",
    "version",
    "curr_items",
    "total_items",
    "bytes",
    "reserved_memory_ratio",
    "curr_connections",
    "total_connections",
    "cmd_get",
    "cmd_set",
    "cmd_peek",
    "get_hits",
    "get_misses",
    "bytes_read",
    "bytes_written",
    "queue_creates",
    "queue_deletes",
    "queue_expires",
]
QUEUE_STATS = [
    "items",
    "bytes",
    "total_items",
    "logsize",
    "expired_items",
    "mem_items",
    "mem_bytes",
    "age",
    "discarded",
    "waiters",
    "open_transactions",
    "transactions",
    "canceled_transactions",
    "total_flushes",
    "journal_rewrites",
    "journal_rotations",
]


async def test_stats_names_and_order() -> None:
    harness = await started()
    client = harness.client()
    await client.send(set_request("q", b"hello world"))
    reply = await client.send(b"stats\r\n")
    names = [line.split(" ")[1] for line in reply.decode().split("\r\n") if line.startswith("STAT")]
    assert names == GLOBAL_STATS + [f"queue_q_{name}" for name in QUEUE_STATS]
    stats = stats_dict(reply)
    assert stats["version"] == "2.4.1"
    assert stats["curr_items"] == "1"
    assert stats["bytes"] == "11"
    assert stats["queue_q_logsize"] == "32"  # §12: one 11-byte item.
    assert stats["curr_connections"] == "1"


async def test_stats_and_dump_stats_do_not_create() -> None:
    """§6: STATS/DUMP_STATS never create queues; unknown name and no-queue forms."""
    harness = await started()
    client = harness.client()
    assert await client.send(b"dump_stats\r\n") == b"\r\nEND\r\n"
    assert await client.send(b"dump_stats x\r\n") == b"queue 'x' {\r\n  \r\n}\r\nEND\r\n"
    await client.send(b"stats\r\n")
    assert harness.service.collection.queues == {}


async def test_dump_stats_block() -> None:
    client = (await started()).client()
    await client.send(set_request("q", b"x"))
    reply = await client.send(b"dump_stats q\r\n")
    assert reply.startswith(b"queue 'q' {\r\n  items=1\r\n  bytes=1\r\n  total_items=1\r\n")
    assert reply.endswith(b"  journal_rotations=0\r\n}\r\nEND\r\n")


async def test_age_is_time_since_last_removed_item_was_added() -> None:
    """§6: age = now - add time of the last removed item; 0 when bytes = 0."""
    harness = await started()
    client = harness.client()
    await client.send(set_request("q", b"1"))
    harness.clock.advance(1)
    await client.send(set_request("q", b"2"))
    assert stats_dict(await client.send(b"stats\r\n"))["queue_q_age"] == "0"
    await client.send(b"get q\r\n")
    harness.clock.advance(2)
    assert stats_dict(await client.send(b"stats\r\n"))["queue_q_age"] == "3000"


async def test_canceled_transactions_counts_aborts() -> None:
    harness = await started()
    client = harness.client()
    await client.send(set_request("q", b"x"))
    await client.send(b"get q/open\r\nget q/abort\r\n")
    client.disconnect()
    stats = stats_dict(await harness.client().send(b"stats\r\n"))
    assert stats["queue_q_canceled_transactions"] == "1"


async def test_children_stat_and_empty_children_after_delete() -> None:
    """§6: children printed when the fanout table has an entry, possibly empty."""
    harness = await started()
    client = harness.client()
    await client.send(b"get m\r\nget m+a\r\n")
    assert stats_dict(await client.send(b"stats\r\n"))["queue_m_children"] == "m+a"
    await client.send(b"delete m+a\r\n")
    reply = await client.send(b"stats\r\n")
    assert b"STAT queue_m_children \r\n" in reply


async def test_alias_stats() -> None:
    client = (await started(aliases={"al": ("a", "b")})).client()
    await client.send(set_request("al", b"xy"))
    stats = stats_dict(await client.send(b"stats\r\n"))
    assert (stats["queue_al_put_items"], stats["queue_al_put_bytes"]) == ("1", "2")
    assert stats["queue_al_children"] == "a,b"


# --- §7 server status ----------------------------------------------------------------------------


async def test_status_words() -> None:
    client = (await started()).client()
    assert await client.send(b"status\r\n") == b"UP\r\n"
    for word, reply in (
        (b"readonly", b"READONLY"),
        (b"WriteAvoid", b"WRITEAVOID"),
        (b"quiescent", b"QUIESCENT"),
        (b"up", b"UP"),
    ):
        assert await client.send(b"status " + word + b"\r\n") == END
        assert await client.send(b"status\r\n") == reply + b"\r\n"


async def test_bad_status_word_closes() -> None:
    harness = await started()
    assert await harness.client().send(b"status down\r\n") == CLIENT_ERROR + CLOSED


async def test_readonly_refuses_writes() -> None:
    """§7: ReadOnly: writes SERVER_ERROR + close, flush_expired silent close; reads fine."""
    harness = await started()
    admin = harness.client()
    await admin.send(set_request("q", b"x"))
    await admin.send(b"status readonly\r\n")
    assert await harness.client().send(set_request("q", b"y")) == SERVER_ERROR + CLOSED
    assert await harness.client().send(b"delete q\r\n") == SERVER_ERROR + CLOSED
    assert await harness.client().send(b"flush q\r\n") == SERVER_ERROR + CLOSED
    assert await harness.client().send(b"flush_all\r\n") == SERVER_ERROR + CLOSED
    assert await harness.client().send(b"flush_expired q\r\n") == CLOSED
    assert await harness.client().send(b"get q/peek\r\n") == value("q", b"x")
    assert await admin.send(b"get q\r\n") == value("q", b"x")


async def test_quiescent_refuses_reads() -> None:
    """§7: Quiescent: fetches SERVER_ERROR + close, monitor silent close; close/confirm fine."""
    harness = await started()
    admin = harness.client()
    await admin.send(set_request("q", b"x"))
    await admin.send(b"get q/open\r\n")
    await harness.client().send(b"status quiescent\r\n")
    assert await harness.client().send(b"get q\r\n") == SERVER_ERROR + CLOSED
    assert await harness.client().send(b"get q/peek\r\n") == SERVER_ERROR + CLOSED
    assert await harness.client().send(b"monitor q 1\r\n") == CLOSED
    assert await admin.send(b"confirm q 1\r\n") == END
    assert await admin.send(b"get q/close\r\nget q/abort\r\n") == END + END
    assert await admin.send(b"stats\r\n") != CLOSED


async def test_status_not_configured_is_error_and_close() -> None:
    harness = await started(server={"status_enabled": False})
    assert await harness.client().send(b"status\r\n") == ERROR + CLOSED


async def test_stricter_status_waits_for_grace_period() -> None:
    """§7: a stricter status is enforced after statusChangeGracePeriod, a looser one at once."""
    harness = await started(server={"status_change_grace_period_ms": 1000})
    admin = harness.client()
    await admin.send(b"status readonly\r\n")
    assert await admin.send(b"status\r\n") == b"READONLY\r\n"
    assert await admin.send(set_request("q", b"x")) == STORED
    harness.clock.advance(1)
    assert await harness.client().send(set_request("q", b"y")) == SERVER_ERROR + CLOSED
    await admin.send(b"status up\r\n")
    assert await admin.send(set_request("q", b"z")) == STORED


async def test_connection_limit_refuses_writes_for_life() -> None:
    harness = await started(server={"connection_limit_refuse_writes": 1})
    first = harness.client()
    second = harness.client()
    assert await first.send(set_request("q", b"x")) == STORED
    assert await second.send(set_request("q", b"y")) == SERVER_ERROR + CLOSED


# --- §8 names, fanout, aliases -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a.b", "a/b", "a~b"])
async def test_illegal_name_closes_silently_on_create(name: str) -> None:
    harness = await started()
    request = set_request(name, b"x") if "/" not in name else b"set a/b 0 0 1\r\nx\r\n"
    assert await harness.client().send(request) == CLOSED
    assert await harness.client().send(b"delete " + name.encode() + b"\r\n") == DELETED


async def test_illegal_name_on_get_closes_silently() -> None:
    harness = await started()
    assert await harness.client().send(b"get a.b\r\n") == CLOSED


async def test_fanout_child_sees_only_later_items() -> None:
    """§8.2: items already in m are not copied."""
    client = (await started()).client()
    await client.send(set_request("m", b"before"))
    await client.send(b"get m+c\r\n")
    await client.send(set_request("m", b"after"))
    assert await client.send(b"get m+c\r\nget m+c\r\n") == value("m+c", b"after") + END
    assert await client.send(b"get m\r\nget m\r\n") == value("m", b"before") + value("m", b"after")


async def test_set_to_child_touches_only_child() -> None:
    client = (await started()).client()
    await client.send(b"get m\r\nget m+c\r\n")
    await client.send(set_request("m+c", b"x"))
    assert await client.send(b"get m\r\nget m+c\r\n") == END + value("m+c", b"x")


async def test_deleted_child_is_unregistered_and_recreated_empty() -> None:
    client = (await started()).client()
    await client.send(b"get m+c\r\n")
    await client.send(set_request("m", b"1"))
    await client.send(b"delete m+c\r\n")
    await client.send(set_request("m", b"2"))
    assert "m+c" not in client.harness.service.collection.queues
    assert await client.send(b"get m+c\r\n") == END
    await client.send(set_request("m", b"3"))
    assert await client.send(b"get m+c\r\n") == value("m+c", b"3")


async def test_deleting_master_keeps_children() -> None:
    client = (await started()).client()
    await client.send(b"get m+c\r\n")
    await client.send(b"delete m\r\n")
    await client.send(set_request("m", b"x"))
    assert await client.send(b"get m+c\r\n") == value("m+c", b"x")


async def test_full_child_does_not_change_master_reply() -> None:
    """§8.2: children have their own limits; their result is ignored."""
    client = (await started(queues={"m+c": {"max_items": 1}})).client()
    await client.send(b"get m+c\r\n")
    assert await client.send(set_request("m", b"1") + set_request("m", b"2")) == STORED + STORED
    assert await client.send(b"get m+c\r\nget m+c\r\n") == value("m+c", b"1") + END


async def test_alias_set_reaches_destinations_and_reads_empty() -> None:
    """§8.3: SET adds to each destination (fanouts apply); GET on an alias is END."""
    client = (await started(aliases={"al": ("a", "b")})).client()
    await client.send(b"get a+f\r\n")
    assert await client.send(set_request("al", b"x")) == STORED
    assert await client.send(b"get al\r\n") == END
    assert await client.send(b"get a\r\nget b\r\nget a+f\r\n") == (
        value("a", b"x") + value("b", b"x") + value("a+f", b"x")
    )
    assert await client.send(b"delete al\r\nflush al\r\n") == DELETED + END


async def test_alias_refused_destination_is_not_stored() -> None:
    client = (await started(aliases={"al": ("a", "b")}, queues={"b": {"max_items": 0}})).client()
    assert await client.send(set_request("al", b"x")) == NOT_STORED
    assert await client.send(b"get a\r\n") == value("a", b"x")


# --- §9 config and reload ------------------------------------------------------------------------


async def test_reload_recomputes_live_queue_config(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "kestrel.toml"
    path.write_text("[queues.q]\nmax_items = 1\n")
    from kayos.clock import ManualClock
    from kestrel_compat.backends.memory import MemoryBackend
    from kestrel_compat.core.config import load_config
    from kestrel_compat.sessions.service import KestrelService

    harness = Harness(load_config(path))
    harness.service = KestrelService(
        harness.config, MemoryBackend(), ManualClock(), config_path=str(path)
    )
    await harness.start()
    client = harness.client()
    await client.send(set_request("q", b"1"))
    assert await client.send(set_request("q", b"2")) == NOT_STORED
    path.write_text("[queues.q]\nmax_items = 5\n")
    assert await client.send(b"reload\r\n") == RELOADED
    assert await client.send(set_request("q", b"2")) == STORED
