"""The client's pure decisions (kayos/client/policy.py): which Kayos error a wire or HTTP reply
means (docs/node-api.md, "Errors"), and when to redirect, back off or give up; and how it follows
the cluster (docs/node-api.md, "Clients"): which requests a newer topology abandons, what a lost
or abandoned request does next, when a connection is silent, which nodes the watch polls and how
it goes on after each answer."""

from __future__ import annotations

import random

import pytest

from kayos import errors, limits
from kayos.client.policy import (
    Action,
    Purpose,
    RetryPolicy,
    RetryState,
    Step,
    abandoned,
    action_for,
    check_counts,
    error_from_code,
    error_from_frame,
    error_from_http,
    holds_role,
    manager_urls,
    next_poll,
    report_due,
    silent,
    watch_urls,
)
from kayos.errors import KayosError, WrongRoleError
from kayos.replication.wire.frames import ErrorFrame
from kayos.topology import NodeAddr, ShardChain, Topology

pytestmark = pytest.mark.unit

SEED = 20_261_122

WIRE_CODES = {
    "invalid_request": errors.InvalidRequest,
    "limit_exceeded": errors.LimitExceeded,
    "protocol_error": errors.ProtocolError,
    "wrong_role": errors.WrongRoleError,
    "timeout": errors.OperationTimeoutError,
    "unavailable": errors.UnavailableError,
    "disk_full": errors.DiskFullError,
    "storage_error": errors.StorageError,
    "corruption": errors.CorruptionError,
    "store_closed": errors.StoreClosedError,
}


@pytest.mark.parametrize(("code", "cls"), WIRE_CODES.items())
def test_each_code_maps_to_its_class(code: str, cls: type[KayosError]) -> None:
    error = error_from_code(code, "detail")
    assert type(error) is cls
    assert error.code == code
    assert "detail" in str(error)


def test_unknown_code_is_a_plain_kayos_error_that_keeps_the_code() -> None:
    error = error_from_code("brand_new_code", "from a newer node")
    assert type(error) is KayosError
    assert "brand_new_code" in str(error)


def test_wrong_role_carries_redirect_and_epoch() -> None:
    error = error_from_frame(ErrorFrame(7, "wrong_role", "not the head", "b", 3))
    assert isinstance(error, WrongRoleError)
    assert (error.redirect, error.epoch) == ("b", 3)


def test_http_error_body_prefers_the_node_id_over_the_url() -> None:
    body = {
        "error": {
            "code": "wrong_role",
            "message": "not a tail",
            "redirect": "http://127.0.0.1:7103",
            "node": "c",
            "epoch": 4,
        }
    }
    error = error_from_http(421, body)
    assert isinstance(error, WrongRoleError)
    assert (error.redirect, error.epoch) == ("c", 4)


def test_http_error_body_without_node_keeps_the_url() -> None:
    body = {"error": {"code": "wrong_role", "message": "", "redirect": "http://h:1", "epoch": 2}}
    error = error_from_http(421, body)
    assert isinstance(error, WrongRoleError)
    assert error.redirect == "http://h:1"


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, errors.InvalidRequest),
        (404, errors.InvalidRequest),
        (413, errors.LimitExceeded),
        (502, errors.UnavailableError),
        (503, errors.UnavailableError),
        (504, errors.OperationTimeoutError),
        (599, errors.UnavailableError),
        (418, errors.InvalidRequest),
    ],
)
def test_http_status_without_a_kayos_body(status: int, cls: type[KayosError]) -> None:
    error = error_from_http(status, "<html>proxy says no</html>")
    assert type(error) is cls
    assert str(status) in str(error)


