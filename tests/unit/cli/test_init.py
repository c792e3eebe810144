"""`kayos init` (docs/node-api.md, "Topology file"; docs/deploy.md): `--from` writes the file again
with a real identity and every other line as it was, the manager's tables and comments included;
`--node` with `--manager` writes members that `kayos manager` accepts; what it cannot do it
refuses, writing nothing."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from kayos.cli.cluster import identity_in_toml
from kayos.cli.main import cli
from kayos.errors import InvalidRequest
from kayos.identity import ClusterIdentity
from kayos.manager.member import config
from kayos.topology import Topology

pytestmark = pytest.mark.unit

PLACEHOLDER_ID = "00000000-0000-4000-8000-000000000000"
PLACEHOLDER_SECRET = "00" * 32

SOURCE = f"""\
# A hand-written cluster: every line but the identity's must survive.
epoch = 4
cluster_id = "{PLACEHOLDER_ID}"   # placeholder
secret = "{PLACEHOLDER_SECRET}"
queue_shards = 2

[nodes.a]
host = "10.9.0.1"   # first host
http_port = 7101
bin_port = 7201

[nodes.b]
host = "10.9.0.2"
http_port = 7101
bin_port = 7201

[[shards]]
id = 0
chain = ["a", "b"]

[[shards]]
id = 1
chain = ["b", "a"]

[queues."orders"]
shards = 2

[managers."m1"]
host = "10.9.0.1"
raft_port = 7301
http_port = 7401

[managers."m2"]
host = "10.9.0.2"
raft_port = 7301
http_port = 7401

[manager]
detection_window_ms = 8000
min_replicas = 1
"""


def init(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["init", *args])
    return result.exit_code, result.output


def test_from_keeps_every_line_but_the_identity(tmp_path: Path) -> None:
    source, out = tmp_path / "example.toml", tmp_path / "cluster.toml"
    source.write_text(SOURCE)
    code, output = init("--from", str(source), "--out", str(out))
    assert code == 0, output
    assert "2 nodes, 2 manager members" in output
    written = out.read_text().splitlines()
    original = SOURCE.splitlines()
    assert len(written) == len(original)
    changed = [(old, new) for old, new in zip(original, written, strict=True) if old != new]
    assert [new.split(" = ")[0] for _, new in changed] == ["cluster_id", "secret"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    setup = config.load(str(out))  # what `kayos manager` reads
    assert not setup.identity.is_placeholder
    assert [m.id for m in setup.members] == ["m1", "m2"]
    assert setup.config.detection_window_ms == 8000
    assert setup.config.min_replicas == 1
    topology = Topology.load(str(out))
    assert topology.epoch == 4
    assert topology.queues == {"orders": 2}
    assert topology.queue_shards == 2


def test_from_a_file_without_an_identity_puts_it_after_the_epoch(tmp_path: Path) -> None:
    source, out = tmp_path / "bare.toml", tmp_path / "cluster.toml"
    bare = [line for line in SOURCE.splitlines() if not line.startswith(("cluster_id", "secret"))]
    source.write_text("\n".join(bare) + "\n")
    code, output = init("--from", str(source), "--out", str(out))
    assert code == 0, output
    lines = out.read_text().splitlines()
    epoch = lines.index("epoch = 4")
    assert lines[epoch + 1].startswith("cluster_id = ")
    assert lines[epoch + 2].startswith("secret = ")
    assert config.load(str(out)).members


def test_from_keeps_a_real_identity_as_it_is(tmp_path: Path) -> None:
    identity = ClusterIdentity.generate()
    text = SOURCE.replace(PLACEHOLDER_ID, identity.cluster_id).replace(
        PLACEHOLDER_SECRET, identity.secret.hex()
    )
    source, out = tmp_path / "real.toml", tmp_path / "again.toml"
    source.write_text(text)
    code, output = init("--from", str(source), "--out", str(out))
    assert code == 0, output
    assert Topology.load(str(out)).identity == identity


def test_from_a_json_file_writes_json_and_keeps_its_other_keys(tmp_path: Path) -> None:
    data = {
        "epoch": 1,
        "nodes": {"a": {"host": "10.9.0.1", "http_port": 7101, "bin_port": 7201}},
        "shards": [{"id": 0, "chain": ["a"]}],
        "managers": {"m1": {"host": "10.9.0.1", "raft_port": 7301, "http_port": 7401}},
    }
    source, out = tmp_path / "t.json", tmp_path / "cluster.json"
    source.write_text(json.dumps(data))
    code, output = init("--from", str(source), "--out", str(out))
    assert code == 0, output
    written = json.loads(out.read_text())
    assert {k: v for k, v in written.items() if k not in ("cluster_id", "secret")} == data
    identity = Topology.load(str(out)).identity
    assert identity is not None
    assert not identity.is_placeholder
    assert config.parse_members(written) == config.parse_members(data)
    toml_out = tmp_path / "cluster.toml"
    code, output = init("--from", str(source), "--out", str(toml_out))
    assert code != 0
    assert ".json" in output
    assert not toml_out.exists()


def test_an_identity_written_in_a_shape_it_cannot_rewrite_is_refused(tmp_path: Path) -> None:
    text = SOURCE.replace(
        f'secret = "{PLACEHOLDER_SECRET}"', f'secret = """\n{PLACEHOLDER_SECRET}"""'
    )
    with pytest.raises(InvalidRequest, match="one line each"):
        identity_in_toml(text, ClusterIdentity.generate())
    source, out = tmp_path / "odd.toml", tmp_path / "cluster.toml"
    source.write_text(text)
    code, output = init("--from", str(source), "--out", str(out))
    assert code != 0
    assert "one line each" in output
    assert not out.exists()


def test_nodes_and_managers_make_a_file_the_manager_accepts(tmp_path: Path) -> None:
    out = tmp_path / "cluster.toml"
    code, output = init(
        "--out", str(out),
        "--node", "a=10.9.0.1:7101:7201", "--node", "b=10.9.0.2:7101:7201",
        "--node", "c=10.9.0.3:7101:7201",
        "--manager", "m1=10.9.0.1:7301:7401", "--manager", "m2=10.9.0.2:7301:7401",
        "--manager", "m3=10.9.0.3:7301:7401",
    )  # fmt: skip
    assert code == 0, output
    assert "3 nodes, 3 manager members" in output
    setup = config.load(str(out))
    assert [(m.id, m.host, m.raft_port, m.http_port) for m in setup.members] == [
        ("m1", "10.9.0.1", 7301, 7401),
        ("m2", "10.9.0.2", 7301, 7401),
        ("m3", "10.9.0.3", 7301, 7401),
    ]
    assert [shard.chain for shard in setup.topology.shards.values()] == [
        ("a", "b", "c"),
        ("b", "c", "a"),
        ("c", "a", "b"),
    ]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--node", "a=h:1:2", "--manager", "m1=h:7301"], "ID=HOST:RAFT_PORT:HTTP_PORT"),
        (["--node", "a=h:1:2", "--manager", "m1=h:7301:7301"], "two ports are the same"),
        (["--from", "SOURCE", "--manager", "m1=h:1:2"], "go with --node"),
        (["--from", "SOURCE", "--shards", "2"], "go with --node"),
    ],
)
def test_bad_combinations_are_refused_and_write_nothing(
    tmp_path: Path, args: list[str], says: str
) -> None:
    source, out = tmp_path / "example.toml", tmp_path / "cluster.toml"
    source.write_text(SOURCE)
    code, output = init("--out", str(out), *[str(source) if a == "SOURCE" else a for a in args])
    assert code != 0
    assert says in output
    assert not out.exists()
