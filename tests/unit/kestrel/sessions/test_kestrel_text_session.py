"""Kestrel's text protocol through the real codec and TextSession, exact bytes (spec §10).

One test per row of spec §10's table, each naming the row; the queues are the same
``KestrelService`` the memcache front serves, so the cross-protocol tests use both. Time is a
ManualClock; blocked fetches wait on the event loop with bounds of a few hundred milliseconds.
"""

from __future__ import annotations

import asyncio

import pytest

from kestrel_compat.core.status import ServerStatus
from kestrel_compat.sessions.text_session import TextSession
from kestrel_compat.wire.text_codec import TextConnection
from tests.support.kestrel import (
    CLOSED,
    Client,
    Harness,
    make_config,
    set_request,
    stats_dict,
    value,
    wait_until,
)

pytestmark = [pytest.mark.unit, pytest.mark.asyncio]


class TextClient(Client):
    """One text connection fed through a real TextConnection and TextSession."""

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.session = TextSession(harness.service)
        self.codec = TextConnection()
        self.closed = False


async def started(**config: object) -> Harness:
    return await Harness(make_config(**config) if config else None).start()  # type: ignore[arg-type]


def open_reads(harness: Harness, queue: str = "q") -> int:
    return len(harness.service.collection.queues[queue].open_reads)


# --- put ----------------------------------------------------------------------------------------


async def test_put_stores_items_in_order_and_counts_them() -> None:
    """§10 put: `+<stored>`; the items come back in order."""
    harness = await started()
    client = TextClient(harness)
    assert await client.send(b"put q:\nab\ncd\n\n") == b"+2\n"
    assert await client.send(b"get q\n") == b":ab\n"
    assert await client.send(b"get q\n") == b":cd\n"
    assert await client.send(b"get q\n") == b"*\n"


async def test_put_counts_only_stored_items() -> None:
    """§10 put: a refused item (queue full) is not counted; later ones are still tried."""
    harness = await started(queues={"q": {"max_items": 1}})
    client = TextClient(harness)
    assert await client.send(b"put q:\na\nb\n\n") == b"+1\n"
    stats = stats_dict(await harness.client().send(b"stats\r\n"))
    assert stats["cmd_set"] == "2"
    assert stats["queue_q_items"] == "1"


async def test_put_without_items_creates_nothing() -> None:
    """§10 put: no items, `+0`, no queue."""
    harness = await started()
    assert await TextClient(harness).send(b"put q:\n\n") == b"+0\n"
    assert "q" not in harness.service.collection.queues


async def test_put_expiry_is_relative_milliseconds() -> None:
    """§10 put: `put <q> <exp_ms>:` expires the items that many ms from now."""
    harness = await started()
    client = TextClient(harness)
    assert await client.send(b"put q 1500:\nx\n\n") == b"+1\n"
    harness.clock.advance(1.4)
    assert await client.send(b"peek q\n") == b":x\n"
    harness.clock.advance(0.2)
    assert await client.send(b"peek q\n") == b"*\n"


async def test_put_reencodes_latin1_as_utf8() -> None:
    """§10: items are re-encoded ISO-8859-1 to UTF-8, so a memcache reader sees two bytes."""
    harness = await started()
    assert await TextClient(harness).send(b"put q:\n\xe9\n\n") == b"+1\n"
    assert await harness.client().send(b"get q\r\n") == value("q", b"\xc3\xa9")


async def test_put_errors() -> None:
    """§10 put: `-Queue name required.`, `-Error parsing expiration time.`; nothing stored."""
    harness = await started()
    client = TextClient(harness)
    assert await client.send(b"put:\nx\n\n") == b"-Queue name required.\n"
    assert await client.send(b"put q soon:\nx\n\n") == b"-Error parsing expiration time.\n"
    assert "q" not in harness.service.collection.queues


async def test_put_illegal_queue_name_closes() -> None:
    """§8.1: creating `a.b` throws; Kestrel's text handler does not catch it."""
    harness = await started()
    assert await TextClient(harness).send(b"put a.b:\nx\n\n") == CLOSED


# --- get ----------------------------------------------------------------------------------------


