"""Where a command's cluster comes from (kayos/cli/address.py; docs/operations.md, "Naming the
cluster"): ``--cluster``, then the old names, then ``KAYOS_CLUSTER``, then the topology file's
nodes, then ``kayos up``'s first node; what is not a node URL is refused, naming where it came
from; and the old names of things other than the cluster (``ctl compact --wait``, ``bench kestrel
--cluster``) still do what they did, with a note."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from kayos.cli.address import (
    CLUSTER_ENV,
    LOCAL_URL,
    TOPOLOGY_DEFAULT,
    ClusterAddress,
    node_urls,
    resolve,
)
from kayos.cli.main import cli
from kayos.topology import Topology

pytestmark = pytest.mark.unit


def topology_file(path: Path, *ports: int) -> Path:
    nodes = [f"n{i}=127.0.0.1:{port}:{port + 100}" for i, port in enumerate(ports)]
    args = ["init", "--out", str(path)] + [arg for node in nodes for arg in ("--node", node)]
    made = CliRunner().invoke(cli, args, catch_exceptions=False)
    assert made.exit_code == 0, made.output
    return path


def found(
    given: tuple[str, ...] = (),
    old: dict[str, tuple[str, ...]] | None = None,
    env: dict[str, str] | None = None,
    topology_path: str | None = None,
    fallback: bool = True,
) -> ClusterAddress | None:
    return resolve(given, old or {}, env or {}, topology_path=topology_path, fallback=fallback)


def test_the_option_wins_then_the_old_names_then_the_variable(tmp_path: Path) -> None:
    path = str(topology_file(tmp_path / "cluster.toml", 7101))
    env = {CLUSTER_ENV: "http://e:1"}
    both = found(("http://a:1",), {"--seed": ("http://b:1",)}, env, path)
    assert both == ClusterAddress(("http://a:1", "http://b:1"), "--cluster")
    assert found((), {"--seed": ("http://b:1",)}, env, path) == ClusterAddress(
        ("http://b:1",), "--seed"
    )
    assert found((), {"--seed": ()}, env, path) == ClusterAddress(("http://e:1",), CLUSTER_ENV)
    assert found((), {}, {}, path) == ClusterAddress(("http://127.0.0.1:7101",), "file", path)


def test_without_a_file_the_default_is_kayos_ups_first_node(tmp_path: Path) -> None:
    assert found(topology_path=str(tmp_path / "none.toml")) == ClusterAddress(
        (LOCAL_URL,), "default"
    )
    unreadable = tmp_path / "bad.toml"
    unreadable.write_text("[nodes\n")
    assert found(topology_path=str(unreadable)) == ClusterAddress((LOCAL_URL,), "default")


def test_the_default_file_is_the_one_kayos_up_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kayos-data").mkdir()
    topology_file(tmp_path / TOPOLOGY_DEFAULT, 17101, 17102)
    address = found()
    assert address is not None
    assert address.urls == ("http://127.0.0.1:17101", "http://127.0.0.1:17102")
    assert address.path == TOPOLOGY_DEFAULT
    assert Topology.load(TOPOLOGY_DEFAULT).nodes["n0"].http_url == address.urls[0]


def test_a_command_with_no_default_cluster_gets_none(tmp_path: Path) -> None:
    path = str(topology_file(tmp_path / "cluster.toml", 7101))
    assert found(topology_path=path, fallback=False) is None
    assert found(env={CLUSTER_ENV: " , "}, fallback=False) is None
    assert found(env={CLUSTER_ENV: "a:1"}, fallback=False) == ClusterAddress(
        ("http://a:1",), CLUSTER_ENV
    )


def test_urls_split_on_commas_take_host_port_and_lose_trailing_slashes() -> None:
    texts = ["a:1,http://b:2/", " https://c:3 ", "a:1", ""]
    assert node_urls(texts, "--cluster") == ("http://a:1", "http://b:2", "https://c:3")


@pytest.mark.parametrize("bad", ["ftp://a:1", "http://", "a:port", "http://a:99999999", "://x"])
@pytest.mark.parametrize("where", ["--cluster", CLUSTER_ENV])
def test_what_is_not_a_node_url_is_refused_naming_where_it_came_from(bad: str, where: str) -> None:
    given = (bad,) if where == "--cluster" else ()
    env = {CLUSTER_ENV: f"http://ok:1,{bad}"} if where == CLUSTER_ENV else {}
    with pytest.raises(click.BadParameter, match="is not a node's HTTP URL") as raised:
        found(given, env=env)
    assert raised.value.param_hint == where


def test_a_bad_variable_stops_the_command_with_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["produce", "q", "k", "v"], env={CLUSTER_ENV: "ftp://x:1"})
    assert result.exit_code == 2
    assert CLUSTER_ENV in result.output
    assert "'ftp://x:1' is not a node's HTTP URL" in result.output


def test_the_messages_say_where_an_address_came_from() -> None:
    how = f"name the cluster with --cluster URL or {CLUSTER_ENV}"
    assert ClusterAddress(("http://a:1",), "--cluster").describe() == "http://a:1"
    assert ClusterAddress(("http://a:1",), "--seed").hint() == ""
    assert ClusterAddress(("http://a:1",), CLUSTER_ENV).hint() == f" (from {CLUSTER_ENV})"
    assert ClusterAddress(("http://a:1",), "file", "c.toml").describe() == (
        f"http://a:1 (the nodes of c.toml; {how})"
    )
    assert ClusterAddress((LOCAL_URL,), "default").hint() == (
        f" (kayos up's first node, the default; {how})"
    )


def test_compact_wait_seconds_still_works_as_wait_timeout_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ctl compact --wait S`` was the seconds to follow; ``--wait 0`` did not follow."""
    from kayos.cli.ctl import maintenance

    path = topology_file(tmp_path / "cluster.toml", 7101)
    waited: list[float] = []

    async def topology(*_: Any) -> Topology:
        return Topology.load(str(path))

    async def compactions(*args: Any) -> dict[str, Any]:
        waited.append(args[5])
        return {"ok": True, "lines": []}

    async def no_transport(work: Any) -> Any:
        return await work(None)

    monkeypatch.setattr(maintenance, "live_topology", topology)
    monkeypatch.setattr(maintenance, "run_compactions", compactions)
    monkeypatch.setattr(maintenance, "with_transport", no_transport)
    runner = CliRunner()
    base = ["ctl", "compact", "--topology", str(path), "--cluster", "http://a:1"]
    for extra in (["--wait", "7"], ["--wait", "0"], ["--wait-timeout", "7"], ["--no-wait"], []):
        result = runner.invoke(cli, [*base, *extra], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        note = "--wait is deprecated and goes in the next release: use --wait-timeout SECONDS"
        assert (note in result.stderr) == ("--wait" in extra)
    assert waited == [7.0, 0.0, 7.0, 0.0, 600.0]


def test_bench_kestrel_cluster_switch_still_runs_the_local_cluster_with_a_note(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kayos.bench.kestrel import front

    asked: list[bool] = []

    def bench(parameters: Any, base: Any, phase: Any) -> dict[str, Any]:
        asked.append(parameters.cluster)
        return {}

    monkeypatch.setattr(front, "bench_kestrel", bench)
    runner = CliRunner()
    for extra in (["--cluster"], ["--local-cluster"], ["--memory"], []):
        result = runner.invoke(cli, ["bench", "kestrel", *extra], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        note = "--cluster is deprecated and goes in the next release: use --local-cluster"
        assert (note in result.stderr) == (extra == ["--cluster"])
    assert asked == [True, True, False, False]


def test_a_manager_command_says_when_the_variable_names_another_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manager commands ask the members of the topology file: with KAYOS_CLUSTER naming
    none of its nodes and the file left at its default (which may be another cluster's), they
    say so."""
    import kayos.client.operator

    async def refused(*_: Any) -> dict[str, Any]:
        return {"ok": False, "op": "rebalance", "error": "refused here"}

    monkeypatch.setattr(kayos.client.operator, "post_operator", refused)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kayos-data").mkdir()
    path = str(topology_file(tmp_path / TOPOLOGY_DEFAULT, 7101, 7102))
    with open(path, "a") as handle:
        handle.write('\n[managers."m1"]\nhost = "127.0.0.1"\nraft_port = 3\nhttp_port = 4\n')
    runner = CliRunner()
    note = f"note: {CLUSTER_ENV} (http://a:1) names no node of ./kayos-data/cluster.toml"
    for args, env, noted in (
        ([], {CLUSTER_ENV: "http://a:1"}, True),
        (["--topology", path], {CLUSTER_ENV: "http://a:1"}, False),
        ([], {CLUSTER_ENV: "127.0.0.1:7102,http://a:1"}, False),
        ([], {CLUSTER_ENV: None}, False),
    ):
        result = runner.invoke(cli, ["ctl", "rebalance", *args], env=env)
        assert result.exit_code == 1, result.output
        assert "refused here" in result.stderr
        assert (note in result.stderr) == noted, result.stderr
