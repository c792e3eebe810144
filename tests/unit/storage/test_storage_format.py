"""Golden bytes for the shard store format (docs/storage-format.md is normative).

Goal: any change to how chunks, nodes, headers or block layout are encoded fails here, so a format
change cannot slip in without a new format version. Each golden is written out in hex and
annotated; the decoders must read it back to the same value.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kayos import limits
from kayos.clock import ManualClock
from kayos.errors import CorruptionError
from kayos.storage.disk import format as fmt
from kayos.storage.engine import ShardStore, StoreOptions

pytestmark = pytest.mark.unit

if TYPE_CHECKING:
    from pathlib import Path

UUID = bytes(range(16))
BLOCK = 4096


def golden(text: str) -> bytes:
    """Hex with spaces, newlines and ``#`` comments allowed."""
    lines = (line.split("#", 1)[0] for line in text.splitlines())
    return bytes.fromhex("".join(lines))


# --- chunks ("Chunks") --------------------------------------------------------------------------


def test_crc32c_is_castagnoli() -> None:
    # The standard check value of CRC-32C (RFC 3720, B.4): not zlib's CRC-32 (0xCBF43926).
    assert fmt.crc32c(b"123456789") == 0xE3069283


VALUE_CHUNK = golden(
    """
    00000006  # body length: type byte + 5 payload bytes, big-endian
    bc957a29  # CRC32C of the body
    03        # chunk type: value
    68656c6c6f  # "hello"
    """
)


def test_value_chunk_golden() -> None:
    assert fmt.frame_chunk(fmt.CHUNK_VALUE, b"hello") == VALUE_CHUNK
    length, crc = fmt.parse_chunk_prefix(VALUE_CHUNK[:8], path="golden", offset=0)
    assert length == 6
    chunk_type, payload = fmt.check_chunk_body(VALUE_CHUNK[8:], crc, path="golden", offset=0)
    assert (chunk_type, payload) == (fmt.CHUNK_VALUE, b"hello")


@pytest.mark.parametrize(
    ("prefix", "reason"),
    [
        (bytes.fromhex("00000000 00000000"), "zero length"),
        (bytes.fromhex("80000006 bc957a29"), "top bit set"),
        ((limits.chunk_bytes_max + 1).to_bytes(4, "big") + bytes(4), "over chunk_bytes_max"),
    ],
)
def test_impossible_chunk_lengths_are_corruption(prefix: bytes, reason: str) -> None:
    with pytest.raises(CorruptionError) as caught:
        fmt.parse_chunk_prefix(prefix, path="f", offset=77)
    assert caught.value.offset == 77, reason


def test_chunk_body_checks_crc_type_and_expected_type() -> None:
    crc = int.from_bytes(VALUE_CHUNK[4:8], "big")
    body = VALUE_CHUNK[8:]
    with pytest.raises(CorruptionError, match="CRC32C"):
        fmt.check_chunk_body(body[:-1] + b"O", crc, path="f", offset=5)
    unknown = b"\x09hello"
    with pytest.raises(CorruptionError, match="unknown chunk type"):
        fmt.check_chunk_body(unknown, fmt.crc32c(unknown), path="f", offset=5)
    with pytest.raises(CorruptionError, match="expected chunk type"):
        fmt.check_chunk_body(body, crc, path="f", offset=5, expect=fmt.CHUNK_LEAF)


def test_oversize_chunk_is_refused_when_framed() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        fmt.frame_chunk(fmt.CHUNK_VALUE, bytes(limits.chunk_bytes_max))


# --- nodes ("Leaf", "Interior") -----------------------------------------------------------------

LEAF = fmt.Leaf(
    seqs=[7, 8, 9],
    keys=[b"a", b"bb", b"a"],
    vals=[b"x", 4242, None],  # inline, out of line at position 4242, delete
    prevs=[0, 0, 7],
    flags=[0, fmt.FLAG_VALUE_OUT_OF_LINE, fmt.FLAG_DELETE | fmt.FLAG_BATCH_END],
    sizes=[2, 3000, 1],
    expiries=[0, 1_700_000_000_000, 0],
    headers=[None, {"h": b"v"}, None],
)
LEAF_CHUNK = golden(
    """
    0000003c f9087d4b 01  # length 60, CRC32C, type leaf
    98                    # array of 8 columns
    93 07 08 09           # seqs
    93 c40161 c4026262 c40161  # keys (bin)
    93 c40178 cd1092 c0   # vals: bin "x", position 4242, nil
    93 00 00 07           # prevs
    93 00 02 05           # flags: -, out of line, delete|batch end
    93 02 cd0bb8 01       # sizes
    93 00 cf0000018bcfe56800 00  # expiries (ms since the epoch)
    93 c0 81a168c40176 c0 # headers: nil, {"h": b"v"}, nil
    """
)
# Columns that are all zero or all absent are written as nil.
SMALL_LEAF = fmt.Leaf([1], [b"k"], [b"v"], [0], [fmt.FLAG_BATCH_END], [2], None, None)
SMALL_LEAF_CHUNK = golden(
    """
    00000014 c25e6466 01
    98 9101 91c4016b 91c40176 9100 9104 9102 c0 c0
    """
)