@pytest.mark.parametrize(
    ("error", "action"),
    [
        (WrongRoleError("x", redirect="a", epoch=1), Action.REDIRECT),
        (errors.UnavailableError("x"), Action.BACKOFF),
        (errors.UnavailableError("x", failure="lost"), Action.AWAIT_TOPOLOGY),
        (errors.UnavailableError("x", failure="abandoned"), Action.RESEND),
        (errors.InvalidRequest("x"), Action.FAIL),
        (errors.LimitExceeded("x"), Action.FAIL),
        (errors.ProtocolError("x"), Action.FAIL),
        (errors.OperationTimeoutError("x"), Action.FAIL),
        (errors.DiskFullError("x"), Action.FAIL),
        (RuntimeError("not ours"), Action.FAIL),
    ],
)
def test_action_for(error: BaseException, action: Action) -> None:
    assert action_for(error) is action


def test_delays_grow_to_the_cap_within_equal_jitter_bounds() -> None:
    print(f"seed={SEED}")
    policy = RetryPolicy(attempts_max=20, delay_ms_min=10, delay_ms_max=300)
    rng = random.Random(SEED)
    for retry in range(1, 40):
        ceiling_s = min(300, 10 * 2 ** (retry - 1)) / 1000
        for _ in range(50):
            delay_s = policy.delay_s(retry, rng)
            assert ceiling_s / 2 <= delay_s <= ceiling_s


def test_delays_are_reproducible_from_the_seed() -> None:
    print(f"seed={SEED}")
    policy = RetryPolicy()
    first = [policy.delay_s(retry, random.Random(SEED)) for retry in range(1, 12)]
    second = [policy.delay_s(retry, random.Random(SEED)) for retry in range(1, 12)]
    assert first == second
    assert max(first) <= limits.client_retry_delay_ms_max / 1000


def test_jitter_spreads_clients_apart() -> None:
    print(f"seed={SEED}")
    policy = RetryPolicy()
    rng = random.Random(SEED)
    delays = {round(policy.delay_s(5, rng), 6) for _ in range(100)}
    assert len(delays) > 90, "100 clients retrying together do not all wait the same time"


def test_backoff_attempts_are_bounded() -> None:
    print(f"seed={SEED}")
    policy = RetryPolicy(attempts_max=4)
    state = RetryState(policy, random.Random(SEED))
    unavailable = errors.UnavailableError("down")
    steps = [state.next_step(unavailable, managed=True) for _ in range(3)]
    assert all(s is not None and s.action is Action.BACKOFF and s.delay_s > 0 for s in steps)
    assert state.next_step(unavailable, managed=True) is None, "4 attempts, then the caller's"
    assert state.attempts == 4


def test_redirects_are_bounded_and_immediate() -> None:
    policy = RetryPolicy(redirects_max=2)
    state = RetryState(policy, random.Random(SEED))
    wrong = WrongRoleError("no", redirect="b", epoch=1)
    assert state.next_step(wrong, managed=False) == Step(Action.REDIRECT, 0.0)
    assert state.next_step(wrong, managed=False) == Step(Action.REDIRECT, 0.0)
    assert state.next_step(wrong, managed=False) is None


def test_a_wrong_role_from_a_node_behind_the_client_backs_off_instead_of_redirecting() -> None:
    # The client holds epoch 2 (b heads the shard); b has not adopted it yet and names the head
    # of epoch 1, a dead node. The client asks b again after a backoff, not a.
    print(f"seed={SEED}")
    state = RetryState(RetryPolicy(attempts_max=3), random.Random(SEED))
    behind = WrongRoleError("b: not the head", redirect="a", epoch=1)
    step = state.next_step(behind, managed=True, epoch=2)
    assert step is not None
    assert step.action is Action.BACKOFF
    assert step.delay_s > 0
    assert (state.redirects, state.attempts) == (0, 2)  # counted as a retry, bounded as one
    # A node at the client's epoch or past it redirects as before.
    assert state.next_step(behind, managed=True, epoch=1) == Step(Action.REDIRECT, 0.0)
    ahead = WrongRoleError("c: not the head", redirect="b", epoch=3)
    assert state.next_step(ahead, managed=True, epoch=2) == Step(Action.REDIRECT, 0.0)
    assert state.next_step(behind, managed=True, epoch=2) is not None
    assert state.next_step(behind, managed=True, epoch=2) is None, "3 attempts, then the caller's"


