"""The reference pages the documentation site generates from the code (kayos/cli/reference/):
every bound, configuration key, metric, port and exception class the code has is on its page, so
a new one appears there without anyone editing a page."""

from __future__ import annotations

import ast
import tomllib
import types
from pathlib import Path
from typing import Any

import pytest

from kayos import errors, limits
from kayos.cli.reference import config_page, errors_tree, metrics_page, ports_page
from kayos.cli.reference.limits_page import bounds, unit_of
from kayos.errors import KayosError
from kayos.identity import ClusterIdentity
from kayos.manager.member.config import Config, MemberAddr, managers_toml
from kayos.topology import NodeAddr, ShardChain, Topology
from kestrel_compat import limits as kestrel_limits

pytestmark = pytest.mark.unit


def public_names(module: types.ModuleType) -> list[str]:
    """The module's own public names: not imports, not ``from __future__`` features."""
    return [
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and type(value).__module__ != "__future__"
    ]


@pytest.fixture(scope="module")
def configuration() -> str:
    return config_page.render()


@pytest.mark.parametrize("module", [limits, kestrel_limits], ids=lambda m: m.__name__)
def test_every_bound_of_a_limits_module_is_on_the_configuration_page(
    module: types.ModuleType, configuration: str
) -> None:
    names = public_names(module)
    assert len(names) > 20, names
    missing = [name for name in names if f"| `{name}` |" not in configuration]
    assert not missing, f"bounds missing from the Configuration page: {missing}"


@pytest.mark.parametrize("module", ["kayos.limits", "kestrel_compat.limits"])
def test_every_bound_has_a_value_a_unit_and_the_reason_above_it(module: str) -> None:
    found = bounds(module)
    assert [b.name for b in found if not b.reason or not b.unit] == []
    by_name = {b.name: b for b in found}
    if module == "kayos.limits":
        key = by_name["key_bytes_max"]
        assert (key.value, key.unit) == (384, "bytes")
        assert "lmdb keys are limited to 511 bytes" in key.reason
        assert key.section == "items"
        # A bound with no comment of its own shares the one of the bound just above it.
        assert by_name["batch_bytes_max"].reason == by_name["batch_entries_max"].reason


def test_a_bounds_unit_is_the_last_word_of_its_name_before_its_kind() -> None:
    assert unit_of("peer_silence_ms_max", 3000) == "milliseconds"
    assert unit_of("chunk_bytes_max", 1) == "bytes"
    assert unit_of("consume_page_entries_default", 1) == "entries"
    assert unit_of("index_checkpoint_commits", 1) == "commits"
    assert unit_of("gc_thresholds", (1, 2, 3)) == "thresholds"


def full_topology_file() -> dict[str, Any]:
    """A topology file with every feature: identity, fanout, queues, members, [manager]."""
    nodes = {n: NodeAddr(n, "127.0.0.1", 7100 + i, 7200 + i) for i, n in enumerate("abcd")}
    shards = {
        0: ShardChain(0, ("a", "b"), ("d",)),
        1: ShardChain(1, ("b", "c"), ()),
    }
    identity = ClusterIdentity("6f1c9b0e-8a3d-4f2e-9b7a-0c5d1e2f3a4b", bytes(range(32)))
    topology = Topology(1, nodes, shards, identity, 2, {"orders": 2}, ())
    members = [MemberAddr("m1", "127.0.0.1", 7301, 7401)]
    text = topology.dumps_toml() + "\n" + managers_toml(members, Config())
    return tomllib.loads(text)


def key_paths(data: dict[str, Any]) -> set[str]:
    """Each key of the file in the notation of config_page.TOPOLOGY_KEYS."""
    found: set[str] = set()
    for key, value in data.items():
        if key in ("nodes", "managers", "queues"):
            found |= {
                f'{key}."<{"name" if key == "queues" else "id"}>".{k}'
                for t in value.values()
                for k in t
            }
        elif key == "shards":
            found |= {f"shards[].{k}" for shard in value for k in shard}
        elif key == "manager":
            found |= {f"manager.{k}" for k in value}
        else:
            found.add(key)
    return found


