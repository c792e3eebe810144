"""The checks ``kayos check`` makes on a data file, made on its bytes as they arrive, in order
(docs/replication-protocol.md, "Store snapshots": "Verified as it arrives").

A learner copying a store file feeds each run of bytes it receives to a ``StreamCheck``. It walks
the file's layout from offset 0 (docs/storage-format.md): every block's type byte; before the
file's first header (a compacted file's base, which no region CRC covers) chunk after chunk with
its length and CRC32C (the chunk functions the store reads with) and the zero padding before the
header; and every header: its chunk, magic and version (the parse recovery uses), its region CRC
over every raw byte since the header before it (so the chunks of a commit are covered whole, and
not walked one by one), and the chain (``prev_header`` and ``region_start`` name the header
before it, ``commit_no`` grows). ``verified`` is the end of the
last header that passed: bytes below it are a store (a prefix ending at a header) every check
accepted. Pure: bytes in, offsets out, no I/O; a problem raises ``CorruptionError`` naming the
file offset, and the check stays failed.
"""

from __future__ import annotations

import struct

from kayos.errors import CorruptionError
from kayos.storage.disk import format as fmt
from kayos.storage.disk.datafile import parse_header_block

_LENGTH = struct.Struct(">I")
_HEADER_CHUNK_BYTES_MAX = fmt.BLOCK - 1
_BLOCK_KINDS = bytes((fmt.BLOCK_DATA, fmt.BLOCK_HEADER))


