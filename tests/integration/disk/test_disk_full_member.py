"""A full disk on a member below the head, with the manager running (docs/retention.md, "Disk full";
docs/manager.md, rule 9). Real nodes a>b>c, three real manager members; one member's data
directory is a small tmpfs that two acks=all producers fill. The member must not stall the shard:
the manager removes it (state ``full``, alert ``member_disk_full``), the producers go on through
the repaired chain (every error they see is counted by status, and none may come after the
splice), nothing acknowledged is lost (chaos checker), and once a person frees space (deletes a
ballast file) the node notices by itself, catches up and rejoins: ``kayos ctl status`` shows the
shard fully replicated again. The timeline is printed.

Needs root to mount the tmpfs; skipped (saying so) without it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from chaos.history import Produce
from kayos import limits
from kayos.client.sync import Client
from kayos.local.cluster import LocalCluster
from kayos.manager import Config
from tests.support import checked as heals
from tests.support.checked import answered_view, chain_of, node_states
from tests.support.cluster import WAIT_S, produce, small_disk, wait_until, write_ballast

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

QUEUE = "full"
# The member's tmpfs: its reserve, room for ROOM_BYTES of data (the node reports its disk full in
# the last disk_head_margin_bytes of it), and a ballast freed later (more than the manager's return
# margin beyond the reserve, so the node may come back at once).
ROOM_BYTES = limits.disk_head_margin_bytes + 8 * 1024 * 1024
BALLAST_BYTES = 2 * limits.manager_disk_return_margin_bytes
TMPFS_BYTES = limits.disk_reserve_bytes + ROOM_BYTES + BALLAST_BYTES
VALUE = "x" * 1000
BATCH = 20
# Producers stop after this many bytes if the disk never fills (a failure, not a hang).
PRODUCE_BYTES_MAX = 8 * TMPFS_BYTES
CONFIG = Config(detection_window_ms=3_000, suspect_after_ms=1_500)
# Acks each producer gets through the repaired chain before space is freed.
AFTER = 20
# The manager removes the full member within this of the node reporting it (a poll round and a
# Raft entry, ~0.2-0.5 s; generous for 2 shared cores) ...
REMOVAL_S = 5.0
# ... and calls in flight at the splice may fail (the head re-links: 503 unavailable, or a reset
# connection) within this after it; none later.
SPLICE_S = 2.0


@dataclass
class Producer(heals.Producer):
    """Batches of BATCH keys ``p<i>-<n>`` with acks=all to the head (``urls[0]``), each call
    recorded for the checker, with its status and when it ended."""

    calls: list[tuple[float, int]] = field(default_factory=list)  # (ended at, HTTP status)
    errors: list[tuple[float, int, str]] = field(default_factory=list)  # (ended at, status, what)
    sent_bytes: int = 0

    def _run(self, shared: Client | None = None) -> None:
        """Over HTTP to the head: a shared ``kayos.Client`` is not used."""
        n = 0
        while not self.stop.is_set() and self.sent_bytes < PRODUCE_BYTES_MAX:
            items = tuple((f"p{self.index}-{n + i:06d}", VALUE) for i in range(BATCH))
            n += BATCH
            op = self.index * 10_000_000 + n
            try:
                status, body = produce(self.urls[0], QUEUE, list(items))
            except OSError as exc:  # the reply never came: the outcome is unknown
                status, body = 0, {"error": {"message": str(exc)}}
            self.sent_bytes += BATCH * len(VALUE)
            self.calls.append((time.monotonic(), status))
            if status == 200:
                first, last = int(body["first_seq"]), int(body["last_seq"])
                self.history.append(Produce(op, QUEUE, items, False, "all", "ok", first, last))
            else:
                error = json.dumps(body)[:200]
                self.errors.append((self.calls[-1][0], status, error))
                self.history.append(Produce(op, QUEUE, items, False, "all", "unknown", error=error))

    def acks_after(self, since: float) -> int:
        return sum(1 for at, status in self.calls if status == 200 and at > since)


def disk_full_reported(cluster: LocalCluster, node: str) -> bool:
    status = cluster.status(node)
    if status is None:
        return False
    disk = status.get("disk") or {}
    shards = status["shards"].values()
    return bool(disk.get("full")) or any(s.get("disk_full") for s in shards)


def ctl_status(cluster: LocalCluster) -> tuple[int, dict[str, Any]]:
    command = [
        sys.executable,
        "-m",
        "kayos",
        "ctl",
        "status",
        "--json",
        "--cluster",
        cluster.url("a"),
        "--topology",
        str(cluster.topology_path),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=WAIT_S, check=False)
    return done.returncode, json.loads(done.stdout)


def alerts(cluster: LocalCluster) -> list[list[Any]]:
    """The manager leader's alerts, once it answers: no answer is not "no alert"."""
    return list(answered_view(cluster)["view"]["alerts"])


