"""The manager's part of cluster.toml: ``[managers."<id>"]`` tables (one per member) and an
optional ``[manager]`` table of decision bounds (docs/manager.md, "cluster.toml"). Pure: parses
data, writes text; no I/O but ``load``."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from typing import Any

from kayos import limits, tlsconfig
from kayos.errors import InvalidRequest
from kayos.identity import ClusterIdentity
from kayos.manager import Config, ManagerView
from kayos.topology import Topology, check_node_id

__all__ = ["Config", "ManagerSetup", "MemberAddr", "load", "managers_toml", "parse_setup"]

CONFIG_KEYS = tuple(f.name for f in fields(Config))


@dataclass(frozen=True, slots=True)
class MemberAddr:
    """One manager member: where its Raft port and its HTTP face listen."""

    id: str
    host: str
    raft_port: int
    http_port: int

    @property
    def raft_address(self) -> str:
        return f"{self.host}:{self.raft_port}"

    @property
    def http_url(self) -> str:
        return f"{tlsconfig.scheme()}://{self.host}:{self.http_port}"


@dataclass(frozen=True, slots=True)
class ManagerSetup:
    """Everything a member needs from the file: the topology it starts from, the members, the
    bounds, and the cluster identity (the Raft password and the signing key)."""

    topology: Topology
    members: tuple[MemberAddr, ...]
    config: Config
    identity: ClusterIdentity

    def member(self, member_id: str) -> MemberAddr:
        for member in self.members:
            if member.id == member_id:
                return member
        raise InvalidRequest(f"no manager member {member_id!r} in the topology file")

    def first_view(self) -> ManagerView:
        """The view every member starts from: the file's nodes, chains and epoch."""
        shards = [self.topology.shards[i] for i in sorted(self.topology.shards)]
        if any(shard.fanout for shard in shards):
            raise InvalidRequest("the manager does not handle fanout tails: chains only")
        return ManagerView.bootstrap(
            self.config,
            list(self.topology.nodes),
            [shard.chain for shard in shards],
            epoch=self.topology.epoch,
        )


def parse_members(data: Any) -> tuple[MemberAddr, ...]:
    """The ``[managers."<id>"]`` tables, sorted by id; none is an empty tuple."""
    raw = data.get("managers", {}) if isinstance(data, dict) else None
    if not isinstance(raw, dict):
        raise InvalidRequest("bad topology: [managers] must be tables of members")
    if len(raw) > limits.manager_members_max:
        raise InvalidRequest(f"at most {limits.manager_members_max} manager members")
    members = []
    for member_id, table in sorted(raw.items()):
        check_node_id(str(member_id))
        if not isinstance(table, dict):
            raise InvalidRequest(f"manager {member_id!r}: expected a table")
        unknown = set(table) - {"host", "raft_port", "http_port"}
        if unknown:
            raise InvalidRequest(f"manager {member_id!r}: unknown keys {sorted(unknown)}")
        try:
            host = table["host"]
            raft_port, http_port = table["raft_port"], table["http_port"]
        except KeyError as exc:
            raise InvalidRequest(f"manager {member_id!r}: missing {exc.args[0]}") from exc
        if not isinstance(host, str) or not host:
            raise InvalidRequest(f"manager {member_id!r}: host must be a string")
        for name, port in (("raft_port", raft_port), ("http_port", http_port)):
            if type(port) is not int or not 0 < port < 65536:
                raise InvalidRequest(f"manager {member_id!r}: {name} must be 1..65535")
        members.append(MemberAddr(str(member_id), host, raft_port, http_port))
    used = [(m.host, p) for m in members for p in (m.raft_port, m.http_port)]
    if len(set(used)) != len(used):
        raise InvalidRequest("manager members: two ports are the same")
    return tuple(members)


def parse_config(data: Any) -> Config:
    """The ``[manager]`` table over the defaults; unknown keys and bounds that cannot work
    together are refused."""
    raw = data.get("manager", {}) if isinstance(data, dict) else None
    if not isinstance(raw, dict):
        raise InvalidRequest("bad topology: [manager] must be a table")
    unknown = set(raw) - set(CONFIG_KEYS)
    if unknown:
        raise InvalidRequest(f"[manager]: unknown keys {sorted(unknown)}; known: {CONFIG_KEYS}")
    for key, value in raw.items():
        if type(value) is not int:
            raise InvalidRequest(f"[manager] {key} must be an integer")
    return Config(**raw).validate()


def parse_setup(data: Any) -> ManagerSetup:
    topology = Topology.from_json(data)
    members = parse_members(data)
    if not members:
        raise InvalidRequest('the topology file has no [managers."<id>"] tables')
    if topology.identity is None or topology.identity.is_placeholder:
        raise InvalidRequest(
            "the manager needs the cluster secret (cluster_id and secret; run `kayos init`)"
        )
    return ManagerSetup(topology, members, parse_config(data), topology.identity)


def load_raw(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise InvalidRequest(f"cannot read topology file {path}: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InvalidRequest(f"cannot parse topology file {path}: {exc}") from exc


def load(path: str) -> ManagerSetup:
    return parse_setup(load_raw(path))


def members_from(path: str) -> tuple[MemberAddr, ...]:
    """The members listed in a topology file (none: an empty tuple), for ``kayos ctl``."""
    return parse_members(load_raw(path))


def managers_toml(members: list[MemberAddr], config: Config | None = None) -> str:
    """The tables ``parse_members`` and ``parse_config`` read, to append to a topology file."""
    lines: list[str] = []
    for member in members:
        lines += [
            f'[managers."{member.id}"]',
            f'host = "{member.host}"',
            f"raft_port = {member.raft_port}",
            f"http_port = {member.http_port}",
            "",
        ]
    if config is not None:
        lines.append("[manager]")
        lines += [f"{key} = {getattr(config, key)}" for key in CONFIG_KEYS]
        lines.append("")
    return "\n".join(lines)
