"""The Kestrel front on a log whose retention floor is above where a reader starts
(docs/kestrel-compat.md §10, docs/retention.md "Below the floor"), on a real 3-node chain.

Under ``until_consumed`` the head raises a queue's floor to the lowest mark of the groups registered
when its retention tick runs; a group registered later, at a lower mark, does not lower it. The
tests force that order (they wait for the floor before registering the second group) instead of
hoping a tick falls between two commits: a read from below the floor must go on from the next
live entry, and a front must start and serve after it, as Kestrel does for items that are gone."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kayos.local.cluster import LocalCluster
from kayos.local.kestrel import KestrelFront
from kestrel_compat.backends.kayos_backend import KayosBackend, queue_for
from kestrel_compat.core.persistence import GroupState, NewEntry
from tests.support.cluster import wait_until

pytestmark = pytest.mark.integration


def run_backend(seed: str, call: Callable[[KayosBackend], Any]) -> Any:
    async def scenario() -> Any:
        backend = await KayosBackend.connect(seed)
        try:
            return await call(backend)
        finally:
            await backend.close()

    return asyncio.run(scenario())


def floor_of(seed: str, log: str) -> int:
    async def ask(backend: KayosBackend) -> int:
        reply = await backend.client.retention(queue_for(log))
        return int(reply.get("floor") or 0)

    return int(run_backend(seed, ask))


def test_a_group_registered_below_the_floor_reads_from_the_next_live_entry(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    """CI's failure of test_append_read_groups_and_recovery, in the order that fails: "jobs"
    confirms item one while it is the only group, the floor passes item one, and only then does
    "jobs+audit" register at 0."""
    cluster = start_cluster(nodes=3, replicas=3)
    seed = cluster.url(cluster.ids[0])

    async def first_part(backend: KayosBackend) -> list[int]:
        seqs = await backend.append(
            "jobs",
            [
                NewEntry(b"one", 1000, None, ("jobs",)),
                NewEntry(b"two", 1001, None, ("jobs", "jobs+audit")),
            ],
        )
        await backend.commit_group("jobs", "jobs", GroupState(seqs[0], b""))
        return seqs

    first, second = run_backend(seed, first_part)
    wait_until(lambda: floor_of(seed, "jobs") >= first, "the floor of k.jobs to pass item one")
    assert floor_of(seed, "jobs") == first  # "jobs" has not passed item two

    async def second_part(backend: KayosBackend) -> dict[str, Any]:
        await backend.commit_group("jobs", "jobs+audit", GroupState(0, b""))
        return {
            "from_zero": await backend.read("jobs", 0, 10),
            "from_first": await backend.read("jobs", first, 10),
            "audit": await backend.load_group("jobs", "jobs+audit"),
        }

    result = run_backend(seed, second_part)
    assert result["audit"] == GroupState(0, b"")  # registered below the floor, as in CI
    assert [(e.seq, e.value) for e in result["from_zero"]] == [(second, b"two")]
    assert [(e.seq, e.value) for e in result["from_first"]] == [(second, b"two")]
    assert floor_of(seed, "jobs") == first  # the late group pins item two


def test_a_front_starts_and_serves_after_a_queue_was_made_anew_below_its_floor(
    tmp_path: Path, start_cluster: Callable[..., LocalCluster]
) -> None:
    """Only the front's own calls: a queue is drained (its floor rises to its end) and deleted; a
    restarted front knows nothing of the log, so the queue made anew registers its group at 0,
    below the floor. The next start recovers from 0 and must serve, not fail."""
    memcache: Any = pytest.importorskip("memcache", reason="python-memcached is in the dev extra")
    cluster = start_cluster(nodes=3, replicas=3)
    seed = cluster.url(cluster.ids[0])
    front = KestrelFront(tmp_path / "front.log", cluster=seed)
    front.start()
    try:
        client = memcache.Client([front.address], dead_retry=0, socket_timeout=30)
        assert client.set("jobs", b"one")
        assert client.set("jobs", b"two")
        # Nothing is confirmed yet, so nothing is below the floor: the log holds both.
        stored = run_backend(seed, lambda backend: backend.read("jobs", 0, 10))
        assert [entry.value for entry in stored] == [b"one", b"two"]
        assert [client.get("jobs"), client.get("jobs")] == [b"one", b"two"]
        last = stored[-1].seq
        wait_until(lambda: floor_of(seed, "jobs") >= last, "the floor of k.jobs to pass both")
        assert client.delete("jobs")
        client.disconnect_all()
        front.stop()

        front.start()
        client = memcache.Client([front.address], dead_retry=0, socket_timeout=30)
        assert client.get("jobs") is None  # made anew, at mark 0
        client.disconnect_all()
        groups = run_backend(seed, lambda backend: backend.all_groups())
        assert ("jobs", "jobs") in groups
        state = run_backend(seed, lambda backend: backend.load_group("jobs", "jobs"))
        assert state is not None
        assert state.hwm < floor_of(seed, "jobs")
        front.stop()

        front.start()  # recovers k.jobs from mark 0, below its floor
        client = memcache.Client([front.address], dead_retry=0, socket_timeout=30)
        assert client.get("jobs") is None
        assert client.set("jobs", b"three")
        assert client.get("jobs") == b"three"
        client.disconnect_all()
    finally:
        front.stop()
