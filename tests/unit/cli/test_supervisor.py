"""The restart decisions of ``kayos up`` (kayos/local/supervisor.py), on a fake clock."""

from __future__ import annotations

import itertools

import pytest

from kayos import limits
from kayos.local.supervisor import GiveUp, Restart, Supervisor

pytestmark = pytest.mark.unit

MIN_S = limits.node_restart_delay_ms_min / 1000
MAX_S = limits.node_restart_delay_ms_max / 1000
HEALTHY_S = limits.node_restart_healthy_ms / 1000


def test_a_death_restarts_after_the_min_delay_and_once() -> None:
    supervisor = Supervisor()
    supervisor.started("b", 0.0)
    decision = supervisor.exited("b", HEALTHY_S + 1)
    assert decision == Restart("b", MIN_S, 1)
    assert supervisor.due(HEALTHY_S + 1) == []
    assert supervisor.due(HEALTHY_S + 1 + MIN_S) == ["b"]
    assert supervisor.due(HEALTHY_S + 1 + MIN_S) == [], "a due restart is named once"


def test_deaths_in_a_row_double_the_delay_up_to_the_max_then_give_up() -> None:
    supervisor = Supervisor()
    now = 0.0
    supervisor.started("a", now)
    delays = []
    for _ in range(limits.node_restarts_max):
        now += 0.1
        decision = supervisor.exited("a", now)
        assert isinstance(decision, Restart)
        delays.append(decision.delay_s)
        now += decision.delay_s
        assert supervisor.due(now) == ["a"]
        supervisor.started("a", now)
    assert delays[:3] == [MIN_S, 2 * MIN_S, 4 * MIN_S]
    assert max(delays) == MAX_S
    assert all(b >= a for a, b in itertools.pairwise(delays))
    assert supervisor.exited("a", now + 0.1) == GiveUp("a", limits.node_restarts_max + 1)
    assert supervisor.due(now + MAX_S + 1) == []


def test_a_member_that_ran_long_enough_starts_over() -> None:
    supervisor = Supervisor()
    supervisor.started("c", 0.0)
    for now in (0.1, 1.0, 3.0):
        decision = supervisor.exited("c", now)
        assert isinstance(decision, Restart)
        supervisor.started("c", now + decision.delay_s)
    assert supervisor.exited("c", 4.5) == Restart("c", 8 * MIN_S, 4)
    supervisor.started("c", 10.0)
    assert supervisor.exited("c", 10.0 + HEALTHY_S) == Restart("c", MIN_S, 1)


def test_members_are_independent() -> None:
    supervisor = Supervisor()
    supervisor.started("a", 0.0)
    supervisor.started("kestrel", 0.0)
    assert supervisor.exited("a", 1.0) == Restart("a", MIN_S, 1)
    assert supervisor.exited("kestrel", 1.0) == Restart("kestrel", MIN_S, 1)
    assert sorted(supervisor.due(1.0 + MIN_S)) == ["a", "kestrel"]
