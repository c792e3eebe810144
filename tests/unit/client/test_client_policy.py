"""The client's pure decisions (kayos/client/policy.py): which Kayos error a wire or HTTP reply
means (docs/node-api.md, "Errors"), and when to redirect, back off or give up."""

from __future__ import annotations

import random

import pytest

from kayos import errors, limits
from kayos.client.policy import (
    Action,
    RetryPolicy,
    RetryState,
    action_for,
    error_from_code,
    error_from_frame,
    error_from_http,
)
from kayos.errors import KayosError, WrongRoleError
from kayos.replication.wire.frames import ErrorFrame

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
    delays = [state.next_delay_s(unavailable) for _ in range(3)]
    assert all(d is not None and d > 0 for d in delays)
    assert state.next_delay_s(unavailable) is None, "4 attempts in all, then the caller's"
    assert state.attempts == 4


def test_redirects_are_bounded_and_immediate() -> None:
    policy = RetryPolicy(redirects_max=2)
    state = RetryState(policy, random.Random(SEED))
    wrong = WrongRoleError("no", redirect="b", epoch=1)
    assert state.next_delay_s(wrong) == 0.0
    assert state.next_delay_s(wrong) == 0.0
    assert state.next_delay_s(wrong) is None


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
    assert state.next_delay_s(error) is None
    assert state.attempts == 1


def test_policy_refuses_nonsense_bounds() -> None:
    with pytest.raises(errors.InvalidRequest):
        RetryPolicy(attempts_max=0)
    with pytest.raises(errors.InvalidRequest):
        RetryPolicy(delay_ms_min=100, delay_ms_max=10)