class StreamCheck:
    """Checks a data file's bytes fed in order from offset ``start`` (0, or a verified offset a
    previous check reached, with the header that ends there: ``resume``)."""

    def __init__(self, path: str = "<copy>") -> None:
        self.path = path
        # The end of the last header that passed, that header, its block and its chunk's CRC.
        self.verified = 0
        self.header: fmt.Header | None = None
        self.header_block = -1
        self.header_crc = 0
        # Bytes received and not yet walked, from file offset self._pos, and how many of them the
        # next step needs before it can be taken.
        self._pieces: list[bytes] = []
        self._held = 0
        self._pos = 0
        self._need = 1
        # Where the region of the next header starts and the CRC32C of its raw bytes so far.
        self._region_from = 0
        self._region_crc = 0
        # Padding was walked: the next block must be a header.
        self._expect_header = False
        self._failed: CorruptionError | None = None

    def resume(self, offset: int, header: fmt.Header, block: int, header_crc: int) -> None:
        """Goes on after a prefix verified before (``offset`` ends ``header``'s chunk, at
        ``block``), forgetting every byte fed past it and any problem found there."""
        self.verified = self._pos = self._region_from = offset
        self.header, self.header_block, self.header_crc = header, block, header_crc
        self._pieces, self._held, self._need, self._region_crc = [], 0, 1, 0
        self._expect_header, self._failed = False, None

    @property
    def received(self) -> int:
        """The file offset after the last byte fed."""
        return self._pos + self._held

    def feed(self, data: bytes | memoryview) -> int:
        """Walks ``data`` (the bytes after those fed before) as far as it can; returns
        ``verified``. Raises ``CorruptionError`` at the first problem, and again on every later
        call."""
        if self._failed is not None:
            raise self._failed
        if data:
            self._pieces.append(bytes(data))
            self._held += len(data)
        if self._held < self._need:
            return self.verified
        raw = self._pieces[0] if len(self._pieces) == 1 else b"".join(self._pieces)
        try:
            used = self._walk(raw)
        except CorruptionError as exc:
            self._failed = exc
            raise
        rest = raw[used:]
        self._pieces = [rest] if rest else []
        self._held = len(rest)
        self._pos += used
        return self.verified

    def _walk(self, raw: bytes) -> int:
        """Takes steps while ``raw`` (bytes from ``self._pos``) holds enough for the next one;
        returns the bytes walked and leaves in ``self._need`` what the next step needs."""
        index = 0
        while True:
            step = self._step(raw, index, self._pos + index)
            if step <= 0:
                self._need = -step
                return index
            index += step

    def _step(self, raw: bytes, index: int, pos: int) -> int:
        """One unit at file offset ``pos`` (``raw[index]``): its length once walked, or minus the
        bytes (from ``index``) it needs first."""
        have = len(raw) - index
        if have < 1:
            return -1
        in_block = pos % fmt.BLOCK
        if in_block == 0 and raw[index] == fmt.BLOCK_HEADER:
            return self._header(raw, index, pos)
        if self.header is not None:
            return self._region(raw, index, pos)
        if in_block == 0:
            if raw[index] != fmt.BLOCK_DATA:
                raise self._problem("block type byte is neither data (0x00) nor header (0x01)", pos)
            if self._expect_header:
                raise self._problem("padding is not followed by a header block", pos)
            return self._chunk(raw, index, pos)
        to_boundary = fmt.BLOCK - in_block
        if to_boundary < fmt.PREFIX_BYTES:
            # A chunk's prefix would cross the boundary: padding when the bytes up to it are zero
            # and a header block follows.
            if have < to_boundary + 1:
                return -(to_boundary + 1)
            if raw[index + to_boundary] == fmt.BLOCK_HEADER:
                return self._padding(raw, index, pos, to_boundary)
            return self._chunk(raw, index, pos)
        if have < fmt.PREFIX_BYTES:
            return -fmt.PREFIX_BYTES
        if _LENGTH.unpack_from(raw, index)[0] == 0:  # no chunk has length 0: padding
            if have < to_boundary:
                return -to_boundary
            return self._padding(raw, index, pos, to_boundary)
        return self._chunk(raw, index, pos)

    def _region(self, raw: bytes, index: int, pos: int) -> int:
        """After a header: the next commit's region, up to the next header block (or all of
        ``raw``). Its bytes are not walked chunk by chunk: the region CRC of the header that ends
        it covers every one of them, chunks and padding (docs/storage-format.md, "Commit"). Only
        the block type bytes are looked at, to find that header."""
        first = index + (-pos % fmt.BLOCK)
        kinds = raw[first :: fmt.BLOCK]
        if kinds.translate(None, _BLOCK_KINDS):
            bad = next(i for i, kind in enumerate(kinds) if kind not in _BLOCK_KINDS)
            raise self._problem(
                "block type byte is neither data (0x00) nor header (0x01)",
                pos + (first - index) + bad * fmt.BLOCK,
            )
        found = kinds.find(fmt.BLOCK_HEADER)
        end = len(raw) if found < 0 else first + found * fmt.BLOCK
        self._take(raw, index, end - index)
        return end - index

    def _chunk(self, raw: bytes, index: int, pos: int) -> int:
        extent = fmt.chunk_extent(raw, index, pos, path=self.path)
        if extent is None:
            return -fmt.physical_span(pos, fmt.PREFIX_BYTES)
        span = extent[0]
        if len(raw) - index < span:
            return -span
        fmt.unframe_chunk(raw, index, pos, extent, path=self.path)
        self._take(raw, index, span)
        if self.header is None:
            # Before a file's first header (a compacted file's base), the region of that header
            # starts where its chunks end: each chunk is checked by its own CRC.
            self._region_from, self._region_crc = pos + span, 0
        return span

    def _padding(self, raw: bytes, index: int, pos: int, size: int) -> int:
        if any(raw[index : index + size]):
            raise self._problem("padding before a header is not zero", pos)
        self._take(raw, index, size)
        self._expect_header = True
        return size

    def _take(self, raw: bytes, index: int, size: int) -> None:
        self._region_crc = fmt.crc32c(memoryview(raw)[index : index + size], self._region_crc)

    def _header(self, raw: bytes, index: int, pos: int) -> int:
        have = len(raw) - index
        if have < 1 + fmt.PREFIX_BYTES:
            return -(1 + fmt.PREFIX_BYTES)
        prefix = raw[index + 1 : index + 1 + fmt.PREFIX_BYTES]
        length, crc = fmt.parse_chunk_prefix(prefix, path=self.path, offset=pos)
        size = 1 + fmt.PREFIX_BYTES + length
        if size > _HEADER_CHUNK_BYTES_MAX + 1:
            raise self._problem("header runs past its block", pos)
        if have < size:
            return -size
        header = parse_header_block(raw[index : index + size], pos, self.path)
        if header.region_start != self._region_from:
            raise self._problem(
                f"header's region starts at {header.region_start}, not at {self._region_from}", pos
            )
        if header.region_crc != self._region_crc:
            raise self._problem("commit region CRC mismatch", pos)
        if header.prev_header != self.header_block:
            raise self._problem(
                f"header's previous header is at {header.prev_header}, not {self.header_block}",
                pos,
            )
        if self.header is not None and header.commit_no <= self.header.commit_no:
            raise self._problem("commit numbers do not grow", pos)
        self.header, self.header_block, self.header_crc = header, pos, crc
        self.verified = self._region_from = pos + size
        self._region_crc = 0
        self._expect_header = False
        return size

    def _problem(self, text: str, offset: int) -> CorruptionError:
        return CorruptionError(text, path=self.path, offset=offset)