def test_leaf_golden() -> None:
    assert fmt.encode_leaf(LEAF) == LEAF_CHUNK
    assert fmt.encode_leaf(SMALL_LEAF) == SMALL_LEAF_CHUNK
    for leaf, chunk in ((LEAF, LEAF_CHUNK), (SMALL_LEAF, SMALL_LEAF_CHUNK)):
        decoded = fmt.decode_node(fmt.CHUNK_LEAF, chunk[9:], path="golden", offset=0)
        assert decoded == leaf


# Version 2: a commit-end marker (seq 3 ended a commit and was dropped by compaction) before the
# entry that superseded it (docs/storage-format.md, "Commit boundaries").
MARKER_LEAF = fmt.Leaf(
    [3, 4], [b"c", b"c"], [None, b"v4"], [0, 3], [fmt.COMMIT_MARKER_FLAGS, 4], [0, 3], None, None
)
MARKER_LEAF_CHUNK = golden(
    """
    0000001d 3801cfd4 01  # length 29, CRC32C, type leaf
    98 92 03 04           # seqs
    92 c40163 c40163      # keys
    92 c0 c4027634        # vals: nil (a marker has none), b"v4"
    92 00 03              # prevs
    92 0c 04              # flags: batch end | marker (12), batch end
    92 00 03              # sizes: a marker holds no payload
    c0 c0                 # no expiries, no headers
    """
)


def test_marker_leaf_golden() -> None:
    assert fmt.COMMIT_MARKER_FLAGS == 12
    assert fmt.encode_leaf(MARKER_LEAF) == MARKER_LEAF_CHUNK
    decoded = fmt.decode_node(fmt.CHUNK_LEAF, MARKER_LEAF_CHUNK[9:], path="golden", offset=0)
    assert decoded == MARKER_LEAF


INTERIOR = [fmt.Ptr(1, 1, 64, 640), fmt.Ptr(65, 8300, 3, 30)]
INTERIOR_CHUNK = golden(
    """
    00000012 ad8565a6 02  # length 18, CRC32C, type interior
    94                    # array of 4 columns
    92 01 41              # first seqs: 1, 65
    92 01 cd206c          # positions: 1, 8300
    92 40 03              # entry counts: 64, 3
    92 cd0280 1e          # payload bytes: 640, 30
    """
)


def test_interior_golden() -> None:
    assert fmt.encode_interior(INTERIOR) == INTERIOR_CHUNK
    decoded = fmt.decode_node(fmt.CHUNK_INTERIOR, INTERIOR_CHUNK[9:], path="golden", offset=0)
    assert decoded == fmt.Interior(INTERIOR)


@pytest.mark.parametrize(
    "obj",
    [
        [[1], [b"k"], [b"v"], [0], [0], [2], None],  # 7 columns
        [[1, 2], [b"k"], [b"v"], [0], [0], [2], None, None],  # columns disagree
        [[], [], [], [], [], [], None, None],  # empty leaf
        "not a list",
    ],
)
def test_malformed_leaf_is_corruption(obj: object) -> None:
    with pytest.raises(CorruptionError) as caught:
        fmt.decode_node(fmt.CHUNK_LEAF, msgpack.packb(obj), path="f", offset=123)
    assert caught.value.offset == 123


def test_undecodable_node_is_corruption() -> None:
    with pytest.raises(CorruptionError, match="undecodable"):
        fmt.decode_node(fmt.CHUNK_INTERIOR, b"\xc1", path="f", offset=9)
    with pytest.raises(CorruptionError, match="not a node"):
        fmt.decode_node(fmt.CHUNK_VALUE, msgpack.packb([]), path="f", offset=9)


# --- header ("Header") --------------------------------------------------------------------------

