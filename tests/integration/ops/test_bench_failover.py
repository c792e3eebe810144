"""``kayos bench failover`` on real processes: the read-back finds a message written twice and an
acknowledged one missing, and one small run (kill -9 of the tail, one repetition, a short stall
phase) writes every figure with sane values. The timing targets are the benchmark's business
(docs/performance.md), not this test's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kayos.bench.membership.failover_figures import Call
from kayos.bench.membership.failover_load import marker, read_back
from kayos.client.sync import Client
from kayos.local.cluster import LocalCluster

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

QUEUE = "failover-read-back"


def test_the_read_back_counts_a_message_written_twice_and_an_acknowledged_one_missing(
    tmp_path: Path,
) -> None:
    with (
        LocalCluster(tmp_path / "cluster", nodes=1, replicas=1, shards=1) as cluster,
        Client(list(cluster.urls.values())) as client,
    ):
        client.produce(QUEUE, "p0-9", "before the start marker", acks="all")
        start = marker(client, QUEUE, "start")
        client.produce(QUEUE, "p0-1", "once", acks="all")
        client.produce(QUEUE, "p0-2", "first copy", acks="all")
        client.produce("another-queue", "p0-2", "another queue's", acks="all")
        client.produce(QUEUE, "p1-1", "once", acks="all")
        client.produce(QUEUE, "p0-2", "second copy", acks="all")  # supersedes the first
        client.produce(QUEUE, "p0-2", "third copy", acks="all")
        end = marker(client, QUEUE, "end")
        calls = [
            Call(0, 1, 0.0, 0.1, ok=True),
            Call(0, 2, 0.1, 0.2, ok=True),
            Call(1, 1, 0.0, 0.1, ok=True),
            Call(1, 2, 0.1, 0.2, ok=True),  # acknowledged, never written: lost
            Call(1, 3, 0.2, 0.3, ok=False),  # raised, never written: not a loss
        ]
        found = read_back(client, QUEUE, start, end, calls)
    assert found["lost"] == 1
    assert found["lost_examples"] == ["p1-2"]
    assert found["duplicates"] == 2
    assert found["duplicate_examples"] == ["p0-2"]
    # The seqs of the two superseded copies and of the other queue's message.
    assert found["seqs_read_alone"] == 3


@pytest.mark.slow
def test_bench_failover_json_has_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "failover.json"
    command = [
        sys.executable, "-m", "kayos", "bench", "failover", "--kinds", "kill9", "--roles",
        "tail", "--repeat", "1", "--stall-seconds", "5", "--seed", "11", "--json", "--out",
        str(out), "--dir", str(tmp_path / "bench"),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=540, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "seed 11" in done.stderr
    printed = json.loads(done.stdout)
    written = json.loads(out.read_text())
    assert printed == written
    print(json.dumps({k: v for k, v in written.items() if k != "machine"}, indent=1))

    assert written["seed"] == 11
    assert written["parameters"]["seed"] == 11
    assert list(written["cases"]) == ["kill9"]
    case = written["cases"]["kill9"]["tail"]
    assert case["repetitions"] == 1
    [run] = written["runs"]
    assert (run["fault"], run["role"], run["node"]) == ("kill9", "tail", run["chain_before"][-1])
    bound_s = written["parameters"]["bound_s"]
    resume = run["writes_resume_s"]
    if resume is None:
        assert run["resume"] == f"did not resume within {bound_s} s"
    else:
        assert 0 < resume <= bound_s
        assert run["resume"] is None
        # A thread's call in flight at the fault may be acknowledged just after it, so its gap
        # to its next ack may be a little shorter than the resume; both are of the same outage.
        gap = run["longest_gap_s"]
        assert gap is None or 0 < gap <= bound_s + written["parameters"]["margin_s"]
    assert case["writes_resume_s"]["values"] == [resume]
    assert run["acks"] > 0
    assert run["errors"] >= 0
    assert run["lost"] == 0  # a kill -9 of the tail loses no acknowledged write
    assert run["duplicates"] >= 0
    assert sorted(run["chain_after"]) == ["a", "b", "c"]  # the cluster was whole again
    stall = written["stall"]
    assert stall["stalls"] >= 1
    assert stall["false_removals"] == written["false_removals"] == len(stall["removals"])
    assert stall["acks"] > 0
    assert stall["lost"] == 0
    assert set(written["targets"]) == {
        "kill9_resume_median_s",
        "kill9_resume_worst_s",
        "lost",
        "false_removals",
    }
    for name, verdict in written["targets"].items():
        assert verdict["met"] in (True, False), name


@pytest.mark.slow
def test_bench_failover_with_an_async_client_reports_the_killed_head_and_loses_nothing(
    tmp_path: Path,
) -> None:
    out = tmp_path / "failover.json"
    command = [
        sys.executable, "-m", "kayos", "bench", "failover", "--client", "async", "--kinds",
        "kill9", "--roles", "head", "--repeat", "1", "--stall-seconds", "0", "--seed", "12",
        "--json", "--out", str(out), "--dir", str(tmp_path / "bench"),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=540, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    written = json.loads(out.read_text())
    assert written["parameters"]["client"] == "async"
    [run] = written["runs"]
    assert (run["fault"], run["role"]) == ("kill9", "head")
    # The killed node's exit went to the managers, as its supervisor's would.
    assert run["exit_report"].startswith("reported to the manager"), run["exit_report"]
    assert run["writes_resume_s"] is not None, run["resume"]
    case = written["cases"]["kill9"]["head"]
    assert (case["lost"], case["duplicates"]) == (0, 0)
    assert case["acks"] > 0
