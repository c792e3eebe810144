"""Consume pages end to end without a network: the node's columnar ``read_page`` against a
per-entry reference, the reply's two shapes down to their msgpack bytes, and the client's
decoding of those bytes (docs/node-api.md, Consume)."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, cast

import msgpack
import pytest

from kayos.client.http import MSGPACK, decode_body
from kayos.client.types import Message, MessageView, PageColumns, page_from_reply
from kayos.errors import ProtocolError
from kayos.node import runtime
from kayos.node.http.bodies import page_payload
from kayos.node.runtime import Page, read_page
from kayos.replication.shard.replica import ShardReplica, queue_prefix
from kayos.storage import Delete, Put, ShardStore

pytestmark = pytest.mark.unit

if TYPE_CHECKING:
    from kayos.clock import ManualClock

QUEUE = "q"
OTHER = "q2"  # another queue of the same shard; its prefix is not a prefix of QUEUE's


class _Tail:
    """What read_page needs of a replica: its store, shard id and commit point (all of the store
    unless ``commit_point`` says less)."""

    def __init__(self, store: ShardStore, shard: int, commit_point: int | None) -> None:
        self.store = store
        self.shard_id = shard
        self._commit_point = commit_point

    @property
    def commit_point(self) -> int:
        return self.store.last_seq if self._commit_point is None else self._commit_point


def replica_of(
    store: ShardStore, shard: int = 3, *, commit_point: int | None = None
) -> ShardReplica:
    return cast(ShardReplica, _Tail(store, shard, commit_point))


def stored(queue: str, key: bytes) -> bytes:
    return queue_prefix(queue) + key


def reference_page(
    store: ShardStore, hwm: int, after: int, upto: int | None, limit: int
) -> tuple[list[runtime.Message], int, int, bool]:
    """The page as the node built it before columns: one Message per entry of the queue."""
    prefix = queue_prefix(QUEUE)
    messages: list[runtime.Message] = []
    with store.snapshot() as snap:
        boundary = snap.boundary if upto is None else min(upto, snap.boundary)
        last_seen = boundary
        for entry in (e for page in snap.pages(after, boundary, as_of=boundary) for e in page):
            if not entry.key.startswith(prefix):
                continue
            messages.append(
                runtime.Message(
                    entry.seq,
                    entry.key[len(prefix) :],
                    entry.value,
                    entry.expiry_ms,
                    entry.headers,
                    entry.deleted,
                )
            )
            if len(messages) >= limit:
                last_seen = entry.seq
                break
    return messages, boundary, last_seen, last_seen >= boundary


def fill(store: ShardStore, clock: ManualClock, rng: random.Random, batches: int) -> None:
    """Two queues interleaved; overwrites, deletes, expiries (some already past) and headers."""
    now_ms = int(clock.now_s() * 1000)
    for _ in range(batches):
        ops: list[Put | Delete] = []
        for _ in range(rng.randint(1, 40)):
            queue = QUEUE if rng.random() < 0.6 else OTHER
            key = stored(queue, b"k%d" % rng.randint(0, 60))
            roll = rng.random()
            if roll < 0.1:
                ops.append(Delete(key))
            elif roll < 0.2:
                ops.append(Put(key, b"e", now_ms + rng.choice((-1000, 60_000))))
            elif roll < 0.3:
                ops.append(Put(key, b"h", 0, {"trace": b"%d" % rng.randint(0, 9)}))
            else:
                ops.append(Put(key, b"v%d" % rng.randint(0, 999)))
        store.commit(ops)


@pytest.mark.parametrize("limit", [1, 2, 7, 16, 1000])
def test_columns_hold_what_one_message_per_entry_held(
    tmp_store: ShardStore, clock: ManualClock, limit: int
) -> None:
    rng = random.Random(limit)
    fill(tmp_store, clock, rng, 60)
    replica = replica_of(tmp_store)
    after, upto, pages = 0, None, 0
    while True:
        page = read_page(replica, QUEUE, "g", 0, after, upto, limit)
        messages, boundary, position, end = reference_page(tmp_store, 0, after, upto, limit)
        assert page.messages == messages
        assert (page.boundary, page.next, page.end, page.shard, page.hwm) == (
            boundary,
            position,
            end,
            3,
            0,
        )
        assert len(page) == len(messages) <= limit
        assert (page.expiries_ms is None) == (not any(m.expiry_ms for m in messages))
        assert (page.headers is None) == all(m.headers is None for m in messages)
        assert (page.deleted is None) == (not any(m.deleted for m in messages))
        after, upto, pages = page.next, boundary, pages + 1
        if page.end:
            break
        fill(tmp_store, clock, rng, 2)  # newer commits: later pages still read as of boundary
    assert pages > 1 or limit == 1000, "a snapshot of several pages"


def test_a_page_of_other_queues_only_is_empty_and_reaches_the_boundary(
    tmp_store: ShardStore,
) -> None:
    tmp_store.commit([Put(stored(OTHER, b"a"), b"1"), Put(stored(OTHER, b"b"), b"2")])
    page = read_page(replica_of(tmp_store), QUEUE, "g", 0, 0, None, 10)
    assert (page.seqs, page.keys, page.values, page.next, page.end) == ([], [], [], 2, True)
    assert (page.expiries_ms, page.headers, page.deleted) == (None, None, None)


def test_a_full_page_ends_at_its_last_message_not_the_boundary(tmp_store: ShardStore) -> None:
    tmp_store.commit([Put(stored(QUEUE, b"a"), b"1"), Put(stored(OTHER, b"b"), b"2")])
    page = read_page(replica_of(tmp_store), QUEUE, "g", 0, 0, None, 1)
    assert (page.seqs, page.next, page.end, page.boundary) == ([1], 1, False, 2)
    last = read_page(replica_of(tmp_store), QUEUE, "g", 0, 1, 2, 1)
    assert (last.seqs, last.next, last.end) == ([], 2, True)


def test_a_snapshot_ends_at_the_commit_point_not_at_what_the_tail_holds(
    tmp_store: ShardStore,
) -> None:
    # Forward, then persist: a tail may hold seqs the chain has not committed; nobody sees them.
    for key in (b"a", b"b", b"c"):
        tmp_store.commit([Put(stored(QUEUE, key), b"v")])
    page = read_page(replica_of(tmp_store, commit_point=2), QUEUE, "g", 0, 0, None, 10)
    assert (page.seqs, page.boundary, page.next, page.end) == ([1, 2], 2, 2, True)
    asked_past = read_page(replica_of(tmp_store, commit_point=2), QUEUE, "g", 0, 0, 3, 10)
    assert (asked_past.seqs, asked_past.boundary) == ([1, 2], 2)
    nothing = read_page(replica_of(tmp_store, commit_point=0), QUEUE, "g", 0, 0, None, 10)
    assert (nothing.seqs, nothing.boundary, nothing.end) == ([], 0, True)


def test_a_mark_ahead_of_the_replica_gives_an_empty_snapshot_ending_at_the_mark(
    tmp_store: ShardStore,
) -> None:
    # A high-water mark may reach a replica a moment before the seqs it names.
    tmp_store.commit([Put(stored(QUEUE, b"a"), b"1")])
    page = read_page(replica_of(tmp_store), QUEUE, "g", 5, 5, None, 10)
    assert (page.seqs, page.boundary, page.next, page.end) == ([], 5, 5, True)


# --- the reply, byte for byte --------------------------------------------------------------------


def small_page() -> Page:
    """Seqs 5 (a put with an expiry and a header) and 7 (a delete) of the snapshot (4, 9]."""
    return Page(
        shard=1,
        group="g",
        hwm=4,
        boundary=9,
        seqs=[5, 7],
        keys=[b"a", b"b"],
        values=[b"1", None],
        expiries_ms=[99, 0],
        headers=[{"h": b"x"}, None],
        deleted=[False, True],
        next=9,
        end=True,
    )


# fixmap(12) of: shard 1, group "g", hwm 4, boundary 9, then the six columns, next 9, end true.
COLUMNS_BYTES = bytes.fromhex(
    "8c"
    "a5 7368617264 01"  # "shard": 1
    "a5 67726f7570 a1 67"  # "group": "g"
    "a3 68776d 04"  # "hwm": 4
    "a8 626f756e64617279 09"  # "boundary": 9
    "a4 73657173 92 05 07"  # "seqs": [5, 7]
    "a4 6b657973 92 c4 01 61 c4 01 62"  # "keys": [bin a, bin b]
    "a6 76616c756573 92 c4 01 31 c0"  # "values": [bin 1, nil]
    "ab 65787069726965735f6d73 92 63 00"  # "expiries_ms": [99, 0]
    "a7 68656164657273 92 81 a1 68 c4 01 78 c0"  # "headers": [{"h": bin x}, nil]
    "a7 64656c65746564 92 c2 c3"  # "deleted": [false, true]
    "a4 6e657874 09"  # "next": 9
    "a3 656e64 c3"  # "end": true
)

# The list-of-objects shape of the same page: fixmap(7), "messages" between boundary and next.
ROWS_BYTES = bytes.fromhex(
    "87"
    "a5 7368617264 01"
    "a5 67726f7570 a1 67"
    "a3 68776d 04"
    "a8 626f756e64617279 09"
    "a8 6d65737361676573 92"  # "messages": [
    "86 a3 736571 05 a3 6b6579 c4 01 61 a5 76616c7565 c4 01 31"  # {seq 5, key a, value 1,
    " a9 6578706972795f6d73 63 a7 68656164657273 81 a1 68 c4 01 78"  # expiry_ms 99, headers,
    " a7 64656c65746564 c2"  # deleted false}
    "86 a3 736571 07 a3 6b6579 c4 01 62 a5 76616c7565 c0"  # {seq 7, key b, value nil,
    " a9 6578706972795f6d73 00 a7 68656164657273 c0 a7 64656c65746564 c3"  # 0, nil, true}]
    "a4 6e657874 09"
    "a3 656e64 c3"
)

EXPECTED = (
    Message(5, b"a", b"1", 99, {"h": b"x"}, False),
    Message(7, b"b", None, 0, None, True),
)


def test_the_columnar_reply_packs_to_these_bytes() -> None:
    assert msgpack.packb(page_payload(small_page(), columns=True), use_bin_type=True) == (
        COLUMNS_BYTES
    )


def test_the_list_of_objects_reply_is_unchanged() -> None:
    assert msgpack.packb(page_payload(small_page()), use_bin_type=True) == ROWS_BYTES


@pytest.mark.parametrize("raw", [COLUMNS_BYTES, ROWS_BYTES], ids=["columns", "rows"])
def test_the_client_decodes_either_shape_to_the_same_page(raw: bytes) -> None:
    page = page_from_reply(decode_body(MSGPACK, raw))
    assert (page.shard, page.group, page.hwm, page.boundary, page.next, page.end) == (
        1,
        "g",
        4,
        9,
        9,
        True,
    )
    assert page.messages == EXPECTED
    assert tuple(page.messages) == EXPECTED
    assert page.columns == PageColumns(
        (5, 7), (b"a", b"b"), (b"1", None), (99, 0), ({"h": b"x"}, None), (False, True)
    )


def test_a_columnar_reply_keeps_its_columns_and_builds_messages_as_read() -> None:
    page = page_from_reply(decode_body(MSGPACK, COLUMNS_BYTES))
    assert isinstance(page.messages, MessageView)
    assert len(page) == len(page.messages) == 2
    assert page.messages[-1] == EXPECTED[1]
    assert page.messages[0].headers == {"h": b"x"}


def test_absent_optional_columns_mean_defaults() -> None:
    page = small_page()
    plain = Page(1, "g", 4, 9, [5, 6], [b"a", b"b"], [b"1", b"2"], None, None, None, 9, True)
    payload = page_payload(plain, columns=True)
    assert (payload["expiries_ms"], payload["headers"], payload["deleted"]) == (None, None, None)
    decoded = page_from_reply(decode_body(MSGPACK, msgpack.packb(payload, use_bin_type=True)))
    assert decoded.messages == (Message(5, b"a", b"1"), Message(6, b"b", b"2"))
    assert page.messages[1] == runtime.Message(7, b"b", None, 0, None, True)


def columnar(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = msgpack.unpackb(COLUMNS_BYTES, raw=False)
    raw.update(changes)
    return raw


@pytest.mark.parametrize(
    "bad",
    [
        columnar(seqs=[7, 5]),  # out of order
        columnar(seqs=[5, 5]),  # repeated
        columnar(seqs=[4, 7]),  # not above hwm
        columnar(seqs=[5, 10]),  # past the boundary
        columnar(seqs=[5, True]),
        columnar(seqs=[5]),  # columns of different lengths
        columnar(keys=[b"a"]),
        columnar(keys=[b"a", 5]),
        columnar(values=[b"1", 2]),
        columnar(expiries_ms=[99]),
        columnar(expiries_ms=[99, "0"]),
        columnar(headers=[{"h": 5}, None]),
        columnar(headers=[None]),
        columnar(deleted=[False, 1]),
        columnar(seqs=None),
    ],
)
def test_malformed_columnar_replies_are_protocol_errors(bad: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        page_from_reply(bad)


def test_text_columns_from_a_json_reply_become_bytes() -> None:
    page = page_from_reply(columnar(keys=["a", "b"], values=["1", None], headers=None))
    assert [(m.key, m.value) for m in page.messages] == [(b"a", b"1"), (b"b", None)]


def test_a_node_page_reaches_the_client_unchanged(
    tmp_store: ShardStore, clock: ManualClock
) -> None:
    fill(tmp_store, clock, random.Random(7), 20)
    node_page = read_page(replica_of(tmp_store), QUEUE, "g", 0, 0, None, 1000)
    body = msgpack.packb(page_payload(node_page, columns=True), use_bin_type=True)
    page = page_from_reply(decode_body(MSGPACK, body))
    assert [tuple(m) for m in page.messages] == [
        (m.seq, m.key, m.value, m.expiry_ms, m.headers, m.deleted, None) for m in node_page.messages
    ]
    assert page.end
    assert len(page) > 0
