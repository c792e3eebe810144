"""Data files and their headers on disk: file names, the shared handle of one generation's file,
and finding, reading and checking header blocks (docs/storage-format.md).

Separate from the engine because recovery, compaction, salvage, checks and store snapshots read
files and headers without a store around them.
"""

from __future__ import annotations

import threading
from operator import attrgetter
from typing import Any, NamedTuple

from kayos.errors import CorruptionError, StoreClosedError
from kayos.storage.disk import btree
from kayos.storage.disk import format as fmt
from kayos.storage.disk.fileops import FileHandle

DATA_PREFIX = "data."
DATA_SUFFIX = ".kys"
_REGION_READ_BYTES = 1 << 20


class DataFile:
    """One generation's file, shared by the store and the snapshots pinned on it."""

    def __init__(self, handle: FileHandle, generation: int) -> None:
        self.handle = handle
        self.reader = btree.NodeReader(handle)
        self.generation = generation
        self._refs = 1
        self._lock = threading.Lock()

    def acquire(self) -> DataFile:
        with self._lock:
            if self._refs <= 0:
                raise StoreClosedError(f"{self.handle.path} is closed")
            self._refs += 1
        return self

    def release(self) -> None:
        with self._lock:
            self._refs -= 1
            closing = self._refs == 0
        if closing:
            self.handle.close()


class Current(NamedTuple):
    """A store's current state, swapped as one: its data file, the newest header and that
    header's metadata map."""

    file: DataFile
    header: fmt.Header
    meta: dict[str, Any]


# A learner's copy of a peer's store file in progress (docs/replication-protocol.md, "Store
# snapshots"): deleted on open, it never became current.
SNAPSHOT_SUFFIX = ".snapshot"


def data_file_name(generation: int) -> str:
    return f"{DATA_PREFIX}{generation}{DATA_SUFFIX}"


def parse_generation(name: str) -> int | None:
    if not (name.startswith(DATA_PREFIX) and name.endswith(DATA_SUFFIX)):
        return None
    middle = name[len(DATA_PREFIX) : -len(DATA_SUFFIX)]
    return int(middle) if middle.isdigit() else None


def read_header_at(handle: FileHandle, block_pos: int) -> fmt.Header:
    """Parses the header in the block at ``block_pos``; raises CorruptionError if it is not one."""
    return parse_header_block(handle.pread(fmt.BLOCK, block_pos), block_pos, handle.path)


def parse_header_block(raw: bytes, block_pos: int, path: str) -> fmt.Header:
    """Parses the header in ``raw``, the bytes of the block at ``block_pos`` (at least up to the
    end of its header chunk); raises CorruptionError if it is not a valid header."""
    if len(raw) < 1 + fmt.PREFIX_BYTES or raw[0] != fmt.BLOCK_HEADER:
        raise CorruptionError("not a header block", path=path, offset=block_pos)
    length, crc = fmt.parse_chunk_prefix(raw[1 : 1 + fmt.PREFIX_BYTES], path=path, offset=block_pos)
    if 1 + fmt.PREFIX_BYTES + length > len(raw):
        raise CorruptionError("header runs past its block", path=path, offset=block_pos)
    body = raw[1 + fmt.PREFIX_BYTES : 1 + fmt.PREFIX_BYTES + length]
    _, payload = fmt.check_chunk_body(
        body, crc, path=path, offset=block_pos, expect=fmt.CHUNK_HEADER
    )
    header = fmt.decode_header(payload, path=path, offset=block_pos)
    if not (0 <= header.region_start <= block_pos):
        raise CorruptionError("header region out of bounds", path=path, offset=block_pos)
    return header


def header_end(handle: FileHandle, block_pos: int) -> int:
    raw = handle.pread(1 + fmt.PREFIX_BYTES, block_pos)
    length, _ = fmt.parse_chunk_prefix(raw[1:], path=handle.path, offset=block_pos)
    return block_pos + 1 + fmt.PREFIX_BYTES + length


def region_matches(handle: FileHandle, header: fmt.Header, block_pos: int) -> bool:
    crc = 0
    pos = header.region_start
    while pos < block_pos:
        data = handle.pread(min(_REGION_READ_BYTES, block_pos - pos), pos)
        if not data:
            return False
        crc = fmt.crc32c(data, crc)
        pos += len(data)
    return crc == header.region_crc


def find_last_header(handle: FileHandle) -> tuple[int, fmt.Header]:
    """Steps back from the end of the file to the last header whose chunk and region check out."""
    size = handle.size()
    if size == 0:
        raise CorruptionError("empty data file: no header", path=handle.path, offset=0)
    block = (size - 1) // fmt.BLOCK * fmt.BLOCK
    first_problem: CorruptionError | None = None
    while block >= 0:
        if handle.pread(1, block) == bytes((fmt.BLOCK_HEADER,)):
            try:
                header = read_header_at(handle, block)
                if region_matches(handle, header, block):
                    return block, header
                raise CorruptionError("commit region CRC mismatch", path=handle.path, offset=block)
            except CorruptionError as exc:
                first_problem = first_problem or exc
        block -= fmt.BLOCK
    if first_problem is not None:
        raise first_problem
    raise CorruptionError("no header block found", path=handle.path, offset=0)


_HEADER_FIELDS: tuple[str, ...] = fmt.Header.__slots__
_header_values = attrgetter(*_HEADER_FIELDS)


def header_with(header: fmt.Header, **changes: Any) -> fmt.Header:
    fields = dict(zip(_HEADER_FIELDS, _header_values(header), strict=True))
    fields.update(changes)
    return fmt.Header(**fields)
