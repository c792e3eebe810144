"""The leader's evidence, its pure side (kayos/manager/member/evidence.py and plan_round's use
of it; docs/manager.md, "Evidence and proof of death"): which watch lines count, which outcome is
proof of death and for which incarnation, the probes' rate limit, restarts, and the round's tick
with beats and incarnations. No processes, no clock."""

from __future__ import annotations

import pytest

from kayos import limits
from kayos.manager import NodeGone, TimerTick, decide
from kayos.manager.member.evidence import Evidence, Line, parse_line, tick_incarnations
from kayos.manager.member.plan import plan_round
from tests.support.answers import answers, everyone, status, view3

pytestmark = pytest.mark.unit

A1, A2 = "00000000000000a1", "00000000000000a2"


def test_only_a_watch_line_naming_an_incarnation_counts() -> None:
    assert parse_line(b'{"incarnation": "00000000000000a1", "beat": 3}\n') == Line(A1)
    assert parse_line(b'{"bye": true, "incarnation": "00000000000000a1"}\n') == Line(A1, bye=True)
    for junk in (
        b"",
        b"not json\n",
        b'{"beat": 3}\n',
        b'{"incarnation": "A1", "beat": 3}\n',
        b'{"incarnation": 7}\n',
        b"[1, 2]\n",
    ):
        assert parse_line(junk) is None, junk


def test_refused_splices_the_process_heard_last_but_ends_no_lease() -> None:
    """A firewall rejecting the leader's connections refuses a live node as a dead one is
    refused: the node is logged gone (spliced out), its lease still counts (simulator seed 166,
    docs/campaigns.md)."""
    evidence = Evidence()
    evidence.beat("a", A1, 100)
    event = evidence.proof("a", "refused", 150)
    assert event == NodeGone("a", 150, "refused", A1)
    assert evidence.dead == set()
    assert evidence.gone == set()
    assert not evidence.take_ended()
    # A node never heard: refused names no incarnation.
    assert evidence.proof("b", "refused", 160) == NodeGone("b", 160, "refused", "")
    # The supervisor's report of the same death ends the lease: the holds are told again.
    assert evidence.proof("a", "exited", 200, A1) == NodeGone("a", 200, "exited", A1)
    assert ("a", A1) in evidence.dead
    assert "a" in evidence.gone
    assert evidence.take_ended()
    assert not evidence.take_ended()


def test_a_goodbye_or_exit_of_a_replaced_process_is_stale() -> None:
    evidence = Evidence()
    evidence.beat("a", A1, 100)
    assert evidence.beat("a", A2, 200)  # a restart: the process before is gone
    assert ("a", A1) in evidence.dead
    assert evidence.take_ended()  # its lease with it
    assert "a" not in evidence.gone  # the node runs: a new process
    assert evidence.proof("a", "exited", 250, A1) is None  # stale: logged as nothing
    assert evidence.proof("a", "stopped", 260, A2) == NodeGone("a", 260, "stopped", A2)
    assert "a" in evidence.gone
    # Heard again under a new process: not gone any more.
    evidence.heard("a", "00000000000000a3")
    assert "a" not in evidence.gone
    assert ("a", A2) in evidence.dead


def test_the_same_incarnation_or_none_proves_nothing() -> None:
    evidence = Evidence()
    assert not evidence.heard("a", A1)  # the first one heard: nothing before it
    assert not evidence.heard("a", A1)
    assert not evidence.heard("a", "")  # a node of an earlier version names none
    assert evidence.incarnations == {"a": A1}
    assert evidence.dead == set()


def test_probes_of_one_node_are_rate_limited() -> None:
    evidence = Evidence()
    step = limits.manager_probe_interval_ms_min
    assert evidence.may_probe("a", 1_000)
    assert not evidence.may_probe("a", 1_000 + step - 1)
    assert evidence.may_probe("b", 1_000 + step - 1)  # per node
    assert evidence.may_probe("a", 1_000 + step)


def test_beats_are_taken_once_with_the_last_time_of_each_node() -> None:
    evidence = Evidence()
    evidence.beat("a", A1, 100)
    evidence.beat("a", A1, 200)
    evidence.beat("b", "", 150)
    assert evidence.take_beats() == {"a": 200, "b": 150}
    assert evidence.take_beats() == {}


def test_a_round_counts_watch_beats_as_heard_and_names_new_incarnations() -> None:
    view = view3()
    # b answered no poll (frozen for the poll, say) but its watch beat at 1_050: heard.
    replies = answers(a=status(), c=status())
    beats = {"b": 1_050, "zz": 1_060}
    plan = plan_round(view, replies, 1_100, everyone(view), beats, {"a": A1})
    tick = plan.events[0]
    assert isinstance(tick, TimerTick)
    assert tick.heard == (("a", 1_000), ("b", 1_050), ("c", 1_000))  # unknown zz: left out
    assert tick.incarnations == (("a", A1),)
    after, _ = decide(view, tick)
    assert [n.incarnation for n in after.nodes] == [A1, "", ""]
    # Once the view holds it, the next tick names it no more.
    assert tick_incarnations(after, {"a": 1_200}, {"a": A1}) == ()
    assert tick_incarnations(after, {"a": 1_200}, {"a": A2}) == (("a", A2),)
    assert tick_incarnations(after, {"b": 1_200}, {"a": A2}) == ()  # a not heard this round
