"""The Kestrel front's Kayos backend against a real 3-node chain: items durable on the chain,
group state replicated, recovery reads from a tail."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from kayos.local.cluster import LocalCluster
from kestrel_compat.backends.kayos_backend import KayosBackend, log_for, queue_for
from kestrel_compat.core.persistence import GroupState, NewEntry
from tests.support.cluster import wait_until

pytestmark = pytest.mark.integration


def test_names_round_trip() -> None:
    for log in ("jobs", "jobs+audit", "we ird/name", "é"):
        assert log_for(queue_for(log)) == log
    assert log_for("plain") is None


def test_append_read_groups_and_recovery(start_cluster: Callable[..., LocalCluster]) -> None:
    cluster = start_cluster(nodes=3, replicas=3)
    seed = cluster.url(cluster.ids[0])

    async def scenario() -> dict[str, Any]:
        backend = await KayosBackend.connect(seed)
        try:
            seqs = await backend.append(
                "jobs",
                [
                    NewEntry(b"one", 1000, None, ("jobs",)),
                    NewEntry(b"two", 1001, 5_000_000_000_000, ("jobs", "jobs+audit")),
                ],
            )
            # "jobs+audit" registers before "jobs" passes item one. The log's `until_consumed`
            # floor is the lowest mark of the groups registered when the head's retention tick
            # runs (every 200 ms), so "jobs" alone at seqs[0] lets item one go whenever a tick
            # falls between the two commits, and reading from 0 would then start at item two
            # (test_kestrel_retention_floor.py forces that order).
            await backend.commit_group("jobs", "jobs+audit", GroupState(0, b""))
            await backend.commit_group("jobs", "jobs", GroupState(seqs[0], b"\x01\x00\x00\x00\x00"))
            read = await backend.read("jobs", 0, 10)
            after_first = await backend.read("jobs", seqs[0], 10)
            state = await backend.load_group("jobs", "jobs")
            missing = await backend.load_group("jobs", "nobody")
            logs = await backend.list_logs()
            groups = await backend.list_groups("jobs")
            last = await backend.last_seq("jobs")
            await backend.delete_group("jobs", "jobs+audit")
            groups_after = await backend.list_groups("jobs")
        finally:
            await backend.close()
        return {
            "seqs": seqs,
            "read": read,
            "after_first": after_first,
            "state": state,
            "missing": missing,
            "logs": logs,
            "groups": groups,
            "last": last,
            "groups_after": groups_after,
        }

    result = asyncio.run(scenario())
    first, second = result["seqs"]
    assert second == first + 1
    assert [(e.seq, e.value, e.add_ms, e.expiry_ms, e.groups) for e in result["read"]] == [
        (first, b"one", 1000, None, ("jobs",)),
        (second, b"two", 1001, 5_000_000_000_000, ("jobs", "jobs+audit")),
    ]
    assert [e.value for e in result["after_first"]] == [b"two"]
    assert result["state"] == GroupState(first, b"\x01\x00\x00\x00\x00")
    assert result["missing"] is None
    assert result["logs"] == ["jobs"]
    assert result["groups"] == ["jobs", "jobs+audit"]
    assert result["last"] >= second
    assert result["groups_after"] == ["jobs"]


def test_consumed_items_are_reclaimed_by_until_consumed_retention(
    start_cluster: Callable[..., LocalCluster],
) -> None:
    """The first append to a log sets `until_consumed` on its queue (a policy already set is
    kept), and a confirmed removal raises the queue's retention floor past the item."""
    cluster = start_cluster(nodes=3, replicas=3)
    seed = cluster.url(cluster.ids[0])

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], int]:
        backend = await KayosBackend.connect(seed)
        try:
            await backend.client.set_retention(queue_for("aged"), {"max_age_ms": 3_600_000})
            await backend.append("aged", [NewEntry(b"x", 1000, None, ("aged",))])
            seqs = await backend.append(
                "jobs",
                [NewEntry(b"one", 1000, None, ("jobs",)), NewEntry(b"two", 1001, None, ("jobs",))],
            )
            # Kestrel confirmed the first item only.
            await backend.commit_group("jobs", "jobs", GroupState(seqs[0], b""))
            jobs = await backend.client.retention(queue_for("jobs"))
            aged = await backend.client.retention(queue_for("aged"))
        finally:
            await backend.close()
        return jobs, aged, seqs[0]

    jobs, aged, confirmed = asyncio.run(scenario())
    assert jobs["policy"] == {"until_consumed": True}
    assert aged["policy"] == {"max_age_ms": 3_600_000}

    def floor() -> int:
        async def ask() -> int:
            backend = await KayosBackend.connect(seed)
            try:
                reply = await backend.client.retention(queue_for("jobs"))
            finally:
                await backend.close()
            return int(reply.get("floor") or 0)

        return asyncio.run(ask())

    wait_until(lambda: floor() >= confirmed, "the floor of k.jobs to pass the confirmed item")
    assert floor() == confirmed  # never past the unconfirmed item (no group has passed it)
