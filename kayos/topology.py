"""The cluster topology: which nodes exist, and each shard's chain (docs/node-api.md).

Pure data and pure functions. A static file gives the topology today; the cluster manager will
publish the same structure with a higher epoch when it changes a chain.

A shard's chain is ``chain`` (head first) optionally followed by ``fanout``: when ``fanout`` is
given, the last node of ``chain`` feeds every node of it and those are the shard's tails;
otherwise the last node of ``chain`` is the single tail. With one node and no fanout the head is
also the tail (replication factor 1).
"""

from __future__ import annotations

import json
import tomllib
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kayos import limits, tlsconfig
from kayos.errors import InvalidRequest
from kayos.identity import ClusterIdentity

Role = Literal["head", "middle", "tail"]


@dataclass(frozen=True, slots=True)
class NodeAddr:
    id: str
    host: str
    http_port: int
    bin_port: int

    @property
    def http_url(self) -> str:
        return f"{tlsconfig.scheme()}://{self.host}:{self.http_port}"


@dataclass(frozen=True, slots=True)
class ShardChain:
    id: int
    chain: tuple[str, ...]
    fanout: tuple[str, ...] = ()

    @property
    def head(self) -> str:
        return self.chain[0]

    @property
    def tails(self) -> tuple[str, ...]:
        return self.fanout if self.fanout else (self.chain[-1],)

    @property
    def members(self) -> tuple[str, ...]:
        return self.chain + self.fanout

    def role_of(self, node: str) -> Role | None:
        """The node's role; a single-member chain's node is ``head`` (it is also the tail)."""
        if node == self.head:
            return "head"
        if node in self.tails:
            return "tail"
        if node in self.chain:
            return "middle"
        return None

    def upstream_of(self, node: str) -> str | None:
        if node in self.fanout:
            return self.chain[-1]
        position = self.chain.index(node) if node in self.chain else -1
        return self.chain[position - 1] if position > 0 else None

    def downstreams_of(self, node: str) -> tuple[str, ...]:
        if node not in self.chain:
            return ()
        position = self.chain.index(node)
        if position + 1 < len(self.chain):
            return (self.chain[position + 1],)
        return self.fanout

    def is_tail(self, node: str) -> bool:
        return node in self.tails


