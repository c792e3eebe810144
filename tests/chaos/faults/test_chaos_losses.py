"""The deterministic parts of ``lose_for_good`` (chaos/procs/losses.py): the kind is opt-in, needs
the manager and the spare, and gives the manager a short grace; a loss is over when every chain
is back to full length without the lost node and with no copy pending. The faults themselves run
against real processes (``kayos chaos run --kinds lose_for_good``; docs/testing.md "Losses for
good")."""

from __future__ import annotations

import pytest

from chaos.procs import campaign, faults, losses, membership
from tests.support.chaos import first, view

pytestmark = pytest.mark.chaos


def test_losses_are_drawn_only_when_named_and_need_the_manager_and_the_spare() -> None:
    assert "lose_for_good" not in faults.KINDS
    assert "lose_for_good" in faults.ALL_KINDS
    assert "lose_for_good" in faults.MANAGER_KINDS & faults.SPARE_KINDS
    kinds = ("kill9", "lose_for_good")
    drawn = first(7, 400, kinds)
    assert {f.kind for f in drawn} == set(kinds)
    assert drawn == first(7, 400, kinds)


def test_only_a_campaign_that_loses_nodes_shortens_the_managers_grace() -> None:
    assert campaign.restore_config(("kill9", "pause")) == {}
    shortened = campaign.restore_config(("kill9", "lose_for_good"))
    assert shortened == {"replace_after_ms": losses.campaign_replace_after_ms}
    # Longer than any other kind keeps a node down, so only a loss for good triggers a copy.
    assert losses.campaign_replace_after_ms > faults.down_s_max * 1000


def test_redundancy_is_restored_when_every_chain_is_full_without_the_lost_node() -> None:
    full = {0: ["b", "c", "d"], 1: ["b", "c", "d"], 2: ["c", "d", "b"]}
    assert losses.restored(view(full, down=("a",)), "a", 3)
    short = {0: ["b", "c"], 1: ["b", "c", "d"], 2: ["c", "d", "b"]}
    assert not losses.restored(view(short, down=("a",)), "a", 3)
    copying = view(short, down=("a",), catching={0: ["d"]})
    assert not losses.restored(copying, "a", 3)
    assert not losses.restored(view({0: ["a", "b", "c"]}), "a", 3)


def test_a_removed_node_does_not_hold_up_a_wait_for_a_whole_cluster() -> None:
    settled = view({0: ["b", "c", "d"]})
    settled["nodes"].append(["a", "removed", 0])
    assert membership.all_up(settled)
    settled["nodes"][-1][1] = "down"
    assert not membership.all_up(settled)
