"""Pure encode/decode of the shard store file format (docs/storage-format.md). No I/O here.

Positions are physical file offsets. The chunk stream skips the first byte of every block, which
holds the block's type; ``lay_out`` inserts those bytes on the way to disk and ``strip_block_bytes``
removes them on the way back.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, TypeVar

import crc32c as _crc32c
import msgpack

from kayos import limits
from kayos.errors import CorruptionError

BLOCK = limits.block_bytes
BLOCK_DATA = 0x00
BLOCK_HEADER = 0x01

CHUNK_LEAF = 0x01
CHUNK_INTERIOR = 0x02
CHUNK_VALUE = 0x03
CHUNK_META = 0x04
CHUNK_HEADER = 0x05
_CHUNK_TYPES = frozenset({CHUNK_LEAF, CHUNK_INTERIOR, CHUNK_VALUE, CHUNK_META, CHUNK_HEADER})

MAGIC = "KAYOS"
FORMAT_VERSION = 2
# Versions a store opens: version 1 files simply hold no commit-end markers.
FORMAT_VERSIONS_READ = (1, 2)

FLAG_DELETE = 1
FLAG_VALUE_OUT_OF_LINE = 2
FLAG_BATCH_END = 4  # the entry ends a commit: its seq is a commit boundary
# A commit-end marker (version 2): compaction's stand-in for a superseded entry that ended a
# commit. Not a version of its key: reads skip it. Always set together with FLAG_BATCH_END.
FLAG_COMMIT_MARKER = 8
COMMIT_MARKER_FLAGS = FLAG_BATCH_END | FLAG_COMMIT_MARKER

_PREFIX = struct.Struct(">II")
PREFIX_BYTES = _PREFIX.size
_LENGTH_TOP_BIT = 0x8000_0000

_Buffer = TypeVar("_Buffer", bytes, memoryview)


def crc32c(data: bytes | bytearray | memoryview, value: int = 0) -> int:
    return int(_crc32c.crc32c(data, value))


# --- chunks -------------------------------------------------------------------------------------


_TYPE_BYTES = {chunk_type: bytes((chunk_type,)) for chunk_type in _CHUNK_TYPES}
_TYPE_CRCS = {chunk_type: crc32c(type_byte) for chunk_type, type_byte in _TYPE_BYTES.items()}


def frame_chunk(chunk_type: int, payload: bytes) -> bytes:
    """Length + CRC32C + body, where body = type byte + payload."""
    type_byte = _TYPE_BYTES[chunk_type]
    length = len(payload) + 1
    if length > limits.chunk_bytes_max:
        raise ValueError(f"chunk of {length} bytes exceeds {limits.chunk_bytes_max}")
    crc = int(_crc32c.crc32c(payload, _TYPE_CRCS[chunk_type]))
    return b"".join((_PREFIX.pack(length, crc), type_byte, payload))


def parse_chunk_prefix(prefix: bytes, *, path: str, offset: int) -> tuple[int, int]:
    """Returns (body length, crc) of a chunk prefix, rejecting impossible lengths as corruption."""
    length, crc = _PREFIX.unpack(prefix)
    if length & _LENGTH_TOP_BIT or length == 0 or length > limits.chunk_bytes_max:
        raise CorruptionError(f"impossible chunk length {length}", path=path, offset=offset)
    return length, crc


def check_chunk_body(
    body: _Buffer, crc: int, *, path: str, offset: int, expect: int | None = None
) -> tuple[int, _Buffer]:
    """Verifies a chunk body and returns (chunk type, payload)."""
    if crc32c(body) != crc:
        raise CorruptionError("chunk CRC32C mismatch", path=path, offset=offset)
    chunk_type = body[0]
    if chunk_type not in _CHUNK_TYPES:
        raise CorruptionError(f"unknown chunk type {chunk_type:#x}", path=path, offset=offset)
    if expect is not None and chunk_type != expect:
        raise CorruptionError(
            f"expected chunk type {expect:#x}, found {chunk_type:#x}", path=path, offset=offset
        )
    return chunk_type, body[1:]


# --- block layout -------------------------------------------------------------------------------


def lay_out(pos: int, data: bytes) -> tuple[list[bytes], int]:
    """Places logical stream bytes at physical ``pos``, inserting a data type byte at each block
    boundary. Returns the physical pieces to append and the physical position after them."""
    pieces: list[bytes] = []
    view = memoryview(data)
    start = 0
    total = len(data)
    while start < total:
        offset_in_block = pos % BLOCK
        if offset_in_block == 0:
            pieces.append(b"\x00")
            pos += 1
            offset_in_block = 1
        take = min(BLOCK - offset_in_block, total - start)
        pieces.append(bytes(view[start : start + take]))
        start += take
        pos += take
    return pieces, pos


def physical_span(pos: int, logical_bytes: int) -> int:
    """How many physical bytes starting at ``pos`` hold ``logical_bytes`` of chunk stream."""
    if logical_bytes <= 0:
        return 0
    end = pos
    remaining = logical_bytes
    offset_in_block = end % BLOCK
    if offset_in_block == 0:
        end += 1
        offset_in_block = 1
    first = min(BLOCK - offset_in_block, remaining)
    end += first
    remaining -= first
    if remaining:
        full_blocks, rest = divmod(remaining, BLOCK - 1)
        end += full_blocks * BLOCK
        if rest:
            end += 1 + rest
    return end - pos


def strip_block_bytes(pos: int, raw: bytes) -> bytes:
    """Removes the block type bytes from physical bytes ``raw`` read at ``pos``."""
    first_boundary = -pos % BLOCK
    if first_boundary >= len(raw):
        return raw
    parts = [raw[:first_boundary]]
    index = first_boundary
    while index < len(raw):
        parts.append(raw[index + 1 : index + BLOCK])
        index += BLOCK
    return b"".join(parts)


def chunk_extent(raw: bytes, start: int, pos: int, *, path: str) -> tuple[int, int] | None:
    """(physical span, CRC) of the chunk at file position ``pos``, whose bytes begin at
    ``raw[start]``. None when ``raw`` ends inside the chunk's prefix; impossible lengths are
    corruption."""
    prefix_span = physical_span(pos, PREFIX_BYTES)
    if start + prefix_span > len(raw):
        return None
    if prefix_span == PREFIX_BYTES:
        prefix = raw[start : start + PREFIX_BYTES]
    else:
        prefix = strip_block_bytes(pos, raw[start : start + prefix_span])
    length, crc = parse_chunk_prefix(prefix, path=path, offset=pos)
    return physical_span(pos, PREFIX_BYTES + length), crc


def unframe_chunk(
    raw: bytes,
    start: int,
    pos: int,
    extent: tuple[int, int],
    *,
    path: str,
    expect: int | None = None,
) -> tuple[int, memoryview]:
    """Verifies the chunk at file position ``pos`` whose physical bytes begin at ``raw[start]``
    (``extent`` from ``chunk_extent``) and returns (chunk type, payload).

    The payload is a view of ``raw`` when the body crosses no block boundary, else of one copy
    of the body without the block type bytes."""
    span, crc = extent
    view = memoryview(raw)[start : start + span]
    if len(view) != span:
        raise CorruptionError("chunk runs past the end of the file", path=path, offset=pos)
    boundaries = range(-pos % BLOCK, span, BLOCK)
    # The chunk CRC does not cover the type bytes of the blocks the chunk crosses; each must say
    # "data", or the block was damaged (or is not part of this chunk at all).
    for boundary in boundaries:
        if view[boundary] != BLOCK_DATA:
            raise CorruptionError(
                f"block type byte {view[boundary]:#x} at {pos + boundary} inside a chunk",
                path=path,
                offset=pos,
            )
    # The body: from the end of the prefix to the end of the chunk, less the type bytes.
    piece_start = physical_span(pos, PREFIX_BYTES)
    pieces: list[memoryview] = []
    for boundary in boundaries:
        if boundary >= piece_start:
            if boundary > piece_start:
                pieces.append(view[piece_start:boundary])
            piece_start = boundary + 1
    pieces.append(view[piece_start:])
    body = pieces[0] if len(pieces) == 1 else memoryview(b"".join(pieces))
    return check_chunk_body(body, crc, path=path, offset=pos, expect=expect)


def unframe_within_block(
    raw: bytes, start: int, pos: int, *, path: str
) -> tuple[int, memoryview] | None:
    """``unframe_chunk`` for the common case of a chunk that lies whole inside one block after
    its first byte (no block type byte to check or strip), from its prefix alone: (chunk type,
    payload, a view of ``raw``). None when it does not, or when ``raw`` ends before it does (the
    caller then takes the general path, which also judges an impossible length)."""
    in_block = pos & (BLOCK - 1)
    body_start = start + PREFIX_BYTES
    if in_block == 0 or in_block + PREFIX_BYTES > BLOCK or body_start > len(raw):
        return None
    length, crc = _PREFIX.unpack_from(raw, start)
    body_end = body_start + length
    if length == 0 or in_block + PREFIX_BYTES + length > BLOCK or body_end > len(raw):
        return None
    return check_chunk_body(memoryview(raw)[body_start:body_end], crc, path=path, offset=pos)


def header_block(pos: int, header_chunk: bytes) -> tuple[bytes, int, int]:
    """Zero padding up to the next block boundary, the header type byte and the header chunk.

    Returns (bytes, header block position, position after the header chunk)."""
    if len(header_chunk) > limits.header_bytes_max:
        raise ValueError(f"header of {len(header_chunk)} bytes exceeds {limits.header_bytes_max}")
    pad = -pos % BLOCK
    block_pos = pos + pad
    data = b"\x00" * pad + bytes((BLOCK_HEADER,)) + header_chunk
    return data, block_pos, block_pos + 1 + len(header_chunk)


# --- nodes --------------------------------------------------------------------------------------


@dataclass(slots=True)
class Leaf:
    """Columnar leaf: one list per field, all of equal length."""

    seqs: list[int]
    keys: list[bytes]
    vals: list[Any]  # bytes inline, int position when out of line, None for a delete
    prevs: list[int]
    flags: list[int]
    sizes: list[int]
    expiries: list[int] | None
    headers: list[dict[str, bytes] | None] | None

    def __len__(self) -> int:
        return len(self.seqs)


@dataclass(frozen=True, slots=True)
class Ptr:
    """A child pointer: the first seq of its subtree, its chunk position, entries and bytes."""

    first_seq: int
    pos: int
    count: int
    payload_bytes: int


@dataclass(slots=True)
class Interior:
    children: list[Ptr]


def empty_leaf() -> Leaf:
    return Leaf([], [], [], [], [], [], None, None)


def encode_leaf(leaf: Leaf) -> bytes:
    assert leaf.seqs, "an empty leaf is never written"
    payload = msgpack.packb(
        [
            leaf.seqs,
            leaf.keys,
            leaf.vals,
            leaf.prevs,
            leaf.flags,
            leaf.sizes,
            leaf.expiries,
            leaf.headers,
        ],
        use_bin_type=True,
    )
    return frame_chunk(CHUNK_LEAF, payload)


def encode_interior(children: list[Ptr]) -> bytes:
    assert children, "an empty interior node is never written"
    payload = msgpack.packb(
        [
            [c.first_seq for c in children],
            [c.pos for c in children],
            [c.count for c in children],
            [c.payload_bytes for c in children],
        ],
        use_bin_type=True,
    )
    return frame_chunk(CHUNK_INTERIOR, payload)


def _array_header(count: int) -> bytes:
    """The msgpack array header for ``count`` items, as ``msgpack.packb`` writes it."""
    if count < 16:
        return bytes((0x90 | count,))
    if count < 1 << 16:
        return b"\xdc" + count.to_bytes(2, "big")
    return b"\xdd" + count.to_bytes(4, "big")


def pack_interior_columns(children: list[Ptr]) -> tuple[bytes, bytes, bytes, bytes]:
    """The packed items (no array header) of each interior column of ``children``."""
    columns = (
        [c.first_seq for c in children],
        [c.pos for c in children],
        [c.count for c in children],
        [c.payload_bytes for c in children],
    )
    skip = len(_array_header(len(children)))
    first, positions, counts, sizes = (msgpack.packb(column)[skip:] for column in columns)
    return first, positions, counts, sizes


_INTERIOR_ARRAY = _array_header(4)


def encode_interior_packed(
    count: int, columns: tuple[bytes, bytes, bytes, bytes], extra: Ptr | None
) -> bytes:
    """``encode_interior`` of ``count`` children given as ``pack_interior_columns`` packed them,
    plus ``extra`` after them if given: byte for byte the same chunk, without re-packing."""
    if extra is None:
        header = _array_header(count)
        parts = [_INTERIOR_ARRAY]
        for column in columns:
            parts += (header, column)
    else:
        header = _array_header(count + 1)
        values = (extra.first_seq, extra.pos, extra.count, extra.payload_bytes)
        parts = [_INTERIOR_ARRAY]
        for column, value in zip(columns, values, strict=True):
            parts += (header, column, msgpack.packb(value))
    return frame_chunk(CHUNK_INTERIOR, b"".join(parts))


def _unpack(payload: bytes | memoryview, *, path: str, offset: int) -> Any:
    try:
        return msgpack.unpackb(payload, raw=False, strict_map_key=False, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types; all mean corruption here
        raise CorruptionError(f"undecodable node: {exc}", path=path, offset=offset) from exc


def decode_node(
    chunk_type: int, payload: bytes | memoryview, *, path: str, offset: int
) -> Leaf | Interior:
    obj = _unpack(payload, path=path, offset=offset)
    if chunk_type == CHUNK_LEAF:
        if not isinstance(obj, list) or len(obj) != 8:
            raise CorruptionError("malformed leaf", path=path, offset=offset)
        seqs, keys, vals, prevs, flags, sizes, expiries, headers = obj
        count = len(seqs)
        if not (
            count
            and len(keys) == len(vals) == len(prevs) == len(flags) == len(sizes) == count
            and (expiries is None or len(expiries) == count)
            and (headers is None or len(headers) == count)
        ):
            raise CorruptionError("leaf columns disagree in length", path=path, offset=offset)
        return Leaf(seqs, keys, vals, prevs, flags, sizes, expiries, headers)
    if chunk_type == CHUNK_INTERIOR:
        if not isinstance(obj, list) or len(obj) != 4:
            raise CorruptionError("malformed interior node", path=path, offset=offset)
        firsts, positions, counts, sizes = obj
        if not firsts or not len(firsts) == len(positions) == len(counts) == len(sizes):
            raise CorruptionError("interior columns disagree", path=path, offset=offset)
        return Interior([Ptr(*row) for row in zip(firsts, positions, counts, sizes, strict=True)])
    raise CorruptionError(f"chunk type {chunk_type:#x} is not a node", path=path, offset=offset)


def encode_meta(meta: dict[str, Any]) -> bytes:
    return frame_chunk(CHUNK_META, msgpack.packb(meta, use_bin_type=True))


def decode_meta(payload: bytes | memoryview, *, path: str, offset: int) -> dict[str, Any]:
    obj = _unpack(payload, path=path, offset=offset)
    if not isinstance(obj, dict):
        raise CorruptionError("meta chunk is not a map", path=path, offset=offset)
    return obj


# --- header -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Root:
    pos: int
    count: int
    payload_bytes: int
    first_seq: int
    height: int


@dataclass(frozen=True, slots=True)
class Header:
    store_uuid: bytes
    generation: int
    commit_no: int
    last_seq: int
    root: Root | None
    prev_header: int
    region_start: int
    region_crc: int
    entry_count: int
    payload_bytes: int
    superseded_count: int
    superseded_bytes: int
    meta: int
    min_rollback_seq: int
    timestamp_ms: int
    file_overhead: float


def encode_header(header: Header) -> bytes:
    root = header.root
    fields = [
        MAGIC,
        FORMAT_VERSION,
        header.store_uuid,
        header.generation,
        header.commit_no,
        header.last_seq,
        None
        if root is None
        else [root.pos, root.count, root.payload_bytes, root.first_seq, root.height],
        header.prev_header,
        header.region_start,
        header.region_crc,
        header.entry_count,
        header.payload_bytes,
        header.superseded_count,
        header.superseded_bytes,
        header.meta,
        header.min_rollback_seq,
        header.timestamp_ms,
        float(header.file_overhead),
    ]
    return frame_chunk(CHUNK_HEADER, msgpack.packb(fields, use_bin_type=True))


def decode_header(payload: bytes, *, path: str, offset: int) -> Header:
    obj = _unpack(payload, path=path, offset=offset)
    if not isinstance(obj, list) or len(obj) != 18:
        raise CorruptionError("malformed header", path=path, offset=offset)
    if obj[0] != MAGIC:
        raise CorruptionError("bad header magic", path=path, offset=offset)
    if obj[1] not in FORMAT_VERSIONS_READ:
        raise CorruptionError(f"unsupported format version {obj[1]}", path=path, offset=offset)
    raw_root = obj[6]
    try:
        root = None if raw_root is None else Root(*raw_root)
        names = [name for name in Header.__slots__ if name != "root"]
        values = dict(zip(names, [obj[2], *obj[3:6], *obj[7:]], strict=True))
        header = Header(root=root, **values)
    except TypeError as exc:
        raise CorruptionError(f"malformed header: {exc}", path=path, offset=offset) from exc
    if not isinstance(header.store_uuid, bytes) or len(header.store_uuid) != 16:
        raise CorruptionError("bad store uuid", path=path, offset=offset)
    return header
