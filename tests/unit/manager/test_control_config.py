"""cluster.toml's manager tables (kayos/manager/member/config.py): what a member starts from, and
the mistakes refused before anything starts."""

from __future__ import annotations

import tomllib
from typing import Any

import pytest

from kayos.errors import InvalidRequest
from kayos.manager import Config, view_hash
from kayos.manager.member.config import (
    load,
    parse_config,
    parse_members,
    parse_setup,
)
from tests.support.answers import MEMBERS, cluster_text

pytestmark = pytest.mark.unit


def test_the_written_tables_read_back() -> None:
    config = Config(detection_window_ms=2_000, suspect_after_ms=700, min_replicas=3)
    setup = parse_setup(tomllib.loads(cluster_text(config)))
    assert list(setup.members) == MEMBERS
    assert setup.config == config
    assert setup.member("m2").raft_address == "127.0.0.1:7302"
    assert setup.member("m2").http_url == "http://127.0.0.1:7402"
    with pytest.raises(InvalidRequest, match="no manager member"):
        setup.member("m9")


def test_every_member_starts_from_the_same_first_view(tmp_path: Any) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text(cluster_text())
    first, second = load(str(path)).first_view(), load(str(path)).first_view()
    assert view_hash(first) == view_hash(second)
    assert [s.chain for s in first.shards] == [("a", "b", "c"), ("b", "c", "a"), ("c", "a", "b")]
    # No [manager] table: the defaults, the replication factor taken from the longest chain.
    assert first.config == Config(replication_factor=3)


def test_without_a_manager_table_the_defaults_hold() -> None:
    assert parse_config({}) == Config()


@pytest.mark.parametrize(
    ("table", "match"),
    [
        ({"detection_window_ms": 1_000, "suspect_after_ms": 1_000}, "suspect_after_ms"),
        ({"min_replicas": 0}, "min_replicas"),
        ({"detection_window": 5}, "unknown keys"),
        ({"slow_p99_ms": "250"}, "integer"),
        ({"slow_p99_ms": 2.5}, "integer"),
    ],
)
def test_bad_bounds_are_refused(table: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        parse_config({"manager": table})


@pytest.mark.parametrize(
    ("managers", "match"),
    [
        ({"m1": {"host": "127.0.0.1", "raft_port": 1}}, "missing http_port"),
        ({"m1": {"host": "127.0.0.1", "raft_port": 0, "http_port": 2}}, "raft_port"),
        ({"m1": {"host": "127.0.0.1", "raft_port": 1, "http_port": 1}}, "same"),
        (
            {
                "m1": {"host": "127.0.0.1", "raft_port": 1, "http_port": 2},
                "m2": {"host": "127.0.0.1", "raft_port": 2, "http_port": 3},
            },
            "same",
        ),
        ({"m1": {"host": "127.0.0.1", "raft_port": 1, "http_port": 2, "x": 1}}, "unknown"),
        ({"m1": "127.0.0.1:1"}, "table"),
        (
            {f"m{i}": {"host": "h", "raft_port": i + 1, "http_port": i + 100} for i in range(8)},
            "at most",
        ),
    ],
)
def test_bad_members_are_refused(managers: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidRequest, match=match):
        parse_members({"managers": managers})


def test_a_cluster_without_a_secret_or_members_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="secret"):
        parse_setup(tomllib.loads(cluster_text(secret=False)))
    data = tomllib.loads(cluster_text())
    del data["managers"]
    with pytest.raises(InvalidRequest, match="managers"):
        parse_setup(data)


def test_fanout_tails_are_refused() -> None:
    data = tomllib.loads(cluster_text())
    data["shards"][0]["chain"] = ["a", "b"]
    data["shards"][0]["fanout"] = ["c"]
    with pytest.raises(InvalidRequest, match="fanout"):
        parse_setup(data).first_view()