HEADER = fmt.Header(
    store_uuid=UUID,
    generation=2,
    commit_no=5,
    last_seq=9,
    root=fmt.Root(pos=8300, count=3, payload_bytes=30, first_seq=1, height=2),
    prev_header=4096,
    region_start=4200,
    region_crc=0xDEADBEEF,
    entry_count=3,
    payload_bytes=30,
    superseded_count=1,
    superseded_bytes=10,
    meta=-1,
    min_rollback_seq=0,
    timestamp_ms=1_700_000_000_000,
    file_overhead=1.25,
)
HEADER_CHUNK = golden(
    """
    0000004b 9dc68e61 05  # length 75, CRC32C, type header
    dc0012                # array of 18 fields
    a54b41594f53          # "KAYOS"
    02                    # format version 2
    c410 000102030405060708090a0b0c0d0e0f  # store uuid (bin 16)
    02 05 09              # generation, commit_no, last_seq
    95 cd206c 03 1e 01 02 # root: position, count, bytes, first seq, height
    cd1000                # prev_header 4096
    cd1068                # region_start 4200
    cedeadbeef            # region_crc
    03 1e 01 0a           # entry_count, payload_bytes, superseded_count, superseded_bytes
    ff                    # meta -1 (none)
    00                    # min_rollback_seq
    cf0000018bcfe56800    # timestamp_ms
    cb3ff4000000000000    # file_overhead 1.25 (float 64)
    """
)


# The same header as the version 1 code wrote it: still read (docs/storage-format.md, "Versions").
HEADER_CHUNK_V1 = HEADER_CHUNK[:4] + bytes.fromhex("bbfb7ab8") + HEADER_CHUNK[8:18] + b"\x01"
HEADER_CHUNK_V1 += HEADER_CHUNK[19:]


def test_header_golden() -> None:
    assert fmt.encode_header(HEADER) == HEADER_CHUNK
    assert fmt.decode_header(HEADER_CHUNK[9:], path="golden", offset=0) == HEADER


def test_version_1_header_is_read() -> None:
    length, crc = fmt.parse_chunk_prefix(HEADER_CHUNK_V1[:8], path="golden", offset=0)
    body = HEADER_CHUNK_V1[8:]
    assert length == len(body)
    chunk_type, payload = fmt.check_chunk_body(body, crc, path="golden", offset=0)
    assert chunk_type == fmt.CHUNK_HEADER
    assert payload[18 - 9] == 1  # the version byte
    assert fmt.decode_header(payload, path="golden", offset=0) == HEADER


def _header_payload(**changes: object) -> bytes:
    fields: list[object] = msgpack.unpackb(HEADER_CHUNK[9:])
    positions = {"magic": 0, "version": 1, "uuid": 2, "root": 6}
    for name, value in changes.items():
        fields[positions[name]] = value
    return bytes(msgpack.packb(fields, use_bin_type=True))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"magic": "KAYOZ"}, "magic"),
        ({"version": 3}, "unsupported format version 3"),
        ({"version": [1]}, "unsupported format version"),
        ({"uuid": b"short"}, "uuid"),
        ({"root": [1, 2, 3]}, "malformed header"),
    ],
)
def test_bad_header_is_corruption(changes: dict[str, object], message: str) -> None:
    with pytest.raises(CorruptionError, match=message) as caught:
        fmt.decode_header(_header_payload(**changes), path="f", offset=8192)
    assert caught.value.offset == 8192


def test_header_block_pads_to_the_next_block() -> None:
    data, block_pos, end = fmt.header_block(4200, HEADER_CHUNK)
    assert block_pos == 2 * BLOCK
    assert data == bytes(2 * BLOCK - 4200) + b"\x01" + HEADER_CHUNK
    assert end == 2 * BLOCK + 1 + len(HEADER_CHUNK)
    # Already on a boundary: no padding.
    data, block_pos, _ = fmt.header_block(BLOCK, HEADER_CHUNK)
    assert (data[:1], block_pos) == (b"\x01", BLOCK)
    with pytest.raises(ValueError, match="header"):
        fmt.header_block(0, bytes(limits.header_bytes_max + 1))


EMPTY_STORE_FILE = golden(
    """
    01                    # block type: header
    0000003c 8171c654 05  # length 60, CRC32C, type header
    dc0012 a54b41594f53 02
    c410 000102030405060708090a0b0c0d0e0f
    01 00 00              # generation 1, commit_no 0, last_seq 0
    c0                    # root nil: empty tree
    ff 00 00              # prev_header -1, region [0, 0) with CRC32C 0
    00 00 00 00           # no entries, no payload, nothing superseded
    ff 00                 # no meta chunk, min_rollback_seq 0
    cf0000018bcfe56800    # ManualClock's start, 1_700_000_000 s
    cb3ff4000000000000    # file_overhead 1.25
    """
)


