"""Retention rules (docs/retention.md): a queue's policy, and the pure decision of its floor.

Nothing here does IO or reads a clock: the head's driver (``kayos/node/retention.py``) gathers
the inputs (the time index's samples, the queue's byte buckets, its groups' marks, now) and commits
the floor this decides as shard metadata; compaction on every replica drops the queue's entries at
or below that floor (``kayos.storage.maintenance.compact``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from kayos import limits
from kayos.errors import InvalidRequest

# Shard metadata keys (replicated through the head like a group's mark).
POLICY_META = "retain/"
FLOOR_META = "floor/"
# The group marks the floor of "until consumed" reads (the node's HWM_META, repeated here so the
# rule needs nothing above storage).
HWM_META = "hwm/"

_FIELDS = ("max_age_ms", "max_bytes", "until_consumed")


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """A queue's retention; every limit off (None/False) is keep-all."""

    max_age_ms: int | None = None
    max_bytes: int | None = None
    until_consumed: bool = False

    @property
    def keeps_all(self) -> bool:
        return self.max_age_ms is None and self.max_bytes is None and not self.until_consumed

    def to_meta(self) -> dict[str, Any]:
        """The fields that are set (what ``retain/<queue>`` holds and replies show)."""
        out: dict[str, Any] = {}
        if self.max_age_ms is not None:
            out["max_age_ms"] = self.max_age_ms
        if self.max_bytes is not None:
            out["max_bytes"] = self.max_bytes
        if self.until_consumed:
            out["until_consumed"] = True
        return out


def parse_policy(raw: Any) -> RetentionPolicy:
    """A policy from a request body or a metadata value; anything else is ``InvalidRequest``."""
    if not isinstance(raw, Mapping):
        raise InvalidRequest("a retention policy is an object")
    unknown = sorted(str(name) for name in raw if name not in _FIELDS)
    if unknown:
        raise InvalidRequest(f"unknown retention fields: {', '.join(unknown)}")
    limits_set: dict[str, int | None] = {}
    for name in ("max_age_ms", "max_bytes"):
        value = raw.get(name)
        if value is None:
            limits_set[name] = None
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequest(f"{name} must be an integer")
        if not 1 <= value <= limits.u64_max:
            raise InvalidRequest(f"{name} must be in [1, {limits.u64_max}]")
        limits_set[name] = value
    until = raw.get("until_consumed", False)
    if not isinstance(until, bool):
        raise InvalidRequest("until_consumed must be true or false")
    return RetentionPolicy(limits_set["max_age_ms"], limits_set["max_bytes"], until)


def encode_policy(policy: RetentionPolicy) -> bytes | None:
    """The metadata value of ``retain/<queue>``: a msgpack map of the fields set (metadata values
    are integers or bytes); None (the key deleted) for keep-all."""
    fields = policy.to_meta()
    return msgpack.packb(fields, use_bin_type=True) if fields else None


def policies_in(meta: Mapping[str, Any]) -> dict[str, RetentionPolicy]:
    """Every queue's policy in a shard's metadata (values that fail to parse are skipped: the
    head only ever writes parsed ones)."""
    out: dict[str, RetentionPolicy] = {}
    for name, value in meta.items():
        if name.startswith(POLICY_META) and isinstance(value, bytes):
            try:
                out[name[len(POLICY_META) :]] = parse_policy(msgpack.unpackb(value, raw=False))
            except (InvalidRequest, ValueError, msgpack.UnpackException):
                continue
    return out


def floors_in(meta: Mapping[str, Any]) -> dict[str, int]:
    """Every queue's retention floor in a shard's metadata."""
    return {
        name[len(FLOOR_META) :]: value
        for name, value in meta.items()
        if name.startswith(FLOOR_META) and isinstance(value, int) and value > 0
    }


def floor_of(meta: Mapping[str, Any], queue: str) -> int:
    value = meta.get(FLOOR_META + queue, 0)
    return value if isinstance(value, int) else 0


def group_marks(meta: Mapping[str, Any], queue: str) -> list[int]:
    """The marks of the groups registered on ``queue``."""
    prefix = f"{HWM_META}{queue}/"
    return [v for k, v in meta.items() if k.startswith(prefix) and isinstance(v, int)]


@dataclass(frozen=True, slots=True)
class Bucket:
    """The queue's live entries in ``(after_seq, last_seq]`` as the head scanned them."""

    last_seq: int
    payload_bytes: int


def age_floor(samples: Sequence[tuple[int, int | None]], now_ms: int, max_age_ms: int) -> int:
    """The highest seq every entry at or below which came in before ``now_ms - max_age_ms``.

    ``samples`` are the head's time index, ``(first_seq, ms)`` in seq order: every seq below a
    sample's ``first_seq`` came in before its ``ms``. A sample of unknown time (None) ends nothing
    it cannot vouch for, so it is skipped."""
    cutoff = now_ms - max_age_ms
    floor = 0
    for first_seq, ms in samples:
        if ms is None:
            continue
        if ms > cutoff:
            break
        floor = max(floor, first_seq - 1)
    return floor


def bytes_floor(buckets: Iterable[Bucket], max_bytes: int) -> int:
    """The floor that brings the queue within ``max_bytes``, dropping whole buckets oldest first
    and only while what stays is still over the bound (so the queue may keep up to one bucket
    more than ``max_bytes``, never less)."""
    ordered = list(buckets)
    total = sum(b.payload_bytes for b in ordered)
    floor = 0
    for bucket in ordered:
        if total - bucket.payload_bytes < max_bytes:
            break
        total -= bucket.payload_bytes
        floor = bucket.last_seq
    return floor


def decide_floor(
    policy: RetentionPolicy,
    *,
    old_floor: int,
    commit_point: int,
    now_ms: int,
    samples: Sequence[tuple[int, int | None]],
    buckets: Iterable[Bucket],
    marks: Sequence[int],
) -> int:
    """The queue's new floor: the highest any set limit allows, never below ``old_floor`` (a
    floor only rises) and never above ``commit_point`` (only committed entries go)."""
    candidate = 0
    if policy.max_age_ms is not None:
        candidate = max(candidate, age_floor(samples, now_ms, policy.max_age_ms))
    if policy.max_bytes is not None:
        candidate = max(candidate, bytes_floor(buckets, policy.max_bytes))
    if policy.until_consumed and marks:
        candidate = max(candidate, min(marks))
    return max(old_floor, min(candidate, commit_point))


def prefix_floors(floors: Mapping[str, int]) -> dict[bytes, int]:
    """Floors keyed as compaction matches them: the stored key's prefix up to and including its
    first NUL byte (a queue's keys are ``queue NUL item``)."""
    return {queue.encode() + b"\x00": floor for queue, floor in floors.items() if floor > 0}
