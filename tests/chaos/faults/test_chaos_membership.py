"""The deterministic parts of the campaign's membership faults (chaos/procs/membership.py): the
split-brain monitor's judgement from canned status replies, store damage, and the schedule of
the new kinds. The faults themselves run against real processes in
tests/chaos/campaigns/test_chaos_campaign.py."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from chaos.procs import faults, membership
from kayos.local.cluster import LocalCluster

pytestmark = pytest.mark.chaos


@dataclass
class FakeCluster:
    """What the monitor reads of a cluster: ids, running, status (no manager members)."""

    replies: dict[str, dict[str, Any] | None] = field(default_factory=dict)
    ids: list[str] = field(default_factory=lambda: ["a", "b", "c"])
    manager_members: list[Any] = field(default_factory=list)

    def running(self, node: str) -> bool:
        return node in self.replies

    def status(self, node: str) -> dict[str, Any] | None:
        return self.replies.get(node)


def node(epoch: int, **roles: str) -> dict[str, Any]:
    return {"epoch": epoch, "shards": {s.lstrip("s"): {"role": r} for s, r in roles.items()}}


def monitor_of(fake: FakeCluster) -> membership.HeadMonitor:
    return membership.HeadMonitor(cast(LocalCluster, fake))


def test_heads_of_one_shard_at_different_epochs_are_no_split_brain() -> None:
    fake = FakeCluster({"a": node(1, s0="head"), "b": node(1, s0="middle")})
    monitor = monitor_of(fake)
    monitor.observe()
    fake.replies = {"a": None, "b": node(2, s0="head")}  # a paused, b took over at epoch 2
    monitor.observe()
    fake.replies = {"a": node(1, s0="head"), "b": node(2, s0="head")}  # a resumes, stale
    monitor.observe()
    assert monitor.violations == []
    assert monitor.heads == {(0, 1): {"a"}, (0, 2): {"b"}}


def test_two_heads_of_one_shard_at_one_epoch_is_split_brain() -> None:
    fake = FakeCluster({"a": node(3, s0="head", s1="tail"), "b": node(3, s0="head")})
    monitor = monitor_of(fake)
    monitor.observe()
    monitor.observe()  # reported once
    assert [v["property"] for v in monitor.violations] == ["split_brain"]
    assert "shard 0 epoch 3" in monitor.violations[0]["message"]


def test_a_head_the_managers_chain_at_that_epoch_does_not_name_is_split_brain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    view = {"epoch": 4, "shards": [{"id": 0, "chain": ["b", "c"], "catching_up": []}]}
    monkeypatch.setattr(membership, "manager_view", lambda _cluster: view)
    fake = FakeCluster({"a": node(4, s0="head"), "b": node(3, s0="head")})
    fake.manager_members = ["m1"]
    monitor = monitor_of(fake)
    monitor.observe()
    assert len(monitor.violations) == 1
    assert "node a head of shard 0 at epoch 4" in monitor.violations[0]["message"]


def store_dir(tmp_path: Path, size: int) -> Path:
    store = tmp_path / "node" / "shards" / "0"
    store.mkdir(parents=True)
    (store / "data.1.kys").write_bytes(bytes(size))
    return tmp_path / "node"


def test_bit_flips_change_a_few_bits_and_keep_the_length(tmp_path: Path) -> None:
    seed = 11
    print(f"seed {seed}")
    data = store_dir(tmp_path, 4096)
    done = membership.damage_stores(data, random.Random(seed), "bit_flips")
    content = (data / "shards" / "0" / "data.1.kys").read_bytes()
    assert len(content) == 4096
    changed = [i for i, b in enumerate(content) if b]
    assert changed
    assert set(changed) <= set(done[0]["flipped"])


def test_truncation_cuts_the_file_short(tmp_path: Path) -> None:
    seed = 12
    print(f"seed {seed}")
    data = store_dir(tmp_path, 4096)
    done = membership.damage_stores(data, random.Random(seed), "truncate")
    size = (data / "shards" / "0" / "data.1.kys").stat().st_size
    assert 1 <= size < 4096
    assert done[0]["truncated_to"] == size


def test_the_schedule_draws_every_new_kind_with_a_bounded_hold() -> None:
    seed = 5
    print(f"seed {seed}")
    drawn = [f for f, _ in zip(faults.schedule(seed, ["a", "b", "c"]), range(2_000), strict=False)]
    kinds = {f.kind for f in drawn}
    assert kinds == set(faults.KINDS)
    for fault in drawn:
        if fault.kind in membership.HANDLERS or fault.kind == "corrupt_down":
            assert 0 <= fault.hold_s <= faults.down_s_max
    assert set(membership.HANDLERS) >= faults.MANAGER_KINDS - faults.SPARE_KINDS