def test_empty_store_file_golden(tmp_path: Path) -> None:
    store = ShardStore.open(
        str(tmp_path / "shard"), clock=ManualClock(), options=StoreOptions(store_uuid=UUID)
    )
    path = store.path
    store.close()
    with open(path, "rb") as handle:
        assert handle.read() == EMPTY_STORE_FILE
    assert path.endswith("data.1.kys")


# --- block layout ("Blocks") --------------------------------------------------------------------


def test_lay_out_golden() -> None:
    # Mid-block: no type byte needed.
    assert fmt.lay_out(10, b"abc") == ([b"abc"], 13)
    # Crossing a boundary: the data type byte goes in front of the next block.
    assert fmt.lay_out(BLOCK - 2, b"abcd") == ([b"ab", b"\x00", b"cd"], BLOCK + 3)
    # Starting on a boundary: the chunk is addressed by the boundary, its bytes follow the type.
    assert fmt.lay_out(BLOCK, b"ab") == ([b"\x00", b"ab"], BLOCK + 3)
    assert fmt.lay_out(BLOCK - 1, b"") == ([], BLOCK - 1)


def test_physical_span_golden() -> None:
    assert fmt.physical_span(10, 0) == 0
    assert fmt.physical_span(BLOCK - 1, 1) == 1
    assert fmt.physical_span(BLOCK - 1, 2) == 3
    assert fmt.physical_span(BLOCK, 1) == 2
    assert fmt.physical_span(1, BLOCK - 1) == BLOCK - 1
    assert fmt.physical_span(1, BLOCK) == BLOCK + 1
    assert fmt.physical_span(1, 3 * (BLOCK - 1)) == 3 * BLOCK - 1


def test_strip_block_bytes_golden() -> None:
    raw = b"ab" + b"\x00" + b"cd"
    assert fmt.strip_block_bytes(BLOCK - 2, raw) == b"abcd"
    assert fmt.strip_block_bytes(BLOCK, b"\x00ab") == b"ab"
    assert fmt.strip_block_bytes(5, b"xyz") == b"xyz"


@given(
    start=st.integers(min_value=0, max_value=3 * BLOCK),
    size=st.one_of(
        st.integers(min_value=0, max_value=64),
        st.integers(min_value=BLOCK - 8, max_value=BLOCK + 8),
        st.integers(min_value=0, max_value=4 * BLOCK),
    ),
    fill=st.integers(min_value=0, max_value=255),
)
def test_lay_out_round_trip_at_every_offset(start: int, size: int, fill: int) -> None:
    """strip(lay_out(x)) == x from any start, including chunks crossing several boundaries; the
    physical span agrees and every inserted byte sits exactly on a block boundary."""
    data = bytes((fill + index) % 256 for index in range(size))
    pieces, end = fmt.lay_out(start, data)
    raw = b"".join(pieces)
    assert end - start == len(raw) == fmt.physical_span(start, size)
    assert fmt.strip_block_bytes(start, raw) == data
    boundaries = [pos for pos in range(start, end) if pos % BLOCK == 0]
    assert all(raw[pos - start] == fmt.BLOCK_DATA for pos in boundaries)
    assert len(raw) - len(data) == len(boundaries)


def test_lay_out_every_start_within_a_block() -> None:
    """The round trip at every starting offset modulo the block size, for a chunk that crosses
    one boundary (or starts on it) and one that spans more than a whole block."""
    short = bytes(range(200))
    long = bytes(index % 251 for index in range(BLOCK + 300))
    for start in range(BLOCK, 2 * BLOCK):
        for data in (short, long):
            pieces, end = fmt.lay_out(start, data)
            raw = b"".join(pieces)
            assert len(raw) == end - start == fmt.physical_span(start, len(data)), start
            assert fmt.strip_block_bytes(start, raw) == data, start


