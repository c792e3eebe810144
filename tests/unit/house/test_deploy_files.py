"""The deploy files stay in step with the code: their topologies load, and the commands they run
exist with the options they pass."""

from __future__ import annotations

import asyncio
import configparser
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from kayos.cli.main import cli
from kayos.errors import Unauthenticated
from kayos.node.runtime import Node
from kayos.topology import Topology
from tests.support.layout import REPO_ROOT

pytestmark = pytest.mark.unit

DEPLOY = REPO_ROOT / "deploy"


@pytest.mark.parametrize("path", ["cluster.example.toml", "docker/cluster.toml"])
def test_topologies_load_with_rotated_roles(path: str) -> None:
    topology = Topology.load(str(DEPLOY / path))
    assert sorted(topology.nodes) == ["a", "b", "c"]
    assert [shard.head for shard in topology.shards.values()] == ["a", "b", "c"]
    for node in topology.nodes:
        assert {shard.role_of(node) for shard in topology.shards.values()} == {
            "head",
            "middle",
            "tail",
        }


@pytest.mark.parametrize("path", ["cluster.example.toml", "docker/cluster.toml"])
def test_topologies_hold_a_placeholder_identity_that_kayos_init_replaces(
    path: str, tmp_path: Path
) -> None:
    example = Topology.load(str(DEPLOY / path))
    assert example.identity is not None
    assert example.identity.is_placeholder  # known to everyone: refused by every node
    out = tmp_path / "cluster.toml"
    result = CliRunner().invoke(cli, ["init", "--from", str(DEPLOY / path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    real = Topology.load(str(out))
    assert real.identity is not None
    assert not real.identity.is_placeholder
    assert real.nodes == example.nodes
    assert real.shards == example.shards


def test_a_node_refuses_the_placeholder_identity(tmp_path: Path) -> None:
    example = Topology.load(str(DEPLOY / "cluster.example.toml"))
    node = Node(example, "a", str(tmp_path / "a"))

    async def start() -> None:
        await node.start()

    with pytest.raises(Unauthenticated, match="placeholder"):
        asyncio.run(start())
    assert not (tmp_path / "a" / "cluster_id").exists()


def options_of(command: str) -> set[str]:
    result = CliRunner().invoke(cli, [command, "--help"])
    assert result.exit_code == 0, result.output
    return set(re.findall(r"--[a-z][a-z-]*", result.output))


def used_options(argv: list[str]) -> set[str]:
    return {word for word in argv if word.startswith("--")}


@pytest.mark.parametrize("unit", ["kayos-node@.service", "kayos-kestrel.service"])
def test_systemd_units_run_existing_commands(unit: str) -> None:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.read(DEPLOY / "systemd" / unit)
    argv = shlex.split(parser["Service"]["ExecStart"])
    assert argv[0].endswith("/kayos")
    assert used_options(argv) <= options_of(argv[1])


def test_compose_services_run_existing_commands_for_known_nodes() -> None:
    text = (DEPLOY / "docker" / "compose.yaml").read_text()
    topology = Topology.load(str(DEPLOY / "docker" / "cluster.toml"))
    commands = [
        [word.strip('"') for word in re.split(r",\s*", line)]
        for line in re.findall(r"command: \[(.*)\]", text)
    ]
    assert commands
    for argv in commands:
        assert used_options(argv) <= options_of(argv[0])
        if argv[0] == "node":
            assert argv[argv.index("--id") + 1] in topology.nodes
    nodes = {argv[argv.index("--id") + 1] for argv in commands if argv[0] == "node"}
    assert nodes == set(topology.nodes)
