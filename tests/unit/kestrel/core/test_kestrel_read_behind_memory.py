"""Read-behind (docs/kestrel-compat.md §10): a queue keeps at most max_memory_size_bytes of items
in memory and pages the rest in from its log; FIFO order and reliable reads hold across the
boundary; stats count both parts; recovery keeps the bound. Memory backend, manual clock."""

from __future__ import annotations

import pytest

from kestrel_compat.wire.memcache_replies import END, STORED
from tests.support.kestrel import Harness, make_config, set_request, stats_dict, value

pytestmark = pytest.mark.unit

ITEM_BYTES = 10
BOUND = 100  # ten items in memory


def item(index: int) -> bytes:
    return b"item-%05d" % index


def harness() -> Harness:
    return Harness(make_config(default={"max_memory_size_bytes": BOUND}))


def memory_part(h: Harness, name: str = "q") -> tuple[int, int]:
    queue = h.service.collection.queues[name]
    return len(queue.items), queue.behind_items


@pytest.mark.asyncio
async def test_fifo_across_the_boundary_with_memory_bounded() -> None:
    h = await harness().start()
    client = h.client()
    for index in range(55):
        assert await client.send(set_request("q", item(index))) == STORED
    assert memory_part(h) == (10, 45)
    stats = stats_dict(await client.send(b"stats\r\n"))
    assert (stats["queue_q_items"], stats["queue_q_bytes"]) == ("55", "550")
    assert (stats["queue_q_mem_items"], stats["queue_q_mem_bytes"]) == ("10", "100")
    served = []
    most_in_memory = 0
    for _ in range(55):
        reply = await client.send(b"get q\r\n")
        served.append(reply)
        most_in_memory = max(most_in_memory, memory_part(h)[0])
    assert served == [value("q", item(index)) for index in range(55)]
    assert most_in_memory <= BOUND // ITEM_BYTES
    assert await client.send(b"get q\r\n") == END
    assert memory_part(h) == (0, 0)


@pytest.mark.asyncio
async def test_reliable_reads_across_the_boundary() -> None:
    h = await harness().start()
    client = h.client()
    for index in range(30):
        await client.send(set_request("q", item(index)))
    for index in range(9):
        assert await client.send(b"get q\r\n") == value("q", item(index))
    # Item 9 is the last one in memory; open it, abort it: back at the head.
    assert await client.send(b"get q/open\r\n") == value("q", item(9))
    assert await client.send(b"get q/abort\r\n") == END
    assert await client.send(b"get q/open\r\n") == value("q", item(9))
    # Confirmed while the next ones are paged in.
    assert await client.send(b"get q/close/open\r\n") == value("q", item(10))
    # A disconnect returns the open read to the head.
    client.disconnect()
    other = h.client()
    rest = [await other.send(b"get q/close/open\r\n") for _ in range(20)]
    assert rest == [value("q", item(index)) for index in range(10, 30)]
    assert await other.send(b"get q/close\r\n") == END
    assert await other.send(b"get q\r\n") == END


@pytest.mark.asyncio
async def test_adds_while_behind_stay_behind_and_keep_their_order() -> None:
    h = await harness().start()
    client = h.client()
    for index in range(20):
        await client.send(set_request("q", item(index)))
    served = [await client.send(b"get q\r\n") for _ in range(5)]
    for index in range(20, 40):
        await client.send(set_request("q", item(index)))
    served += [await client.send(b"get q\r\n") for _ in range(35)]
    assert served == [value("q", item(index)) for index in range(40)]


@pytest.mark.asyncio
async def test_recovery_keeps_the_bound_and_the_order() -> None:
    h = await harness().start()
    client = h.client()
    for index in range(50):
        await client.send(set_request("q", item(index)))
    for index in range(3):
        assert await client.send(b"get q\r\n") == value("q", item(index))
    restarted = await h.restart()
    assert memory_part(restarted) == (10, 37)
    again = restarted.client()
    rest = [await again.send(b"get q\r\n") for _ in range(47)]
    assert rest == [value("q", item(index)) for index in range(3, 50)]


@pytest.mark.asyncio
async def test_flush_drops_the_items_behind_and_a_restart_does_not_bring_them_back() -> None:
    h = await harness().start()
    client = h.client()
    for index in range(30):
        await client.send(set_request("q", item(index)))
    assert await client.send(b"flush q\r\n") == END
    assert memory_part(h) == (0, 0)
    assert await client.send(b"get q\r\n") == END
    restarted = await h.restart()
    assert await restarted.client().send(b"get q\r\n") == END


@pytest.mark.asyncio
async def test_fanout_children_page_only_their_own_items() -> None:
    h = await harness().start()
    client = h.client()
    assert await client.send(b"get q+c\r\n") == END  # the child exists from here on
    for index in range(25):
        await client.send(set_request("q", item(index)))
    for index in range(25, 30):
        await client.send(set_request("q+c", item(index)))
    master = [await client.send(b"get q\r\n") for _ in range(25)]
    child = [await client.send(b"get q+c\r\n") for _ in range(30)]
    assert master == [value("q", item(index)) for index in range(25)]
    assert child == [value("q+c", item(index)) for index in range(30)]
    assert await client.send(b"get q\r\n") == END


@pytest.mark.asyncio
async def test_a_bound_of_zero_keeps_one_item_in_memory() -> None:
    h = await Harness(make_config(default={"max_memory_size_bytes": 0})).start()
    client = h.client()
    for index in range(5):
        await client.send(set_request("q", item(index)))
    assert memory_part(h) == (1, 4)
    served = []
    for _ in range(5):
        served.append(await client.send(b"get q\r\n"))
        assert memory_part(h)[0] <= 1
    assert served == [value("q", item(index)) for index in range(5)]
    assert await client.send(b"get q\r\n") == END


@pytest.mark.asyncio
async def test_a_peek_and_a_waiting_get_see_items_that_are_behind() -> None:
    h = await Harness(make_config(default={"max_memory_size_bytes": 0})).start()
    client = h.client()
    for index in range(3):
        await client.send(set_request("q", item(index)))
    assert await client.send(b"get q\r\n") == value("q", item(0))
    assert memory_part(h)[0] == 1  # the refill after the remove
    assert await client.send(b"get q/peek\r\n") == value("q", item(1))
    assert await client.send(b"get q/t=10\r\n") == value("q", item(1))
    assert await client.send(b"get q/open\r\n") == value("q", item(2))
    assert await client.send(b"get q/abort\r\n") == END
    assert await client.send(b"get q/t=10\r\n") == value("q", item(2))