async def test_get_opens_a_read_and_the_next_get_confirms_it() -> None:
    """§10 get: confirms all open reads on q, then opens one."""
    harness = await started()
    client = TextClient(harness)
    await client.send(b"put q:\na\nb\n\n")
    assert await client.send(b"get q\n") == b":a\n"
    assert open_reads(harness) == 1
    assert await client.send(b"get q\n") == b":b\n"
    assert open_reads(harness) == 1  # a was confirmed
    assert await client.send(b"get q\n") == b"*\n"
    assert open_reads(harness) == 0


async def test_get_open_read_is_aborted_on_disconnect() -> None:
    """§10: all fetches are transactional; a disconnect aborts (item back at the head)."""
    harness = await started()
    client = TextClient(harness)
    await client.send(b"put q:\na\nb\n\n")
    assert await client.send(b"get q\n") == b":a\n"
    client.disconnect()
    assert await TextClient(harness).send(b"get q\n") == b":a\n"


async def test_get_waits_for_an_item() -> None:
    """§10 get `<timeout_ms>`: waits for an add."""
    harness = await started()
    reader = TextClient(harness)
    task = reader.start(b"get q 2000\n")
    await wait_until(lambda: "q" in harness.service.collection.queues)
    await wait_until(lambda: harness.service.collection.queues["q"].waiter_count == 1)
    assert await TextClient(harness).send(b"put q:\nlate\n\n") == b"+1\n"
    assert await asyncio.wait_for(task, 2) == b":late\n"


async def test_get_times_out_with_no_item() -> None:
    """§10 get: `*` after the timeout."""
    harness = await started()
    assert await TextClient(harness).send(b"get q 50\n") == b"*\n"


async def test_get_errors() -> None:
    """§10 get: `-Queue name required.`, `-Error parsing timeout.`."""
    client = TextClient(await started())
    assert await client.send(b"get\n") == b"-Queue name required.\n"
    assert await client.send(b"get q x\n") == b"-Error parsing timeout.\n"


async def test_get_counts_cmd_get_and_hits() -> None:
    """§6: a text get is a GET fetch (cmd_get) with a hit or a miss."""
    harness = await started()
    client = TextClient(harness)
    await client.send(b"put q:\na\n\n")
    await client.send(b"get q\n")
    await client.send(b"get q\n")
    stats = stats_dict(await harness.client().send(b"stats\r\n"))
    assert (stats["cmd_get"], stats["get_hits"], stats["get_misses"]) == ("2", "1", "1")


# --- peek ---------------------------------------------------------------------------------------


async def test_peek_confirms_open_reads_then_shows_the_head() -> None:
    """§10 peek: also confirms all open reads on q first; `:<item>` / `*`."""
    harness = await started()
    client = TextClient(harness)
    await client.send(b"put q:\na\nb\n\n")
    assert await client.send(b"get q\n") == b":a\n"
    assert await client.send(b"peek q\n") == b":b\n"
    assert open_reads(harness) == 0
    client.disconnect()  # Nothing to abort: a was confirmed by the peek.
    reader = TextClient(harness)
    assert await reader.send(b"peek q\n") == b":b\n"
    assert await reader.send(b"get q\n") == b":b\n"
    assert await reader.send(b"peek q\n") == b"*\n"


async def test_peek_errors() -> None:
    client = TextClient(await started())
    assert await client.send(b"peek\n") == b"-Queue name required.\n"
    assert await client.send(b"peek q 1x\n") == b"-Error parsing timeout.\n"


# --- monitor ------------------------------------------------------------------------------------


async def test_monitor_streams_up_to_max_open_transactions() -> None:
    """§10 monitor: confirms, then `:<item>`… `*` (≤ maxOpenTransactions items)."""
    harness = await started(server={"max_open_transactions": 2})
    client = TextClient(harness)
    await client.send(b"put q:\na\nb\nc\n\n")
    assert await client.send(b"monitor q 100\n") == b":a\n:b\n*\n"
    assert open_reads(harness) == 2
    assert await client.send(b"monitor q 100\n") == b":c\n*\n"  # a and b confirmed first
    assert open_reads(harness) == 1