@pytest.mark.parametrize(
    "error",
    [
        errors.InvalidRequest("bad"),
        errors.LimitExceeded("big"),
        errors.ProtocolError("garbled"),
        errors.OperationTimeoutError("unknown outcome"),
    ],
)
def test_never_retried(error: KayosError) -> None:
    state = RetryState(RetryPolicy(), random.Random(SEED))
    assert state.next_step(error, managed=True) is None
    assert state.attempts == 1


def test_policy_refuses_nonsense_bounds() -> None:
    with pytest.raises(errors.InvalidRequest):
        RetryPolicy(attempts_max=0)
    with pytest.raises(errors.InvalidRequest):
        RetryPolicy(delay_ms_min=100, delay_ms_max=10)


# --- following the cluster ---------------------------------------------------------------------


def test_an_abandoned_request_is_sent_again_at_once_within_the_attempt_budget() -> None:
    state = RetryState(RetryPolicy(attempts_max=3), random.Random(SEED))
    gone = errors.UnavailableError("a left the head", failure="abandoned")
    assert state.next_step(gone, managed=False) == Step(Action.RESEND, 0.0)
    assert state.next_step(gone, managed=True) == Step(Action.RESEND, 0.0)
    assert state.next_step(gone, managed=True) is None, "3 attempts in all"


def test_a_lost_request_waits_a_window_for_the_manager_or_its_backoff_without_one() -> None:
    print(f"seed={SEED}")
    lost = errors.UnavailableError("reset", failure="lost")
    managed = RetryState(RetryPolicy(), random.Random(SEED))
    assert managed.next_step(lost, managed=True) == Step(
        Action.AWAIT_TOPOLOGY, limits.client_silence_ms / 1000
    )
    policy = RetryPolicy(delay_ms_min=10, delay_ms_max=40)
    alone = RetryState(policy, random.Random(SEED))
    step = alone.next_step(lost, managed=False)
    assert step is not None
    assert step.action is Action.AWAIT_TOPOLOGY
    assert step.delay_s == policy.delay_s(1, random.Random(SEED))
    assert (managed.attempts, alone.attempts) == (2, 2), "each counts as an attempt"


def three_nodes(epoch: int, chain: tuple[str, ...], fanout: tuple[str, ...] = ()) -> Topology:
    nodes = {n: NodeAddr(n, "127.0.0.1", 7100 + i, 7200 + i) for i, n in enumerate("abcd")}
    return Topology(epoch, nodes, {0: ShardChain(0, chain, fanout), 1: ShardChain(1, ("c", "b"))})


def test_roles_are_held_by_the_head_and_by_every_tail() -> None:
    topology = three_nodes(1, ("a", "b"), ("c", "d"))
    head, tail = Purpose(0, "head"), Purpose(0, "tail")
    assert [holds_role(topology, n, head) for n in "abcd"] == [True, False, False, False]
    assert [holds_role(topology, n, tail) for n in "abcd"] == [False, False, True, True]
    assert not holds_role(topology, "a", Purpose(7, "head")), "no such shard"


def test_a_newer_topology_abandons_the_requests_whose_node_left_the_role() -> None:
    old = three_nodes(1, ("a", "b", "c"))
    new = three_nodes(2, ("b", "c"))  # a spliced out: b heads shard 0
    sent = [
        ("a", Purpose(0, "head")),  # the old head: abandoned
        ("c", Purpose(0, "tail")),  # still the tail
        ("c", Purpose(1, "head")),  # another shard, unchanged
        ("b", Purpose(1, "tail")),  # unchanged
        ("b", Purpose(0, "tail")),  # b is not shard 0's tail (sent by a redirect): abandoned
        ("a", Purpose(5, "head")),  # a shard the new topology lacks: abandoned
    ]
    assert abandoned(old, new, sent) == [0, 4, 5]
    assert abandoned(new, new, sent) == [], "the same epoch abandons nothing"
    assert abandoned(new, old, sent) == [], "nor does an older one"
    assert abandoned(None, new, sent) == [0, 4, 5]


