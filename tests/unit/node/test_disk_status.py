"""``GET /v1/status``'s ``disk`` (kayos/node/retention.py ``disk_status``; docs/node-api.md): what
the manager's rule 9 reads. The free space is a stub here; the replicas are stand-ins with the two
fields it reads."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kayos import limits
from kayos.node import retention
from kayos.storage.disk import fileops

pytestmark = pytest.mark.unit

MARK = limits.disk_reserve_bytes + limits.disk_head_margin_bytes


def status_with(
    monkeypatch: pytest.MonkeyPatch, free: int | Exception, **replicas: Any
) -> dict[str, Any]:
    def free_bytes(path: str) -> int:
        assert path == "/data"
        if isinstance(free, Exception):
            raise free
        return free

    monkeypatch.setattr(fileops, "free_bytes", free_bytes)
    stand_ins = {
        i: SimpleNamespace(role=r, disk_full=f) for i, (r, f) in enumerate(replicas.values())
    }
    return retention.disk_status("/data", stand_ins)  # type: ignore[arg-type]


def test_full_below_the_reserve_plus_the_margin(monkeypatch: pytest.MonkeyPatch) -> None:
    assert status_with(monkeypatch, MARK) == {
        "free_bytes": MARK,
        "reserve_bytes": limits.disk_reserve_bytes,
        "full": False,
    }
    assert status_with(monkeypatch, MARK - 1)["full"] is True


def test_a_failed_commit_below_the_head_is_full_a_heads_refusal_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    roomy = MARK * 4
    assert status_with(monkeypatch, roomy, s0=("middle", True))["full"] is True
    assert status_with(monkeypatch, roomy, s0=("tail", True))["full"] is True
    assert status_with(monkeypatch, roomy, s0=("head", True), s1=("middle", False))["full"] is False


def test_unreadable_free_space_is_full_only_on_a_failed_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = status_with(monkeypatch, OSError("gone"))
    assert found == {"free_bytes": None, "reserve_bytes": limits.disk_reserve_bytes, "full": False}
    assert status_with(monkeypatch, OSError("gone"), s0=("middle", True))["full"] is True