async def test_monitor_default_config_yields_one_item() -> None:
    """§10 monitor with maxOpenTransactions 1."""
    client = TextClient(await started())
    await client.send(b"put q:\na\nb\n\n")
    assert await client.send(b"monitor q 100\n") == b":a\n*\n"


async def test_monitor_zero_ends_at_once() -> None:
    client = TextClient(await started())
    await client.send(b"put q:\na\n\n")
    assert await client.send(b"monitor q 0\n") == b"*\n"


async def test_monitor_errors() -> None:
    """§10 monitor: `-Queue name & timeout required.`; a non-integer timeout closes."""
    client = TextClient(await started())
    assert await client.send(b"monitor q\n") == b"-Queue name & timeout required.\n"
    assert await client.send(b"monitor q soon\n") == CLOSED


# --- confirm ------------------------------------------------------------------------------------


async def test_confirm_echoes_the_count() -> None:
    """§10 confirm: `+<n>` when n reads were open."""
    harness = await started(server={"max_open_transactions": 3})
    client = TextClient(harness)
    await client.send(b"put q:\na\nb\nc\n\n")
    assert await client.send(b"monitor q 100\n") == b":a\n:b\n:c\n*\n"
    assert await client.send(b"confirm q 2\n") == b"+2\n"
    assert open_reads(harness) == 1
    client.disconnect()
    assert await TextClient(harness).send(b"get q\n") == b":c\n"


async def test_confirm_more_than_open_confirms_nothing() -> None:
    """§10 confirm: `-Not that many transactions open.` (also for 0)."""
    harness = await started()
    client = TextClient(harness)
    await client.send(b"put q:\na\n\n")
    await client.send(b"get q\n")
    assert await client.send(b"confirm q 2\n") == b"-Not that many transactions open.\n"
    assert await client.send(b"confirm q 0\n") == b"-Not that many transactions open.\n"
    assert open_reads(harness) == 1
    assert await client.send(b"confirm q 1\n") == b"+1\n"


async def test_confirm_errors() -> None:
    """§10 confirm: `-Queue name & count required.`; a non-integer count closes."""
    client = TextClient(await started())
    assert await client.send(b"confirm q\n") == b"-Queue name & count required.\n"
    assert await client.send(b"confirm q x\n") == CLOSED


# --- flush, delete, shutdown --------------------------------------------------------------------


async def test_flush_and_delete_reply_zero() -> None:
    """§10 flush, delete: `+0`."""
    harness = await started()
    client = TextClient(harness)
    await client.send(b"put q:\na\n\n")
    assert await client.send(b"flush q\n") == b"+0\n"
    assert await client.send(b"get q\n") == b"*\n"
    assert await client.send(b"delete q\n") == b"+0\n"
    assert "q" not in harness.service.collection.queues
    assert await client.send(b"delete never\n") == b"+0\n"
    assert await client.send(b"flush\n") == b"-Queue name required.\n"
    assert await client.send(b"delete\n") == b"-Queue name required.\n"


async def test_shutdown_replies_zero_and_stops_the_server() -> None:
    """§10 shutdown: `+0`; the server is asked to stop."""
    harness = await started()
    assert await TextClient(harness).send(b"shutdown\n") == b"+0\n"
    assert harness.shutdowns == 1


# --- status, version, quit, unknown -------------------------------------------------------------


async def test_status_reads_and_sets() -> None:
    """§10 status: `:UP` / `+0`."""
    harness = await started()
    client = TextClient(harness)
    assert await client.send(b"status\n") == b":UP\n"
    assert await client.send(b"status readonly\n") == b"+0\n"
    assert await client.send(b"status\n") == b":READONLY\n"
    assert await harness.client().send(b"status\r\n") == b"READONLY\r\n"
    assert await client.send(b"status WriteAvoid\n") == b"+0\n"
    assert await client.send(b"status\n") == b":WRITEAVOID\n"


async def test_status_errors() -> None:
    """§10 status: `-Unknown status.`, `-Status forbidden.`."""
    client = TextClient(await started())
    assert await client.send(b"status sideways\n") == b"-Unknown status.\n"
    assert await client.send(b"status down\n") == b"-Status forbidden.\n"
    assert await client.send(b"status\n") == b":UP\n"