def test_the_tail_leaving_abandons_waits_and_pages_there_only() -> None:
    old = three_nodes(3, ("a", "b", "c"))
    new = three_nodes(4, ("a", "b"))
    sent = [("c", Purpose(0, "tail")), ("a", Purpose(0, "head")), ("b", Purpose(0, "head"))]
    assert abandoned(old, new, sent) == [0, 2]


def test_managers_come_from_the_topology_and_none_without_them() -> None:
    assert manager_urls(None) == []
    assert manager_urls(three_nodes(1, ("a",))) == []


def test_a_connection_is_silent_after_the_bound_from_its_last_sound_or_its_first_request() -> None:
    assert not silent(last_heard_s=10.0, busy_since_s=5.0, now_s=10.5, silence_s=0.7)
    assert silent(last_heard_s=10.0, busy_since_s=5.0, now_s=10.75, silence_s=0.7)
    # Idle long before its request: counted from the request.
    assert not silent(last_heard_s=1.0, busy_since_s=10.0, now_s=10.6, silence_s=0.7)
    assert silent(last_heard_s=1.0, busy_since_s=10.0, now_s=10.8, silence_s=0.7)


def test_a_late_silence_check_judges_nobody() -> None:
    assert check_counts(due_s=10.0, now_s=10.0, interval_s=0.2)
    assert check_counts(due_s=10.0, now_s=10.2, interval_s=0.2)
    assert not check_counts(due_s=10.0, now_s=10.25, interval_s=0.2), "the loop was held up"


def test_a_lost_node_is_reported_once_per_interval() -> None:
    assert report_due(None, 5.0, 1.0)
    assert not report_due(5.0, 5.9, 1.0)
    assert report_due(5.0, 6.0, 1.0)


def test_the_watch_polls_seeds_then_nodes_once_each_within_its_bound() -> None:
    topology = three_nodes(1, ("a", "b"))
    urls = {n: f"http://127.0.0.1:{7100 + i}" for i, n in enumerate("abcd")}
    seeds = [urls["b"] + "/", "http://seed:1", "http://seed:1"]
    watched = watch_urls(seeds, topology, salt=1, most=16)
    assert watched[:2] == [urls["b"], "http://seed:1"]
    assert sorted(watched[2:]) == sorted(urls[n] for n in "acd")
    assert len(set(watched)) == len(watched) == 5
    assert watch_urls(seeds, topology, salt=1, most=3) == watched[:3]
    assert watch_urls(seeds, None, salt=1, most=16) == [urls["b"], "http://seed:1"]
    orders = {tuple(watch_urls([], topology, salt=s, most=16)) for s in range(50)}
    assert len(orders) > 1, "clients spread over a large cluster's nodes"


def test_a_watch_goes_on_at_once_after_an_answer_and_backs_off_after_failures() -> None:
    print(f"seed={SEED}")
    policy = RetryPolicy(delay_ms_min=10, delay_ms_max=80)
    rng = random.Random(SEED)
    assert next_poll(3, "newer", 0.01, 30.0, policy, rng) == (0, 0.0)
    assert next_poll(3, "same", 30.0, 30.0, policy, rng) == (0, 0.0), "it waited: again at once"
    failures, pause_s = next_poll(0, "failed", 0.0, 30.0, policy, rng)
    assert failures == 1
    assert 0.005 <= pause_s <= 0.01
    pauses = []
    for _ in range(6):
        failures, pause_s = next_poll(failures, "failed", 0.0, 30.0, policy, rng)
        pauses.append(pause_s)
    assert failures == 7
    assert max(pauses) <= 0.08
    assert pauses[-1] >= 0.04


def test_a_node_that_does_not_wait_is_asked_again_only_after_the_refresh_age() -> None:
    policy = RetryPolicy()
    rng = random.Random(SEED)
    assert next_poll(0, "same", 0.002, 30.0, policy, rng) == (
        0,
        limits.client_topology_max_age_ms / 1000,
    )
