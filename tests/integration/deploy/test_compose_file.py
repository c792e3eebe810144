"""deploy/docker/compose.yaml against the Compose specification's schema: `docker-compose config
-q` (Debian's docker-compose 1.29, whose compose_spec.json it checks without a docker daemon)
must pass it silently. Then the file as compose resolves it (`docker-compose config`, read with
the YAML reader of docker-compose's own interpreter) must run every node and manager member of
cluster.example.toml once, each with a data volume of its own, every service on the host's
network (docs/deploy.md: clients reach every head at its topology address). Skipped, saying
why, without docker-compose (deploy/ensure-deploy-tools.sh installs it)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kayos.manager.member import config
from kayos.topology import Topology
from tests.support.deploy.units import DEPLOY, need_tool

pytestmark = pytest.mark.integration

COMPOSE_DIR = DEPLOY / "docker"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
TOPOLOGY = COMPOSE_DIR / "cluster.example.toml"
# docker-compose reads and checks a file in about a second; far above that is a hang.
COMPOSE_TIMEOUT_S = 120
# What the container sees the topology file as, and where data volumes are mounted.
CONFIG_IN_CONTAINER = "/etc/kayos/cluster.toml"
DATA_IN_CONTAINER = "/data"
YAML_TO_JSON = "import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)"


def compose(*args: str, file: Path = COMPOSE_FILE) -> subprocess.CompletedProcess[str]:
    tool = need_tool("docker-compose", "docker-compose")
    # No daemon is asked; DOCKER_HOST is cleared so a configured remote one is not either.
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    return subprocess.run(
        [tool, "-f", str(file), *args],
        capture_output=True,
        text=True,
        timeout=COMPOSE_TIMEOUT_S,
        check=False,
        env=env,
    )


def resolved() -> dict[str, Any]:
    """`docker-compose config` as data, read by the interpreter docker-compose runs on (it has
    the YAML reader docker-compose itself uses; the project's venv has none)."""
    done = compose("config")
    assert done.returncode == 0, done.stderr
    tool = need_tool("docker-compose", "docker-compose")
    interpreter = Path(tool).read_text().splitlines()[0].removeprefix("#!").split()
    read = subprocess.run(
        [*interpreter, "-c", YAML_TO_JSON],
        input=done.stdout,
        capture_output=True,
        text=True,
        timeout=COMPOSE_TIMEOUT_S,
        check=True,
    )
    data: dict[str, Any] = json.loads(read.stdout)
    return data


def test_the_compose_file_passes_the_compose_schema_silently() -> None:
    done = compose("config", "-q")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""
    assert done.stderr.strip() == ""


def test_the_schema_check_as_run_here_refuses_a_misspelt_key(tmp_path: Path) -> None:
    """The check above can fail: the same run refuses an option the schema does not have."""
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE_FILE.read_text().replace("network_mode:", "network_mod:"))
    done = compose("config", "-q", file=broken)
    assert done.returncode != 0
    assert "network_mod" in done.stderr


def test_every_node_and_member_runs_once_on_the_hosts_network_with_its_own_volume() -> None:
    services = resolved()["services"]
    topology = Topology.load(str(TOPOLOGY))
    members = [member.id for member in config.members_from(str(TOPOLOGY))]
    runs: dict[str, list[str]] = {"node": [], "manager": [], "kestrel": []}
    volumes = []
    for name, service in services.items():
        assert service["network_mode"] == "host", name
        assert service["image"] == "kayos", name
        assert service["restart"] == "on-failure", name
        command = service["command"]
        runs[command[0]].append(command[command.index("--id") + 1] if "--id" in command else name)
        if command[0] == "kestrel":
            continue
        mounts = [mount.split(":") for mount in service["volumes"]]
        (config_mount,) = [m for m in mounts if m[1] == CONFIG_IN_CONTAINER]
        assert Path(config_mount[0]) == COMPOSE_DIR / "cluster.toml"
        assert config_mount[2] == "ro"
        (data_mount,) = [m for m in mounts if m[1] == DATA_IN_CONTAINER]
        volumes.append(data_mount[0])
        assert command[command.index("--data") + 1].startswith(DATA_IN_CONTAINER + "/")
    assert sorted(runs["node"]) == sorted(topology.nodes)
    assert sorted(runs["manager"]) == members
    assert len(runs["kestrel"]) == 1
    assert len(set(volumes)) == len(volumes) == len(topology.nodes) + len(members)
    assert set(volumes) == set(resolved()["volumes"])