@pytest.mark.parametrize(("victim", "role"), [("b", "middle"), ("c", "tail")])
def test_a_full_member_leaves_the_chain_and_rejoins_once_space_is_freed(
    tmp_path: Path, victim: str, role: str
) -> None:
    base = tmp_path / "cluster"
    with small_disk(base / victim, TMPFS_BYTES) as mount_point:
        ballast = mount_point / "ballast"
        write_ballast(ballast, BALLAST_BYTES)
        with LocalCluster(
            base, nodes=3, replicas=3, shards=1, managers=3, manager_config=CONFIG
        ) as cluster:
            assert cluster.topology.shards[0].chain == ("a", "b", "c")
            remaining = [n for n in "abc" if n != victim]
            run_scenario(cluster, victim, role, remaining, ballast)


def run_scenario(
    cluster: LocalCluster, victim: str, role: str, remaining: list[str], ballast: Path
) -> None:
    timeline: list[str] = []
    began = time.monotonic()

    def mark(what: str) -> float:
        now = time.monotonic()
        timeline.append(f"{now - began:7.2f}s {what}")
        print(timeline[-1], flush=True)
        return now

    producers = [Producer(i, [cluster.url("a")]) for i in range(2)]
    for producer in producers:
        producer.start()
    try:
        full_at = wait_until(
            lambda: disk_full_reported(cluster, victim) and time.monotonic(),
            f"{victim}'s disk to fill",
            timeout_s=120,
        )
        mark(f"{victim} ({role}) reports its disk full")
        removed_at = wait_until(
            lambda: chain_of(cluster, 0) == remaining and time.monotonic(),
            f"the manager removing {victim}",
        )
        mark(f"{victim} spliced out: chain {remaining}")
        assert node_states(cluster)[victim] == "full"
        assert ["member_disk_full", 0, victim] in alerts(cluster)
        wait_until(
            lambda: all(p.acks_after(removed_at) >= AFTER for p in producers),
            "acks through the repaired chain",
        )
        mark(f"{AFTER} acks per producer through the repaired chain")
    finally:
        for producer in producers:
            producer.finish()
        for at, code, error in sorted(e for p in producers for e in p.errors):
            print(f"{at - began:7.2f}s a call failed: {code} {error}")
    statuses = Counter(status for p in producers for _, status in p.calls)
    late_errors = [
        (round(at - began, 2), status)
        for p in producers
        for at, status in p.calls
        if status != 200 and at > removed_at + SPLICE_S
    ]
    stalls = [
        b[0] - a[0]
        for p in producers
        for a, b in zip(p.calls, p.calls[1:], strict=False)
        if b[0] > full_at - 1.0
    ]
    mark(
        f"producer calls by status: {dict(statuses)}; longest gap between calls after the disk "
        f"filled {max(stalls, default=0):.2f}s"
    )

    # Nothing acknowledged is lost: every acked batch is on the remaining tail.
    heals.check_nothing_lost(cluster, remaining[-1], list(producers), QUEUE)

    # A person frees space; the node notices by itself, catches up and rejoins as tail.
    ballast.unlink()
    freed = mark("ballast deleted")
    wait_until(
        lambda: chain_of(cluster, 0) == [*remaining, victim], f"{victim} rejoining", timeout_s=90
    )
    rejoined = mark(f"{victim} rejoined: chain {[*remaining, victim]}")
    wait_until(lambda: not alerts(cluster), "the manager's alerts to clear")

    def healthy() -> bool:
        code, summary = ctl_status(cluster)
        shard = summary["shards"][0]
        return code == 0 and shard["fully_replicated"] and len(shard["chain"]) == 3

    wait_until(healthy, "kayos ctl status to show full replication")
    mark("kayos ctl status: healthy, fully replicated")
    print("\n".join(timeline))
    print(
        f"removed {removed_at - full_at:.2f}s after the disk was reported full; rejoined "
        f"{rejoined - freed:.2f}s after space was freed"
    )
    # Producers saw at most the stall the removal takes: no error after the splice, no call held
    # up to the commit timeout (504), no long gap.
    assert removed_at - full_at < REMOVAL_S
    assert not late_errors, late_errors
    assert 504 not in statuses, statuses
    assert max(stalls, default=0) < REMOVAL_S + SPLICE_S
