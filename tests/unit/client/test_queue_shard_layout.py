"""Queues over several shards, the pure parts (docs/node-api.md, "Queues over several shards"):
which shards a queue uses, the key -> shard hash, the topology's new keys (absent = one shard per
queue, and an old topology's JSON unchanged), and how a batch splits."""

from __future__ import annotations

import dataclasses
import json
import random
import tomllib
import zlib

import pytest

from kayos.client.types import to_columns
from kayos.errors import InvalidRequest
from kayos.topology import NodeAddr, Topology, rotated

pytestmark = pytest.mark.unit

SEED = 13_001


def nodes(count: int) -> list[NodeAddr]:
    return [NodeAddr(chr(ord("a") + i), "127.0.0.1", 7100 + i, 7200 + i) for i in range(count)]


def topology(shards: int = 3, **queue_options: object) -> Topology:
    built = rotated(nodes(3), replicas=3, shard_count=shards)
    return dataclasses.replace(built, **queue_options)  # type: ignore[arg-type]


def test_without_the_new_keys_a_queue_has_its_one_home_shard() -> None:
    plain = topology()
    for name in ("orders", "a", "bench", "q-17"):
        assert plain.shards_for(name) == (zlib.crc32(name.encode()) % 3,)
        assert plain.shards_for(name) == (plain.shard_for(name),)
        assert plain.shard_for_key(name, b"any") == plain.shard_for(name)
    data = plain.to_json()
    assert "queue_shards" not in data, "an old topology's JSON is as it was"
    assert "queues" not in data
    assert Topology.from_json(json.loads(json.dumps(data))) == plain


def test_a_queue_uses_consecutive_shards_from_its_home_so_heads_rotate() -> None:
    spread = topology(shards=4, queues={"orders": 3})
    home = spread.shard_for("orders")
    assert spread.shards_for("orders") == tuple((home + i) % 4 for i in range(3))
    assert spread.shards_for("other") == (spread.shard_for("other"),)
    three = topology(shards=3, queue_shards=3)
    heads = {three.shards[shard].head for shard in three.shards_for("orders")}
    assert heads == {"a", "b", "c"}, "S = 3 on 3 rotated nodes: one head on each"


def test_the_key_hash_is_stable_and_spreads_keys() -> None:
    print(f"seed={SEED}")
    rng = random.Random(SEED)
    spread = topology(queue_shards=3)
    shards = spread.shards_for("orders")
    keys = [rng.randbytes(rng.randrange(1, 32)) for _ in range(3000)]
    counts = dict.fromkeys(shards, 0)
    for key in keys:
        shard = spread.shard_for_key("orders", key)
        assert shard == shards[zlib.crc32(key) % 3]
        assert spread.shard_for_key("orders", key) == shard, "the same key, the same shard"
        counts[shard] += 1
    assert all(count > 800 for count in counts.values()), counts


def test_queue_shard_counts_outside_one_to_n_are_refused() -> None:
    for bad in (0, 4, -1, True, "2"):
        with pytest.raises(InvalidRequest, match="shard count"):
            topology(queue_shards=bad)
        with pytest.raises(InvalidRequest, match="shard count"):
            topology(queues={"orders": bad})
    with pytest.raises(InvalidRequest, match="bad queue name"):
        topology(queues={"no spaces": 2})
    data = topology().to_json()
    data["queues"] = {"orders": {"shardz": 2}}
    with pytest.raises(InvalidRequest, match="bad topology"):
        Topology.from_json(data)


def test_the_new_keys_round_trip_through_json_and_toml() -> None:
    spread = topology(queue_shards=2, queues={"orders": 3, "logs": 1})
    data = spread.to_json()
    assert data["queue_shards"] == 2
    assert data["queues"] == {"orders": {"shards": 3}, "logs": {"shards": 1}}
    assert Topology.from_json(json.loads(json.dumps(data))) == spread
    assert Topology.from_json(tomllib.loads(spread.dumps_toml())) == spread
    assert spread.queue_shard_count("orders") == 3
    assert spread.queue_shard_count("logs") == 1
    assert spread.queue_shard_count("anything") == 2
    assert spread.with_identity(None).queues == spread.queues


def test_a_batch_splits_by_shard_and_one_batch_must_keep_to_one_shard() -> None:
    spread = topology(queues={"orders": 3})
    keys = [b"k%d" % i for i in range(60)]
    parts = spread.split_by_shard("orders", keys)
    assert sorted(parts) == sorted(spread.shards_for("orders"))
    assert sorted(i for indexes in parts.values() for i in indexes) == list(range(60))
    for shard, indexes in parts.items():
        assert indexes == sorted(indexes), "a key's order within its shard is kept"
        part = [keys[i] for i in indexes]
        assert spread.shard_for_batch("orders", part) == shard
    with pytest.raises(InvalidRequest, match="span shards"):
        spread.shard_for_batch("orders", keys)
    columns = to_columns([(key, b"v%d" % i, i) for i, key in enumerate(keys)])
    first = next(iter(parts.values()))
    picked = columns.pick(first)
    assert picked.keys == tuple(keys[i] for i in first)
    assert picked.expiries_ms == tuple(first)


def test_a_per_shard_request_must_name_one_of_the_queues_shards() -> None:
    spread = topology(shards=4, queues={"orders": 2})
    shards = spread.shards_for("orders")
    with pytest.raises(InvalidRequest, match="name one"):
        spread.queue_shard("orders", None)
    assert spread.queue_shard("orders", shards[1]) == shards[1]
    outside = next(s for s in range(4) if s not in shards)
    with pytest.raises(InvalidRequest, match="holds no part"):
        spread.queue_shard("orders", outside)
    assert spread.queue_shard("single", None) == spread.shard_for("single")