def test_unframe_chunk_at_every_start_within_a_block() -> None:
    """Reading a chunk back from its physical bytes ("Chunks", "Blocks"): from every starting
    offset modulo the block size, for a chunk within one block, one crossing a boundary (or
    starting on it) and one spanning more than a block, preceded by unrelated bytes in the
    buffer; the payload and the physical span agree with what was laid out."""
    payloads = (b"x" * 50, bytes(index % 251 for index in range(BLOCK + 300)))
    for start in range(BLOCK, 2 * BLOCK):
        for payload in payloads:
            pieces, end = fmt.lay_out(start, fmt.frame_chunk(fmt.CHUNK_VALUE, payload))
            raw = b"junk" + b"".join(pieces)
            extent = fmt.chunk_extent(raw, 4, start, path="f")
            assert extent is not None
            assert extent[0] == end - start, start
            chunk_type, read = fmt.unframe_chunk(raw, 4, start, extent, path="f")
            assert (chunk_type, bytes(read)) == (fmt.CHUNK_VALUE, payload), start


def test_unframe_chunk_refuses_damage_at_the_chunk_offset() -> None:
    """A flipped body bit, a block type byte that is not "data", a buffer that ends inside the
    prefix or the body, and an unexpected type are each CorruptionError at the chunk's offset."""
    start = 2 * BLOCK - 100  # the chunk crosses the boundary at 2 * BLOCK
    pieces, _ = fmt.lay_out(start, fmt.frame_chunk(fmt.CHUNK_VALUE, b"v" * 500))
    raw = b"".join(pieces)
    extent = fmt.chunk_extent(raw, 0, start, path="f")
    assert extent is not None
    assert fmt.chunk_extent(raw[:5], 0, start, path="f") is None, "ends inside the prefix"
    flipped_body = raw[:50] + bytes([raw[50] ^ 1]) + raw[51:]
    bad_type_byte = raw[:100] + b"\x01" + raw[101:]
    for damaged, message in (
        (flipped_body, "CRC32C"),
        (bad_type_byte, "block type byte 0x1"),
        (raw[:-1], "past the end"),
    ):
        with pytest.raises(CorruptionError, match=message) as caught:
            fmt.unframe_chunk(damaged, 0, start, extent, path="f")
        assert caught.value.offset == start
    with pytest.raises(CorruptionError, match="expected chunk type"):
        fmt.unframe_chunk(raw, 0, start, extent, path="f", expect=fmt.CHUNK_LEAF)


def test_unframe_within_block_agrees_with_unframe_chunk_or_declines() -> None:
    """The one-block fast path ("Chunks", "Blocks"): from every starting offset modulo the block
    size, a chunk inside one block gives what ``unframe_chunk`` gives; one that crosses a
    boundary, starts on one, or runs past the buffer is declined (None), left to the general
    path."""
    framed = fmt.frame_chunk(fmt.CHUNK_LEAF, b"x" * 50)
    taken = 0
    for start in range(BLOCK, 2 * BLOCK):
        pieces, _ = fmt.lay_out(start, framed)
        raw = b"junk" + b"".join(pieces)
        fast = fmt.unframe_within_block(raw, 4, start, path="f")
        inside = start % BLOCK != 0 and start % BLOCK + len(framed) <= BLOCK
        assert (fast is not None) == inside, start
        if fast is not None:
            taken += 1
            extent = fmt.chunk_extent(raw, 4, start, path="f")
            assert extent is not None
            general = fmt.unframe_chunk(raw, 4, start, extent, path="f")
            assert (fast[0], bytes(fast[1])) == (general[0], bytes(general[1])), start
            assert fmt.unframe_within_block(raw[:-1], 4, start, path="f") is None, "past the end"
    assert taken == BLOCK - len(framed)


def test_unframe_within_block_refuses_damage_at_the_chunk_offset() -> None:
    """A flipped body bit and an unknown chunk type inside one block are CorruptionError at the
    chunk's offset, as on the general path; a zero length is declined (the general path judges
    it)."""
    start = BLOCK + 10
    raw = fmt.frame_chunk(fmt.CHUNK_LEAF, b"v" * 100)
    flipped = raw[:20] + bytes([raw[20] ^ 1]) + raw[21:]
    with pytest.raises(CorruptionError, match="CRC32C") as caught:
        fmt.unframe_within_block(flipped, 0, start, path="f")
    assert caught.value.offset == start
    unknown = b"\x7f" + b"v" * 10
    bad_type = (len(unknown)).to_bytes(4, "big") + fmt.crc32c(unknown).to_bytes(4, "big") + unknown
    with pytest.raises(CorruptionError, match="unknown chunk type"):
        fmt.unframe_within_block(bad_type, 0, start, path="f")
    assert fmt.unframe_within_block(bytes(8) + b"v", 0, start, path="f") is None
