"""The deploy files stay in step with the code (docs/deploy.md): their topologies load with their
manager members, `kayos init --from` gives them a real identity and keeps the rest, the units and
compose services run commands that exist with the options they pass, for every node and member of
the topologies, and no unit orders itself after a template. Running them is the integration
tier's (tests/integration/deploy/)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from kayos.cli.main import cli
from kayos.errors import Unauthenticated
from kayos.manager.member import config
from kayos.node.runtime import Node
from kayos.topology import Topology
from tests.support.deploy.units import (
    ALL_UNITS,
    DEPLOY,
    INSTALLED_KAYOS,
    KESTREL_UNIT,
    MANAGER_UNIT,
    NODE_UNIT,
    UNITS,
    exec_start,
    read_environment_file,
    setting,
    settings,
)

pytestmark = pytest.mark.unit

HOSTS_EXAMPLE = "cluster.example.toml"
COMPOSE_EXAMPLE = "docker/cluster.example.toml"
EXAMPLES = [HOSTS_EXAMPLE, COMPOSE_EXAMPLE]


@pytest.mark.parametrize("path", EXAMPLES)
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


@pytest.mark.parametrize("path", EXAMPLES)
def test_topologies_name_three_manager_members(path: str) -> None:
    members = config.members_from(str(DEPLOY / path))
    assert [member.id for member in members] == ["m1", "m2", "m3"]


def test_the_hosts_example_puts_one_node_and_one_member_on_each_host() -> None:
    topology = Topology.load(str(DEPLOY / HOSTS_EXAMPLE))
    members = config.members_from(str(DEPLOY / HOSTS_EXAMPLE))
    node_hosts = sorted(node.host for node in topology.nodes.values())
    assert len(set(node_hosts)) == 3
    assert sorted(member.host for member in members) == node_hosts


def test_the_compose_example_gives_every_process_its_own_port_on_one_address() -> None:
    topology = Topology.load(str(DEPLOY / COMPOSE_EXAMPLE))
    members = config.members_from(str(DEPLOY / COMPOSE_EXAMPLE))
    hosts = {node.host for node in topology.nodes.values()} | {m.host for m in members}
    assert hosts == {"127.0.0.1"}
    ports = [p for node in topology.nodes.values() for p in (node.http_port, node.bin_port)]
    ports += [p for member in members for p in (member.raft_port, member.http_port)]
    assert len(ports) == len(set(ports)) == 12


@pytest.mark.parametrize("path", EXAMPLES)
def test_kayos_init_gives_the_examples_a_real_identity_and_keeps_their_members(
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
    setup = config.load(str(out))  # what `kayos manager` reads: members and the secret
    assert setup.members == config.members_from(str(DEPLOY / path))
    assert setup.identity == real.identity


def test_a_node_refuses_the_placeholder_identity(tmp_path: Path) -> None:
    example = Topology.load(str(DEPLOY / HOSTS_EXAMPLE))
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


def kestrel_environment() -> dict[str, str]:
    return read_environment_file(UNITS / "kestrel.env.example")


@pytest.mark.parametrize(
    ("unit", "instance"), [(NODE_UNIT, "a"), (MANAGER_UNIT, "m1"), (KESTREL_UNIT, "")]
)
def test_systemd_units_run_existing_commands(unit: Path, instance: str) -> None:
    argv = exec_start(unit, instance, kestrel_environment())
    assert argv[0] == INSTALLED_KAYOS
    assert used_options(argv) <= options_of(argv[1])
    if instance:
        assert argv[argv.index("--id") + 1] == instance


def test_every_node_and_member_of_the_example_has_its_own_data_directory() -> None:
    """An instance per node (kayos-node@a) and per member (kayos-manager@m1); no two share a
    data directory, and each is under the units' StateDirectory, the one place they may write."""
    topology = Topology.load(str(DEPLOY / HOSTS_EXAMPLE))
    members = config.members_from(str(DEPLOY / HOSTS_EXAMPLE))
    runs = [(NODE_UNIT, node) for node in topology.nodes]
    runs += [(MANAGER_UNIT, member.id) for member in members]
    data_dirs = []
    for unit, instance in runs:
        argv = exec_start(unit, instance)
        state = "/var/lib/" + setting(unit, "Service", "StateDirectory") + "/"
        data_dirs.append(argv[argv.index("--data") + 1])
        assert data_dirs[-1].startswith(state), (unit.name, data_dirs[-1])
    assert len(set(data_dirs)) == len(runs)


def test_the_kestrel_unit_reads_the_variables_it_uses_from_its_environment_file() -> None:
    assert setting(KESTREL_UNIT, "Service", "EnvironmentFile") == "/etc/kayos/kestrel.env"
    used = set(re.findall(r"\$\{?(\w+)", setting(KESTREL_UNIT, "Service", "ExecStart")))
    # The node to start from, and the front's own credential (docs/security.md).
    assert used == set(kestrel_environment()) == {"KAYOS_CLUSTER", "KAYOS_CREDENTIALS"}
    argv = exec_start(KESTREL_UNIT, "", kestrel_environment())
    assert argv[argv.index("--credentials") + 1] == "/etc/kayos/kestrel-credentials.json"
    cluster = argv[argv.index("--cluster") + 1]
    nodes = Topology.load(str(DEPLOY / HOSTS_EXAMPLE)).nodes.values()
    assert cluster in {f"http://{node.host}:{node.http_port}" for node in nodes}


ORDERING = ("After", "Before", "Wants", "Requires", "BindsTo", "PartOf", "Requisite")


@pytest.mark.parametrize("unit", ALL_UNITS, ids=lambda unit: unit.name)
def test_no_unit_orders_itself_after_a_template_without_an_instance(unit: Path) -> None:
    named = [
        name
        for key in ORDERING
        for value in settings(unit).get("Unit", {}).get(key, [])
        for name in value.split()
    ]
    assert not [name for name in named if re.search(r"@\.\w+$", name)], named


def test_compose_services_run_existing_commands_for_every_node_and_member() -> None:
    text = (DEPLOY / "docker" / "compose.yaml").read_text()
    topology = Topology.load(str(DEPLOY / COMPOSE_EXAMPLE))
    members = config.members_from(str(DEPLOY / COMPOSE_EXAMPLE))
    commands = [
        [word.strip('"') for word in re.split(r",\s*", line)]
        for line in re.findall(r"command: \[(.*)\]", text)
    ]
    assert commands
    for argv in commands:
        assert used_options(argv) <= options_of(argv[0])

    def ids(command: str) -> list[str]:
        return sorted(argv[argv.index("--id") + 1] for argv in commands if argv[0] == command)

    assert ids("node") == sorted(topology.nodes)
    assert ids("manager") == [member.id for member in members]
    assert [argv[0] for argv in commands].count("kestrel") == 1