@dataclass(frozen=True, slots=True)
class Topology:
    epoch: int
    nodes: dict[str, NodeAddr]
    shards: dict[int, ShardChain] = field(default_factory=dict)
    # The cluster id and shared secret (kayos/identity.py); None in a file that has neither, which
    # then cannot replicate. Never part of ``to_json``: the HTTP face serves that to anyone.
    identity: ClusterIdentity | None = field(default=None, compare=False)
    # How many shards a queue spreads over (docs/node-api.md, "Queues over several shards"): the
    # cluster default and per-queue entries. The defaults mean one shard per queue.
    queue_shards: int = 1
    queues: dict[str, int] = field(default_factory=dict)
    # The cluster manager members' HTTP base URLs (docs/node-api.md, "Topology changes"), where
    # nodes and clients report a lost neighbour; empty: none known.
    managers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.epoch < 1:
            raise InvalidRequest("topology epoch must be >= 1")
        if not self.shards:
            raise InvalidRequest("topology has no shards")
        if sorted(self.shards) != list(range(len(self.shards))):
            raise InvalidRequest("shard ids must be 0 .. n-1")
        for node_id in self.nodes:
            check_node_id(node_id)
        for shard in self.shards.values():
            members = shard.members
            if not shard.chain or len(set(members)) != len(members):
                raise InvalidRequest(f"shard {shard.id}: a chain needs distinct members")
            for node in members:
                if node not in self.nodes:
                    raise InvalidRequest(f"shard {shard.id}: unknown node {node!r}")
        count = len(self.shards)
        for name, wanted in [("queue_shards", self.queue_shards), *self.queues.items()]:
            if type(wanted) is not int or not 1 <= wanted <= count:
                raise InvalidRequest(f"{name}: a queue's shard count must be 1 .. {count}")
        for name in self.queues:
            check_queue_name(name)
        if len(self.managers) > MANAGER_URLS_MAX:
            raise InvalidRequest(f"a topology names at most {MANAGER_URLS_MAX} manager members")
        for url in self.managers:
            if not (
                isinstance(url, str)
                and url.startswith(("http://", "https://"))
                and len(url) <= MANAGER_URL_CHARS_MAX
                and url.isprintable()
            ):
                raise InvalidRequest(f"managers: {url!r:.80} is not an http(s) URL")

    def shard_for(self, queue: str) -> int:
        """The queue's home shard, a stable hash of its name: its only shard when it has one."""
        return zlib.crc32(queue.encode()) % len(self.shards)

    def queue_shard_count(self, queue: str) -> int:
        """``S``: how many shards the queue spreads over."""
        return self.queues.get(queue, self.queue_shards)

    def shards_for(self, queue: str) -> tuple[int, ...]:
        """The queue's shards: ``S`` consecutive ones from its home shard (with rotated roles
        their heads are on consecutive nodes)."""
        home, count = self.shard_for(queue), len(self.shards)
        return tuple((home + i) % count for i in range(self.queue_shard_count(queue)))

    def shard_for_key(self, queue: str, key: bytes) -> int:
        """The shard an item key of ``queue`` goes to: every version of a key goes to one shard
        (de-dup and per-key order hold)."""
        shards = self.shards_for(queue)
        return shards[zlib.crc32(key) % len(shards)] if len(shards) > 1 else shards[0]

    def split_by_shard(self, queue: str, keys: Sequence[bytes]) -> dict[int, list[int]]:
        """The positions of ``keys`` by the shard each goes to, in shard order."""
        shards = self.shards_for(queue)
        if len(shards) == 1:
            return {shards[0]: list(range(len(keys)))}
        parts: dict[int, list[int]] = {}
        for index, key in enumerate(keys):
            parts.setdefault(shards[zlib.crc32(key) % len(shards)], []).append(index)
        return dict(sorted(parts.items()))

    def shard_for_batch(self, queue: str, keys: Sequence[bytes]) -> int:
        """The one shard a batch goes to; ``InvalidRequest`` if its keys span shards (a batch,
        and so a transaction, commits in one shard)."""
        shards = self.shards_for(queue)
        if len(shards) == 1 or not keys:
            return shards[0]
        found = {shards[zlib.crc32(key) % len(shards)] for key in keys}
        if len(found) > 1:
            raise InvalidRequest(
                f"the batch's keys span shards {sorted(found)} of queue {queue!r}: a batch "
                "commits in one shard (split it by Topology.shard_for_key)"
            )
        return found.pop()

    def queue_shard(self, queue: str, shard: int | None) -> int:
        """The shard a per-shard request (consume, a group's mark) means: ``shard`` if it is
        one of the queue's; None names the only shard of a one-shard queue."""
        shards = self.shards_for(queue)
        if shard is None:
            if len(shards) > 1:
                raise InvalidRequest(
                    f"queue {queue!r} has {len(shards)} shards {list(shards)}: name one (shard=)"
                )
            return shards[0]
        if shard not in shards:
            raise InvalidRequest(f"shard {shard} holds no part of queue {queue!r} {list(shards)}")
        return shard

    def chain_for(self, queue: str) -> ShardChain:
        return self.shards[self.shard_for(queue)]

    def shards_of(self, node: str) -> list[ShardChain]:
        return [shard for shard in self.shards.values() if node in shard.members]

    def to_json(self) -> dict[str, Any]:
        data = {
            "epoch": self.epoch,
            "nodes": {
                node.id: {"host": node.host, "http_port": node.http_port, "bin_port": node.bin_port}
                for node in self.nodes.values()
            },
            "shards": [
                {"id": shard.id, "chain": list(shard.chain), "fanout": list(shard.fanout)}
                for shard in self.shards.values()
            ],
        }
        # Only when set: an older topology's JSON (and so its MAC) stays byte for byte the same.
        if self.queue_shards != 1:
            data["queue_shards"] = self.queue_shards
        if self.queues:
            data["queues"] = {name: {"shards": count} for name, count in self.queues.items()}
        if self.managers:
            data["managers"] = list(self.managers)
        return data

    @classmethod
    def from_json(cls, data: Any) -> Topology:
        """Builds a topology from the JSON/TOML shape; any mistake is an ``InvalidRequest``."""
        try:
            nodes = {
                str(name): NodeAddr(
                    str(name), str(node["host"]), int(node["http_port"]), int(node["bin_port"])
                )
                for name, node in data["nodes"].items()
            }
            shards = {
                int(shard["id"]): ShardChain(
                    int(shard["id"]),
                    tuple(str(n) for n in shard["chain"]),
                    tuple(str(n) for n in shard.get("fanout", ())),
                )
                for shard in data["shards"]
            }
            identity = ClusterIdentity.from_data(data)
            queue_shards = data.get("queue_shards", 1)
            queues = {str(name): entry["shards"] for name, entry in data.get("queues", {}).items()}
            managers = manager_urls(data.get("managers", ()))
            return cls(int(data["epoch"]), nodes, shards, identity, queue_shards, queues, managers)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidRequest(f"bad topology: {exc!r}") from exc

    @classmethod
    def load(cls, path: str) -> Topology:
        with open(path, "rb") as f:
            raw = f.read()
        try:
            data = json.loads(raw) if path.endswith(".json") else tomllib.loads(raw.decode())
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            raise InvalidRequest(f"cannot parse topology file {path}: {exc}") from exc
        return cls.from_json(data)

    def with_identity(self, identity: ClusterIdentity | None) -> Topology:
        return Topology(
            self.epoch,
            self.nodes,
            self.shards,
            identity,
            self.queue_shards,
            self.queues,
            self.managers,
        )

    def dumps_toml(self) -> str:
        lines = [f"epoch = {self.epoch}"]
        if self.identity is not None:
            lines += self.identity.toml_lines()
        if self.queue_shards != 1:
            lines.append(f"queue_shards = {self.queue_shards}")
        lines.append("")
        for node in self.nodes.values():
            lines += [
                f'[nodes."{node.id}"]',
                f'host = "{node.host}"',
                f"http_port = {node.http_port}",
                f"bin_port = {node.bin_port}",
                "",
            ]
        for shard in self.shards.values():
            chain = ", ".join(f'"{n}"' for n in shard.chain)
            fanout = ", ".join(f'"{n}"' for n in shard.fanout)
            lines += ["[[shards]]", f"id = {shard.id}", f"chain = [{chain}]"]
            lines += [f"fanout = [{fanout}]", ""]
        for name, count in self.queues.items():
            lines += [f'[queues."{name}"]', f"shards = {count}", ""]
        return "\n".join(lines)