async def test_status_not_configured() -> None:
    """§10 status: `-Server status not configured.`, for reading and setting."""
    client = TextClient(await started(server={"status_enabled": False}))
    assert await client.send(b"status\n") == b"-Server status not configured.\n"
    assert await client.send(b"status up\n") == b"-Server status not configured.\n"
    assert await client.send(b"status down\n") == b"-Server status not configured.\n"


async def test_version() -> None:
    """§10 version: `:<version>`."""
    client = TextClient(await started(server={"version": "2.4.8"}))
    assert await client.send(b"version\n") == b":2.4.8\n"


async def test_quit_closes_without_a_reply_and_aborts() -> None:
    """§10 quit: connection closed; its open read goes back."""
    harness = await started()
    client = TextClient(harness)
    await client.send(b"put q:\na\n\n")
    assert await client.send(b"get q\nquit\nversion\n") == b":a\n" + CLOSED
    assert await TextClient(harness).send(b"get q\n") == b":a\n"


async def test_unknown_command_keeps_the_connection() -> None:
    """§10 anything else: `-Unknown command: <cmd>` (stays open)."""
    client = TextClient(await started())
    assert await client.send(b"SET q 0 0 1\n") == b"-Unknown command: set\n"
    assert await client.send(b"version\n") == b":2.4.1\n"


# --- status refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_bytes", "operation"),
    [
        (b"put q:\nx\n\n", b"setItem"),
        (b"flush q\n", b"flush"),
        (b"delete q\n", b"delete"),
    ],
)
async def test_read_only_refuses_writes_and_keeps_the_connection(
    request_bytes: bytes, operation: bytes
) -> None:
    """§10 status refusals: `-Server not available for operation <op>`, connection stays."""
    client = TextClient(await started(server={"default_status": ServerStatus.READONLY}))
    reply = await client.send(request_bytes)
    assert reply == b"-Server not available for operation " + operation + b"\n"
    assert await client.send(b"get q\n") == b"*\n"


@pytest.mark.parametrize(
    ("request_bytes", "operation"),
    [(b"get q\n", b"getItem"), (b"peek q\n", b"getItem"), (b"monitor q 10\n", b"monitorUntil")],
)
async def test_quiescent_refuses_reads(request_bytes: bytes, operation: bytes) -> None:
    """§10 status refusals for fetches; confirm and version still work."""
    client = TextClient(await started(server={"default_status": ServerStatus.QUIESCENT}))
    reply = await client.send(request_bytes)
    assert reply == b"-Server not available for operation " + operation + b"\n"
    assert await client.send(b"confirm q 1\n") == b"-Not that many transactions open.\n"


async def test_put_without_items_is_not_refused() -> None:
    """§10: the status is checked per item, so an empty put answers `+0` even when read-only."""
    client = TextClient(await started(server={"default_status": ServerStatus.READONLY}))
    assert await client.send(b"put q:\n\n") == b"+0\n"


async def test_connection_limit_refuses_writes() -> None:
    """§7: a connection opened past connectionLimitRefuseWrites refuses writes for life."""
    harness = await started(server={"connection_limit_refuse_writes": 1})
    first = TextClient(harness)
    second = TextClient(harness)
    assert await first.send(b"put q:\na\n\n") == b"+1\n"
    assert await second.send(b"put q:\na\n\n") == b"-Server not available for operation setItem\n"


# --- one set of queues for every protocol -------------------------------------------------------


async def test_text_and_memcache_share_queues_and_stats() -> None:
    """All protocols see the same queues and count in the same connection stats."""
    harness = await started()
    memcache = harness.client()
    text = TextClient(harness)
    assert await memcache.send(set_request("q", b"from-memcache")) == b"STORED\r\n"
    assert await text.send(b"get q\n") == b":from-memcache\n"
    assert await text.send(b"put q:\nfrom-text\n\n") == b"+1\n"
    assert await memcache.send(b"get q\r\n") == value("q", b"from-text")
    stats = stats_dict(await memcache.send(b"stats\r\n"))
    assert stats["curr_connections"] == "2"
    assert stats["queue_q_open_transactions"] == "1"  # the text get's read on a
