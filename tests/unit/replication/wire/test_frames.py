"""The frame codec against docs/replication-protocol.md: golden bytes, stream splits, bad input.

Golden frames are checked both ways (encode gives the bytes, decode gives the frame), then the whole
golden stream is fed cut at every position and byte by byte. Malformed input of every kind must
raise ``ProtocolError`` and leave the decoder dead, and arbitrary bytes must never raise anything
else (the fuzz contract of the sans-IO codecs, style rule 1).
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kayos import limits
from kayos.errors import InvalidRequest, LimitExceeded, ProtocolError
from kayos.replication.wire import frames as f

pytestmark = pytest.mark.unit

UUID_A = bytes(range(16))
UUID_B = bytes(range(16, 32))
CLUSTER = UUID_B

# One frame of each kind and its exact bytes, written as "length kind body".
GOLDEN: list[tuple[f.Frame, str]] = [
    (
        f.Hello(protocol_version=1, node_id="node-b", shard=7, epoch=42, role="middle"),
        "00000013 01 95 01 a66e6f64652d62 07 2a a66d6964646c65",
    ),
    (
        f.HelloOk(protocol_version=1, node_id="node-a", epoch=42),
        "0000000b 02 93 01 a66e6f64652d61 2a",
    ),
    (
        f.ErrorFrame(
            request_id=9,
            code="wrong_role",
            message="not the head of shard 7",
            redirect="node-a",
            epoch=43,
        ),
        "0000002e 03 95 09 aa77726f6e675f726f6c65"
        " b76e6f74207468652068656164206f662073686172642037 a66e6f64652d61 2b",
    ),
    (f.Ping(nonce=5), "00000003 04 91 05"),
    (f.Pong(nonce=5), "00000003 05 91 05"),
    (
        f.Subscribe(shard=7, from_seq=2901, takeover_table=((UUID_A, 0),), commit_point=2850),
        "0000001e 10 94 07 cd0b55 91 92 c410000102030405060708090a0b0c0d0e0f 00 cd0b22",
    ),
    (
        f.Subscribed(
            shard=7,
            rollback_to=2900,
            takeover_table=((UUID_A, 0), (UUID_B, 2900)),
            last_seq=3400,
        ),
        "00000034 11 94 07 cd0b54 92"
        " 92 c410000102030405060708090a0b0c0d0e0f 00"
        " 92 c410101112131415161718191a1b1c1d1e1f cd0b54"
        " cd0d48",
    ),
    (
        f.Batch(
            shard=7,
            first_seq=101,
            last_seq=104,
            txn=True,
            seqs=(101, 103),
            keys=(b"k1", b"k2"),
            values=(b"v1", None),
            expiries_ms=(0, 1_700_000_000_000),
            headers=({"h": b"x"}, None),
            meta={"hwm/c1": 99},
        ),
        "00000034 12 9a 07 65 68 c3"
        " 92 65 67"
        " 92 c4026b31 c4026b32"
        " 92 c4027631 c0"
        " 92 00 cf0000018bcfe56800"
        " 92 81a168c40178 c0"
        " 81 a668776d2f6331 63",
    ),
    (f.Ack(shard=3, durable_seq=1000), "00000006 13 92 03 cd03e8"),
    (f.Committed(shard=7, committed_seq=103), "00000004 14 92 07 67"),
    (f.CommitPoint(shard=7, committed_seq=103), "00000004 15 92 07 67"),
    (f.SnapshotRequest(shard=0), "00000003 16 91 00"),
    (
        f.SnapshotChunk(shard=0, offset=4096, data=b"\x01\x02\x03"),
        "0000000b 17 93 00 cd1000 c403010203",
    ),
    (
        f.SnapshotEnd(
            shard=0, total_bytes=8192, prefix_crc=0x1234ABCD, generation=1, last_seq=1000
        ),
        "0000000f 18 95 00 cd2000 ce1234abcd 01 cd03e8",
    ),
    (
        f.Produce(
            request_id=8,
            queue="orders",
            keys=(b"k1", b"k2"),
            values=(b"v1", None),
            expiries_ms=None,
            headers=None,
            acks=f.ACKS_ALL,
            txn=False,
            producer_id=UUID_A,
            producer_seq=5,
        ),
        "00000030 20 9a 08 a66f7264657273 92 c4026b31 c4026b32 92 c4027631 c0 c0 c0 ff c2"
        " c410000102030405060708090a0b0c0d0e0f 05",
    ),
    (f.Produced(request_id=8, first_seq=101, last_seq=102), "00000005 21 93 08 65 66"),
    (
        f.WaitCommitted(request_id=9, shard=7, seq=102, timeout_ms=500),
        "00000008 22 94 09 07 66 cd01f4",
    ),
    (f.CommittedReply(request_id=9, shard=7, committed_seq=102), "00000005 23 93 09 07 66"),
    # The authentication frames of version 3 (appended, so the indexes above stay put).
    (
        f.AuthChallenge(cluster_id=CLUSTER, nonce=b"\xaa" * 32),
        "00000036 06 92 c410 101112131415161718191a1b1c1d1e1f c420" + "aa" * 32,
    ),
    (
        f.AuthProof(cluster_id=CLUSTER, nonce=b"\xcc" * 32, mac=bytes(range(32))),
        "00000058 07 93 c410 101112131415161718191a1b1c1d1e1f c420"
        + "cc" * 32
        + " c420 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
    ),
    (
        f.AuthOk(mac=bytes(range(32, 64))),
        "00000024 08 91 c420 202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f",
    ),
    # The confirmation frames of version 4 (docs/replication-protocol.md, "Confirming a snapshot").
    (f.Confirm(nonce=5), "00000003 19 91 05"),
    (f.Confirmed(nonce=5, held=True), "00000004 1a 92 05 c3"),
    # The idle link's map of version 6 (docs/replication-protocol.md, "The metadata on an idle
    # link").
    (
        f.Metadata(shard=7, seq=2900, meta={"hwm/c1": 99}),
        "0000000f 1b 93 07 cd0b54 81 a668776d2f6331 63",
    ),
    # A learner's resumed store copy of version 8 (docs/replication-protocol.md, "Store
    # snapshots").
    (
        f.SnapshotResume(
            shard=0, offset=8192, store_uuid=b"\x11" * 16, generation=1, header_crc=0x1234ABCD
        ),
        "0000001e 1c 95 00 cd2000 c410" + "11" * 16 + " 01 ce1234abcd",
    ),
    # A client's proof of its credential, version 9 (docs/security.md, "Proving a credential").
    (
        f.ClientProof(name="app", nonce=b"\xcc" * 32, proof=bytes(range(32))),
        "0000004a 24 93 a3617070 c420"
        + "cc" * 32
        + " c420 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
    ),
]

GOLDEN_FRAMES = [frame for frame, _ in GOLDEN]
GOLDEN_STREAM = b"".join(bytes.fromhex(text) for _, text in GOLDEN)


def spec_of(frame: f.Frame) -> f.FrameSpec:
    return next(spec for spec in f.FRAME_TABLE if spec.frame_type is type(frame))


def field_values(frame: f.Frame) -> list[Any]:
    return [getattr(frame, name) for name in spec_of(frame).field_names]


def raw_frame(kind: int, body: bytes) -> bytes:
    """Frame bytes built by hand, so tests can send what ``encode`` would never produce."""
    return struct.pack(">IB", len(body) + 1, kind) + body


def raw_body(fields: list[Any]) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


def decode_fails(data: bytes, match: str) -> f.FrameDecoder:
    decoder = f.FrameDecoder()
    with pytest.raises(ProtocolError, match=match):
        decoder.feed(data)
    assert decoder.failed
    return decoder


# --- the table -----------------------------------------------------------------------------------


def test_golden_covers_every_kind_once() -> None:
    # Every row of the declared table has exactly one golden frame, so a new kind needs new bytes.
    kinds = [spec_of(frame).kind for frame in GOLDEN_FRAMES]
    assert sorted(kinds) == sorted(spec.kind for spec in f.FRAME_TABLE)
    assert len(set(kinds)) == len(kinds)


def test_table_matches_protocol_document() -> None:
    # The kind numbers and names are the ones docs/replication-protocol.md declares ("Frame table").
    assert {spec.kind: spec.name for spec in f.FRAME_TABLE} == {
        1: "HELLO",
        2: "HELLO_OK",
        3: "ERROR",
        4: "PING",
        5: "PONG",
        6: "AUTH_CHALLENGE",
        7: "AUTH_PROOF",
        8: "AUTH_OK",
        16: "SUBSCRIBE",
        17: "SUBSCRIBED",
        18: "BATCH",
        19: "ACK",
        20: "COMMITTED",
        21: "COMMIT_POINT",
        22: "SNAPSHOT_REQUEST",
        23: "SNAPSHOT_CHUNK",
        24: "SNAPSHOT_END",
        25: "CONFIRM",
        26: "CONFIRMED",
        27: "METADATA",
        28: "SNAPSHOT_RESUME",
        32: "PRODUCE",
        33: "PRODUCED",
        34: "WAIT_COMMITTED",
        35: "COMMITTED_REPLY",
        36: "CLIENT_PROOF",
    }
    for spec in f.FRAME_TABLE:
        since = {
            "COMMIT_POINT": 2,
            "AUTH_CHALLENGE": 3,
            "AUTH_PROOF": 3,
            "AUTH_OK": 3,
            "SNAPSHOT_REQUEST": 3,
            "SNAPSHOT_CHUNK": 3,
            "SNAPSHOT_END": 3,
            "CONFIRM": 4,
            "CONFIRMED": 4,
            "METADATA": 6,
            "SNAPSHOT_RESUME": 8,
            "CLIENT_PROOF": 9,
        }
        assert spec.since_version == since.get(spec.name, 1)
        # Fields appended to a released frame, with the version that added them.
        appended = {
            ("SUBSCRIBE", "commit_point"): 5,
            ("PRODUCE", "producer_id"): 7,
            ("PRODUCE", "producer_seq"): 7,
        }
        for field in spec.fields:
            assert field.since_version == appended.get((spec.name, field.name), spec.since_version)


# --- golden bytes, both ways ---------------------------------------------------------------------


@pytest.mark.parametrize(("frame", "text"), GOLDEN, ids=[spec_of(x).name for x in GOLDEN_FRAMES])
def test_golden_encode(frame: f.Frame, text: str) -> None:
    assert f.encode(frame).hex() == bytes.fromhex(text).hex()


@pytest.mark.parametrize(("frame", "text"), GOLDEN, ids=[spec_of(x).name for x in GOLDEN_FRAMES])
def test_golden_decode(frame: f.Frame, text: str) -> None:
    decoded = f.decode(bytes.fromhex(text))
    assert decoded == [frame]
    assert type(decoded[0]) is type(frame)


def test_ack_example_in_protocol_document() -> None:
    # The worked example under "Framing" in docs/replication-protocol.md.
    assert f.encode(f.Ack(shard=3, durable_seq=1000)) == bytes.fromhex("00000006 13 92 03 cd 03 e8")


def test_decoded_columns_are_tuples_of_bytes() -> None:
    # Columns pass through msgpack as tuples; keys and values stay bytes, not str.
    batch = f.decode(f.encode(GOLDEN_FRAMES[7]))[0]
    assert isinstance(batch, f.Batch)
    assert type(batch.keys) is tuple
    assert all(type(key) is bytes for key in batch.keys)
    assert batch.values == (b"v1", None)


# --- every split of the stream -------------------------------------------------------------------


def test_stream_split_at_every_position() -> None:
    for cut in range(len(GOLDEN_STREAM) + 1):
        decoder = f.FrameDecoder()
        frames = decoder.feed(GOLDEN_STREAM[:cut]) + decoder.feed(GOLDEN_STREAM[cut:])
        assert frames == GOLDEN_FRAMES, f"cut at {cut}"
        assert decoder.buffered_bytes == 0


def test_stream_byte_by_byte() -> None:
    decoder = f.FrameDecoder()
    frames: list[f.Frame] = []
    for index in range(len(GOLDEN_STREAM)):
        frames += decoder.feed(GOLDEN_STREAM[index : index + 1])
    assert frames == GOLDEN_FRAMES
    assert decoder.buffered_bytes == 0


def test_trailing_partial_frame_is_kept() -> None:
    # Whatever part of a next frame follows whole frames stays buffered until the rest arrives.
    last = bytes.fromhex(GOLDEN[7][1])
    for cut in range(len(last)):
        decoder = f.FrameDecoder()
        assert decoder.feed(GOLDEN_STREAM + last[:cut]) == GOLDEN_FRAMES
        assert decoder.buffered_bytes == cut
        assert decoder.feed(last[cut:]) == [GOLDEN_FRAMES[7]]
        assert decoder.buffered_bytes == 0


def test_empty_feed_returns_nothing() -> None:
    decoder = f.FrameDecoder()
    assert decoder.feed(b"") == []
    assert decoder.feed(GOLDEN_STREAM[:3]) == []
    assert decoder.feed(b"") == []
    assert decoder.buffered_bytes == 3


def test_decode_refuses_trailing_partial_frame() -> None:
    with pytest.raises(ProtocolError, match="incomplete frame"):
        f.decode(GOLDEN_STREAM + GOLDEN_STREAM[:5])


# --- round trips ---------------------------------------------------------------------------------

u16 = st.integers(0, 2**16 - 1)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
seq = st.integers(1, 2**64 - 1)
text = st.text(max_size=20)
blob = st.binary(max_size=20)
takeover_table = st.lists(
    st.tuples(st.binary(min_size=16, max_size=16), u64),
    max_size=5,
    unique_by=lambda entry: entry[0],
).map(lambda entries: tuple(sorted(entries, key=lambda entry: entry[1])))
headers_map = st.dictionaries(text, blob, max_size=3)
meta = st.dictionaries(text, st.one_of(u64, blob, st.none()), max_size=5)


@st.composite
def columns(draw: st.DrawFn, size: int) -> dict[str, Any]:
    return {
        "keys": tuple(draw(st.lists(blob, min_size=size, max_size=size))),
        "values": tuple(draw(st.lists(st.none() | blob, min_size=size, max_size=size))),
        "expiries_ms": draw(st.none() | st.lists(u64, min_size=size, max_size=size).map(tuple)),
        "headers": draw(
            st.none() | st.lists(st.none() | headers_map, min_size=size, max_size=size).map(tuple)
        ),
    }


@st.composite
def batches(draw: st.DrawFn) -> f.Batch:
    first_seq = draw(st.integers(1, 2**64 - 100))
    last_seq = draw(st.integers(first_seq, min(first_seq + 50, 2**64 - 1)))
    seqs = sorted(draw(st.sets(st.integers(first_seq, last_seq), max_size=12)))
    return f.Batch(
        shard=draw(u32),
        first_seq=first_seq,
        last_seq=last_seq,
        txn=draw(st.booleans()),
        seqs=tuple(seqs),
        meta=draw(st.none() | meta),
        **draw(columns(len(seqs))),
    )


@st.composite
def produces(draw: st.DrawFn) -> f.Produce:
    producer_id = draw(st.none() | st.binary(min_size=16, max_size=16))
    return f.Produce(
        request_id=draw(u64),
        queue=draw(text),
        acks=draw(st.sampled_from([f.ACKS_NONE, f.ACKS_HEAD, f.ACKS_ALL])),
        txn=draw(st.booleans()),
        producer_id=producer_id,
        producer_seq=0 if producer_id is None else draw(u64),
        **draw(columns(draw(st.integers(0, 12)))),
    )


@st.composite
def produced(draw: st.DrawFn) -> f.Produced:
    first_seq = draw(st.integers(0, 2**64 - 1))
    last_seq = 0 if first_seq == 0 else draw(st.integers(first_seq, 2**64 - 1))
    return f.Produced(request_id=draw(u64), first_seq=first_seq, last_seq=last_seq)


any_frame: st.SearchStrategy[f.Frame] = st.one_of(
    st.builds(
        f.Hello,
        st.integers(1, 2**16 - 1),
        text,
        st.none() | u32,
        u64,
        st.sampled_from(sorted(f.ROLES)),
    ),
    st.builds(f.HelloOk, st.integers(1, 2**16 - 1), text, u64),
    st.builds(f.ErrorFrame, st.none() | u64, text, text, st.none() | text, u64),
    st.builds(f.Ping, u64),
    st.builds(f.Pong, u64),
    st.builds(f.Subscribe, u32, seq, takeover_table),
    st.builds(f.Subscribed, u32, st.none() | u64, takeover_table, u64),
    batches(),
    st.builds(f.Ack, u32, u64),
    st.builds(f.Committed, u32, u64),
    st.builds(f.CommitPoint, u32, u64),
    st.builds(f.Metadata, u32, u64, st.dictionaries(text, st.one_of(u64, blob), max_size=5)),
    produces(),
    produced(),
    st.builds(f.WaitCommitted, u64, u32, u64, u32),
    st.builds(f.CommittedReply, u64, u32, u64),
)


@given(any_frame)
def test_round_trip(frame: f.Frame) -> None:
    data = f.encode(frame)
    assert f.decode(data) == [frame]
    (length,) = struct.unpack(">I", data[:4])
    assert length == len(data) - 4


@given(st.lists(any_frame, max_size=6), st.data())
def test_round_trip_stream_in_random_chunks(frame_list: list[f.Frame], data: st.DataObject) -> None:
    stream = b"".join(f.encode(frame) for frame in frame_list)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    decoder = f.FrameDecoder()
    decoded: list[f.Frame] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        decoded += decoder.feed(stream[start:end])
    assert decoded == frame_list
    assert decoder.buffered_bytes == 0


# --- malformed input -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [0, 9, 15, 29, 31, 37, 255])
def test_unknown_kind(kind: int) -> None:
    decode_fails(raw_frame(kind, raw_body([5])), match=f"unknown frame kind {kind}")


@pytest.mark.parametrize("cut", [1, 2, 5, 20])
def test_truncated_body(cut: int) -> None:
    # The length prefix is consistent, but the msgpack array inside ends early.
    body = bytes.fromhex(GOLDEN[7][1])[5:]
    decode_fails(raw_frame(18, body[:-cut]), match="BATCH: body is not one msgpack value")


def test_bytes_after_body() -> None:
    body = bytes.fromhex(GOLDEN[8][1])[5:]
    decode_fails(raw_frame(19, body + b"\xc0"), match="ACK: body is not one msgpack value")


@pytest.mark.parametrize(
    ("kind", "body"), [(18, b"\x80"), (19, b"\x05"), (19, b"\xc0"), (19, b"\xa3abc")]
)
def test_body_not_an_array(kind: int, body: bytes) -> None:
    decode_fails(raw_frame(kind, body), match="body is .*, not an array")


@pytest.mark.parametrize(("frame", "text"), GOLDEN, ids=[spec_of(x).name for x in GOLDEN_FRAMES])
def test_wrong_field_count(frame: f.Frame, text: str) -> None:
    spec = spec_of(frame)
    values = field_values(frame)
    count = len(values)
    decode_fails(
        raw_frame(spec.kind, raw_body(values[:-1])), f"{spec.name}: {count - 1} fields, expected"
    )
    decode_fails(
        raw_frame(spec.kind, raw_body([*values, 0])), f"{spec.name}: {count + 1} fields, expected"
    )


# Values each field type must refuse; every one is valid msgpack, so only the table rejects them.
BAD_VALUES: dict[str, list[Any]] = {
    "u16": [-1, 2**16, True, 1.0, "1", b"1", None],
    "u32": [-1, 2**32, False, 1.5, "1", None],
    "u64": [-1, -(2**63), True, 2.0, "1", b"\x01", None, []],
    "u32 | nil": [-1, 2**32, True, "7"],
    "u64 | nil": [-1, True, "9", b""],
    "str": [b"node", 5, None, True],
    "uuid": [UUID_A[:15], UUID_A + b"\x00", "0123456789abcdef", None, 16],
    "uuid | nil": [b"", UUID_A[:15], UUID_A + b"\x00", UUID_A.hex(), 16, False],
    "nonce": [b"\x00" * 31, b"\x00" * 33, "a" * 32, None, [0] * 32],
    "mac": [b"\x00" * 31, b"\x00" * 33, "m" * 32, None, 0],
    "str | nil": [b"node", 5, False],
    "role": ["leader", "", b"tail", 1, None],
    "bool": [0, 1, None, "true"],
    "bin (1 .. snapshot_chunk_bytes_max)": [
        b"",
        b"x" * (limits.snapshot_chunk_bytes_max + 1),
        "text",
        None,
    ],
    "acks (0, 1 or -1)": [2, -2, 255, True, None, "all"],
    "takeover": [
        None,
        [[UUID_A]],
        [[UUID_A, 0, 1]],
        [[UUID_A[:15], 0]],
        [[UUID_A + b"\x00", 0]],
        [["0123456789abcdef", 0]],
        [[UUID_A, -1]],
        [[UUID_A, 5], [UUID_B, 4]],
        [[UUID_A, 0], [UUID_A, 7]],
        [[UUID_A, i] for i in range(limits.takeover_table_entries_max + 1)],
        {"a": 1},
    ],
    "[u64]": [None, [1, -1], [True], [1.0], ["1"], [None], 5],
    "[bin]": [None, ["k"], [None], [1], b"k"],
    "[bin | nil]": [None, ["v"], [1], [True]],
    "[u64] | nil": [[1, -1], [True], [None], 0],
    "[headers | nil] | nil": [[{1: b"x"}], [{"h": "x"}], [{"h": 1}], [[]], [b""], {}],
    "meta": [None, [], {1: 1}, {"k": -1}, {"k": 1.5}, {"k": "v"}, {"k": [1]}],
    "meta | nil": [[], {1: 1}, {"k": -1}, {"k": 1.5}, {"k": "v"}, {"k": [1]}],
}


def wrong_type_cases() -> list[tuple[f.Frame, str, Any]]:
    cases: list[tuple[f.Frame, str, Any]] = []
    for frame in GOLDEN_FRAMES:
        for field in spec_of(frame).fields:
            cases.extend((frame, field.name, bad) for bad in BAD_VALUES[field.wire.name])
    return cases


def test_bad_values_cover_every_field_type() -> None:
    names = {field.wire.name for spec in f.FRAME_TABLE for field in spec.fields}
    assert names == set(BAD_VALUES)


@pytest.mark.parametrize(("frame", "name", "bad"), wrong_type_cases())
def test_wrong_field_type(frame: f.Frame, name: str, bad: Any) -> None:
    # Fields are checked in table order, so the first complaint names the field we broke, unless
    # the bad value is a container the frame has no room for: the container budget speaks first.
    spec = spec_of(frame)
    values = field_values(frame)
    values[spec.field_names.index(name)] = bad
    decode_fails(
        raw_frame(spec.kind, raw_body(values)),
        match=rf"{spec.name}(\.{name}: expected|: body holds more)",
    )


def batch_body(**changes: Any) -> bytes:
    frame = GOLDEN_FRAMES[7]
    assert isinstance(frame, f.Batch)
    values = field_values(frame)
    names = spec_of(frame).field_names
    for name, value in changes.items():
        values[names.index(name)] = value
    return raw_frame(18, raw_body(values))


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"first_seq": 0}, "starts at 0"),
        ({"first_seq": 105}, "is empty"),
        ({"keys": [b"k1"]}, "columns differ in length"),
        ({"values": [b"v1", None, None]}, "columns differ in length"),
        ({"expiries_ms": [0]}, "columns differ in length"),
        ({"headers": [None]}, "columns differ in length"),
        ({"seqs": [100, 103]}, "leave 101..104"),
        ({"seqs": [101, 105]}, "leave 101..104"),
        ({"seqs": [103, 103]}, "not strictly increasing"),
        ({"seqs": [104, 103]}, "leave 101..104"),
    ],
)
def test_batch_relations(changes: dict[str, Any], match: str) -> None:
    # docs/replication-protocol.md, BATCH: equal columns, seqs increasing inside first..last.
    decode_fails(batch_body(**changes), match=f"BATCH: .*{match}")


def test_batch_seqs_strictly_increasing_in_the_middle() -> None:
    body = batch_body(
        last_seq=110,
        seqs=[101, 105, 104, 110],
        keys=[b"a"] * 4,
        values=[None] * 4,
        expiries_ms=None,
        headers=None,
    )
    decode_fails(body, match="BATCH: seqs are not strictly increasing")


def test_empty_batch_covers_a_range() -> None:
    # During catch-up a range may hold no entry at all (docs, BATCH).
    frame = f.Batch(7, 5, 9, False, (), (), (), None, None, None)
    assert f.decode(f.encode(frame)) == [frame]


@pytest.mark.parametrize(
    ("kind", "fields", "match"),
    [
        (
            32,
            [1, "q", [b"a", b"b"], [b"v"], None, None, 1, False, None, 0],
            "PRODUCE: columns differ",
        ),
        (32, [1, "q", [b"a"], [b"v"], [0, 0], None, 1, False, None, 0], "PRODUCE: columns differ"),
        (33, [1, 0, 5], "PRODUCED: range 0..5"),
        (33, [1, 6, 5], "PRODUCED: range 6..5"),
        (16, [1, 0, [], 0], "SUBSCRIBE: from_seq must be at least 1"),
        (1, [0, "n", None, 0, "client"], "HELLO: protocol_version 0"),
        (2, [0, "n", 0], "HELLO_OK: protocol_version 0"),
        (27, [7, 5, {"hwm/c1": None}], "METADATA: a whole map deletes no key"),
        (
            32,
            [1, "q", [b"a"], [b"v"], None, None, 1, False, None, 5],
            "PRODUCE: producer_seq without a producer_id",
        ),
    ],
)
def test_other_relations(kind: int, fields: list[Any], match: str) -> None:
    decode_fails(raw_frame(kind, raw_body(fields)), match=match)


def test_invalid_utf8_in_str_field() -> None:
    body = b"\x93\x01\xa2\xff\xfe\x00"  # HELLO_OK with node_id = bad UTF-8
    decode_fails(raw_frame(2, body), match="HELLO_OK: body is not one msgpack value")


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b"\x91" * 5000 + b"\xc0", "StackError"),
        (b"\x92\x03\xc1", "FormatError"),
        (b"\x92\x03\xc7\x05\xff" + bytes(5), "invalid timestamp data"),
        (b"\x92\x03\xd7\xff" + b"\xff" * 8, "nanoseconds must be"),
        (b"\x92\x03\xdb\xff\xff\xff\xff", "incomplete input"),
        (b"\xdd\xff\xff\xff\xff", "exceeds max_array_len"),
    ],
)
def test_hostile_msgpack(body: bytes, detail: str) -> None:
    # Depth bombs, reserved bytes, bad timestamps and lying lengths all surface as ProtocolError.
    decode_fails(raw_frame(19, body), match=f"ACK: body is not one msgpack value: .*{detail}")


def test_ext_type_is_refused() -> None:
    body = raw_body([3, msgpack.ExtType(5, b"\x00")])
    decode_fails(raw_frame(19, body), match=r"ACK\.durable_seq: expected u64, got ExtType")


def test_unhashable_map_key() -> None:
    body = b"\x9a" + b"\x07\x65\x68\xc3" + b"\x90\x90\x90\xc0\xc0" + b"\x81\x81\xa1k\x01\x01"
    decode_fails(raw_frame(18, body), match="BATCH: body is not one msgpack value")


def test_meta_entries_bound() -> None:
    meta = {str(i): i for i in range(limits.frame_meta_entries_max + 1)}
    decode_fails(batch_body(meta=meta), match=r"BATCH\.meta: expected meta \| nil, got dict of")


def test_column_entries_bound() -> None:
    column = [b""] * (limits.batch_entries_max + 1)
    body = raw_body([1, "q", column, column, None, None, 0, False])
    decode_fails(raw_frame(32, body), match="PRODUCE: body is not one msgpack value")


def test_nested_containers_over_budget() -> None:
    # An ACK has no container fields, so a nested array is refused while msgpack still builds it.
    decode_fails(raw_frame(19, raw_body([[[]], 1])), match="ACK: body holds more arrays")
    decode_fails(raw_frame(16, raw_body([1, 1, [{}], 0])), match="SUBSCRIBE: body holds more maps")
    # A BATCH may hold one map per entry (headers) and one more (meta), no matter where they are.
    maps = [{} for _ in range(limits.batch_entries_max)]
    decode_fails(batch_body(values=maps, headers=[{}, {}]), match="BATCH: body holds more maps")


@pytest.mark.parametrize("length", [0, 1, limits.frame_bytes_max + 1, 2**32 - 1])
def test_length_out_of_bounds_fails_on_the_prefix(length: int) -> None:
    # The prefix alone decides: the decoder never waits for (or buffers) a body it will refuse.
    decoder = decode_fails(struct.pack(">I", length), match=f"frame length {length} outside")
    assert decoder.buffered_bytes == 0


def test_configured_frame_bound() -> None:
    decoder = f.FrameDecoder(frame_bytes_max=10)
    assert decoder.feed(f.encode(f.Ack(1, 2))) == [f.Ack(1, 2)]
    with pytest.raises(ProtocolError, match=r"frame length 19 outside 2\.\.10"):
        decoder.feed(bytes.fromhex(GOLDEN[0][1]))


def test_decoder_stays_dead() -> None:
    # After one error every feed raises, even of valid bytes or of nothing (h11's ERROR state).
    decoder = decode_fails(raw_frame(9, raw_body([1])), match="unknown frame kind")
    for data in (b"", GOLDEN_STREAM):
        with pytest.raises(ProtocolError, match="decoder failed earlier: unknown frame kind 9"):
            decoder.feed(data)


def test_frames_before_an_error_in_the_same_feed_are_dropped() -> None:
    decoder = f.FrameDecoder()
    with pytest.raises(ProtocolError):
        decoder.feed(GOLDEN_STREAM + raw_frame(0, raw_body([])))
    assert decoder.failed
    assert decoder.buffered_bytes == 0


# --- frames at an older protocol version (docs/replication-protocol.md, "Compatibility") --------

PRODUCE_V7 = GOLDEN_FRAMES[14]
# The same PRODUCE at version 6 (docs/replication-protocol.md, PRODUCE): 8 fields, no producer.
PRODUCE_V6_HEX = "0000001d 20 98 08 a66f7264657273 92 c4026b31 c4026b32 92 c4027631 c0 c0 c0 ff c2"


def at_version(frame: f.Frame, version: int) -> f.Frame:
    """``frame`` as a peer at ``version`` sees it: the fields appended since hold defaults."""
    spec = spec_of(frame)
    defaults = {
        field.name: default
        for field, default in zip(spec.fields, f.DEFAULTS_BY_KIND[spec.kind], strict=True)
        if field.since_version > version
    }
    return dataclasses.replace(frame, **defaults)  # type: ignore[type-var]


def test_a_produce_at_version_6_has_no_producer_fields() -> None:
    assert isinstance(PRODUCE_V7, f.Produce)
    assert f.encode(PRODUCE_V7, 6).hex() == bytes.fromhex(PRODUCE_V6_HEX).hex()
    (old,) = f.decode(bytes.fromhex(PRODUCE_V6_HEX), 6)
    assert old == dataclasses.replace(PRODUCE_V7, producer_id=None, producer_seq=0)


def test_a_decoder_expects_exactly_the_fields_of_its_version() -> None:
    # Rule 5: never a guess from the field count.
    with pytest.raises(ProtocolError, match="PRODUCE: 8 fields, expected 10 at protocol version 7"):
        f.decode(bytes.fromhex(PRODUCE_V6_HEX), 7)
    with pytest.raises(ProtocolError, match="PRODUCE: 10 fields, expected 8 at protocol version 6"):
        f.decode(bytes.fromhex(GOLDEN[14][1]), 6)


@pytest.mark.parametrize("version", range(f.PROTOCOL_VERSION_MIN, f.PROTOCOL_VERSION + 1))
def test_every_version_decodes_what_it_encodes(version: int) -> None:
    for frame in GOLDEN_FRAMES:
        spec = spec_of(frame)
        if spec.since_version > version:
            with pytest.raises(
                InvalidRequest, match=f"{spec.name} does not exist in protocol version {version}"
            ):
                f.encode(frame, version)
            decode_fails_at = f.FrameDecoder(protocol_version=version)
            with pytest.raises(ProtocolError, match=f"{spec.name} does not exist in protocol"):
                decode_fails_at.feed(f.encode(frame))
            continue
        assert f.decode(f.encode(frame, version), version) == [at_version(frame, version)]


@pytest.mark.parametrize("version", [0, f.PROTOCOL_VERSION + 1])
def test_a_version_outside_the_protocols_is_refused(version: int) -> None:
    with pytest.raises(InvalidRequest, match=f"protocol version {version} outside"):
        f.encode(PRODUCE_V7, version)


def test_a_decoder_switches_version_for_the_frames_after() -> None:
    # A node's binary port decodes a client's frames at the version its HELLO_OK picked.
    decoder = f.FrameDecoder()
    hello = f.Hello(6, "client", None, 0, "client")
    data = f.encode(hello) + bytes.fromhex(PRODUCE_V6_HEX)
    assert decoder.feed(data[: len(f.encode(hello))]) == [hello]
    decoder.protocol_version = 6
    (produce,) = decoder.feed(data[len(f.encode(hello)) :])
    assert isinstance(produce, f.Produce)
    assert produce.producer_id is None


def test_a_local_produce_checks_its_producer() -> None:
    with pytest.raises(InvalidRequest, match=r"PRODUCE\.producer_id: expected uuid \| nil"):
        f.Produce(1, "q", (b"a",), (b"v",), None, None, 1, False, b"short", 1)
    with pytest.raises(InvalidRequest, match="producer_seq without a producer_id"):
        f.Produce(1, "q", (b"a",), (b"v",), None, None, 1, False, None, 1)
    with pytest.raises(InvalidRequest, match=r"PRODUCE\.producer_seq: expected u64"):
        f.Produce(1, "q", (b"a",), (b"v",), None, None, 1, False, UUID_A, -1)


# --- local construction and encoding -------------------------------------------------------------


def test_local_frames_are_validated() -> None:
    # A frame built in-process obeys the same table; the failure is an InvalidRequest.
    with pytest.raises(InvalidRequest, match=r"ACK\.durable_seq: expected u64, got int -1"):
        f.Ack(shard=1, durable_seq=-1)
    with pytest.raises(InvalidRequest, match="columns differ in length"):
        f.Produce(1, "q", (b"a",), (), None, None, f.ACKS_HEAD, False)
    with pytest.raises(InvalidRequest, match=r"PING\.nonce: expected u64, got bool True"):
        f.Ping(nonce=True)
    with pytest.raises(InvalidRequest, match=r"BATCH\.keys: expected \[bin\], got list of 0"):
        f.Batch(1, 1, 1, False, (), [], (), None, None, None)  # type: ignore[arg-type]


def test_encode_refuses_an_oversize_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    frame = f.Produce(1, "q", (b"k",), (b"v" * 100,), None, None, f.ACKS_HEAD, False)
    monkeypatch.setattr(limits, "frame_bytes_max", 64)
    with pytest.raises(
        LimitExceeded, match=r"PRODUCE: frame of 1\d\d bytes is over frame_bytes_max"
    ):
        f.encode(frame)


def test_frames_are_immutable() -> None:
    frame = f.Ack(shard=1, durable_seq=2)
    with pytest.raises(AttributeError):
        frame.durable_seq = 3  # type: ignore[misc]


# --- fuzz: anything either decodes or raises ProtocolError --------------------------------------


def feed_expecting_only_protocol_errors(data: bytes) -> None:
    decoder = f.FrameDecoder()
    try:
        frames = decoder.feed(data)
    except ProtocolError:
        assert decoder.failed
        return
    for frame in frames:
        assert f.decode(f.encode(frame)) == [frame]


@settings(max_examples=500)
@given(st.binary(max_size=200))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    feed_expecting_only_protocol_errors(data)


@settings(max_examples=500)
@given(st.sampled_from([spec.kind for spec in f.FRAME_TABLE]), st.binary(max_size=200))
def test_fuzz_arbitrary_body_of_known_kind(kind: int, body: bytes) -> None:
    feed_expecting_only_protocol_errors(raw_frame(kind, body))


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=5)
    | st.binary(max_size=17),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=3) | st.integers(0, 3), children, max_size=3)
    ),
    max_leaves=20,
)


@settings(max_examples=500)
@given(
    st.sampled_from([spec.kind for spec in f.FRAME_TABLE]), st.lists(msgpack_values, max_size=11)
)
def test_fuzz_well_formed_msgpack_of_any_shape(kind: int, fields: list[Any]) -> None:
    # Well-formed msgpack gets past the parser to the table's checks: they too raise only
    # ProtocolError.
    feed_expecting_only_protocol_errors(raw_frame(kind, raw_body(fields)))


@settings(max_examples=300)
@given(any_frame, st.integers(0, 200), st.binary(min_size=1, max_size=4))
def test_fuzz_mutated_valid_frames(frame: f.Frame, position: int, noise: bytes) -> None:
    data = bytearray(f.encode(frame))
    position %= len(data)
    data[position : position + len(noise)] = noise
    feed_expecting_only_protocol_errors(bytes(data))


@given(any_frame)
def test_an_unchecked_frame_equals_the_checked_one_and_encodes_the_same(frame: f.Frame) -> None:
    fields = [getattr(frame, name) for name in spec_of(frame).field_names]
    twin = type(frame).unchecked(*fields)
    assert twin == frame
    assert f.encode(twin) == f.encode(frame)


def test_an_unchecked_frame_needs_every_field() -> None:
    with pytest.raises(ValueError, match="shorter"):
        f.Ack.unchecked(3)