# A topology names at most this many manager members (limits.manager_members_max, checked again
# by the members' own tables), each URL at most this long.
MANAGER_URLS_MAX = limits.manager_members_max
MANAGER_URL_CHARS_MAX = 300


def manager_urls(raw: Any) -> tuple[str, ...]:
    """The members' URLs from a topology's ``managers``: a list of URLs (a signed topology), or
    the file's ``[managers."<id>"]`` tables (``host``, ``http_port``), read as
    ``http://host:http_port`` in id order."""
    if isinstance(raw, dict):
        return tuple(
            f"{tlsconfig.scheme()}://{table['host']}:{int(table['http_port'])}"
            for _, table in sorted(raw.items())
        )
    return tuple(str(url) for url in raw)


def rotated(
    nodes: list[NodeAddr], *, replicas: int, shard_count: int | None = None, epoch: int = 1
) -> Topology:
    """Virtual shards with rotated roles: shard i's chain starts at node i (S0: A->B->C,
    S1: B->C->A, ...), so every node is head of some shards and tail of others."""
    if not 1 <= replicas <= len(nodes):
        raise InvalidRequest(f"replicas must be 1 .. {len(nodes)}")
    count = len(nodes) if shard_count is None else shard_count
    ids = [node.id for node in nodes]
    shards = {
        i: ShardChain(i, tuple(ids[(i + k) % len(ids)] for k in range(replicas)))
        for i in range(count)
    }
    return Topology(epoch, {node.id: node for node in nodes}, shards)


def check_node_id(node_id: str) -> str:
    """Node ids: 1 to ``limits.node_id_bytes_max`` bytes of printable characters (they go into
    log lines and the handshake)."""
    if not node_id or len(node_id.encode(errors="replace")) > limits.node_id_bytes_max:
        raise InvalidRequest(
            f"bad node id {node_id[:200]!r}: 1 to {limits.node_id_bytes_max} bytes"
        )
    if not node_id.isprintable():
        raise InvalidRequest(f"bad node id {node_id[:200]!r}: printable characters only")
    return node_id


def check_queue_name(queue: str) -> str:
    """Queue names: 1-128 of ``A-Z a-z 0-9 _ - .``; '+' is kept for Kestrel fanout names."""
    # Characters first: then every character is one byte (and a lone surrogate cannot be encoded).
    if not all(c.isascii() and (c.isalnum() or c in "_-.+") for c in queue):
        raise InvalidRequest(f"bad queue name {queue[:200]!r}: use A-Z a-z 0-9 _ - . +")
    if not queue or len(queue) > limits.queue_name_bytes_max:
        raise InvalidRequest(
            f"bad queue name {queue[:200]!r}: 1 to {limits.queue_name_bytes_max} bytes"
        )
    return queue