def test_every_key_a_topology_file_can_hold_is_on_the_configuration_page(
    configuration: str,
) -> None:
    paths = key_paths(full_topology_file())
    assert {
        "cluster_id",
        "shards[].fanout",
        'queues."<name>".shards',
        "manager.min_replicas",
    } <= paths
    missing = sorted(path for path in paths if f"| `{path}` |" not in configuration)
    assert not missing, f"topology keys missing from the Configuration page: {missing}"


def test_the_kestrel_fronts_keys_are_on_the_configuration_page(configuration: str) -> None:
    for key in ("server.port", "server.text_port", 'queues."<name>".max_memory_size_bytes'):
        assert f"| `{key}` |" in configuration


def test_every_metric_a_node_exposes_is_on_the_metrics_page_with_its_labels() -> None:
    page = metrics_page.render()
    names = [name for name, _, _ in metrics_page.exposed()]
    assert "kayos_commit_seconds" in names
    assert "kayos_link_up" in names
    for name in names:
        assert f"`{name}" in page, name
    by_name = {m.name: m for m in metrics_page.metrics()}
    assert by_name["kayos_link_up"].labels == ("shard", "peer", "direction")
    assert by_name["kayos_shard_disk_full"].labels == ("shard", "role")
    assert by_name["kayos_commit_seconds"].labels == ("shard",)
    assert "`kayos_shard_rolled_back_entries_total`" in page


def test_labels_are_read_from_a_literal_or_a_name_bound_to_one_in_the_same_function(
    tmp_path: Path,
) -> None:
    root = tmp_path / "kayos" / "node"
    root.mkdir(parents=True)
    (root / "m.py").write_text(
        "def a():\n"
        "    labels = ['x']\n"
        "    GaugeMetricFamily('kayos_a', 'h', labels=labels)\n"
        "def b():\n"
        "    labels = ['y', 'z']\n"
        "    Histogram('kayos_b', 'h', ['w'])\n"
        "    CounterMetricFamily('kayos_c', 'h', labels=labels)\n"
        "    GaugeMetricFamily('kayos_d', 'h', labels=made())\n"
        "    GaugeMetricFamily('kayos_e', 'h')\n",
        encoding="utf-8",
    )
    found = {name: labels for name, (labels, _) in metrics_page.declared(root).items()}
    assert found == {
        "kayos_a": ("x",),
        "kayos_b": ("w",),
        "kayos_c": ("y", "z"),
        "kayos_d": None,
        "kayos_e": (),
    }


def test_a_metric_whose_labels_cannot_be_read_fails_the_page_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exposed = [*metrics_page.exposed(), ("kayos_new_gauge", "gauge", "made somewhere unreadable")]
    monkeypatch.setattr(metrics_page, "exposed", lambda: exposed)
    with pytest.raises(KayosError, match="kayos_new_gauge"):
        metrics_page.render()


def test_the_ports_page_gives_kayos_ups_default_ports() -> None:
    page = ports_page.render()
    for run in ("7101-7103", "7201-7203", "7301-7303", "7401-7403", "22133", "2222", "2229"):
        assert f"| {run}" in page, run


def test_the_exception_tree_names_every_class_of_kayos_errors_under_its_parent() -> None:
    tree = errors_tree.render()
    defined = [
        node.name
        for node in ast.parse(Path(errors.__file__).read_text(encoding="utf-8")).body
        if isinstance(node, ast.ClassDef)
    ]
    for name in defined:
        assert f"[`{name}`][kayos.errors.{name}]" in tree, name
    lines = tree.splitlines()
    limit = next(line for line in lines if "`LimitExceeded`" in line)
    invalid = next(line for line in lines if "`InvalidRequest`" in line)
    assert len(limit) - len(limit.lstrip()) > len(invalid) - len(invalid.lstrip())
    assert "(`limit_exceeded`)" in limit
