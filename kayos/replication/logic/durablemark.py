"""The durable mark: how far a replica's store was known durable, kept beside the store.

Written outside the data file (docs/storage-format.md, "Beside the store (`durable-mark`)") so a
store cut short by truncation, whose recovery finds an older valid header and only a few torn
bytes, cannot also cut short the record of what it lost. ``cut_short`` is the pure decision made
on open; ``read`` and ``write`` are the file's thin IO.
"""

from __future__ import annotations

import contextlib
import os
import struct
import zlib

DURABLE_MARK_FILE = "durable-mark"
# A local metadata key of the store, present while its replica runs as a chain of one (set when
# it opens so, or stops counting its last learner): every seq the store then holds is committed,
# whether or not the mark caught up before a crash (``known_on_open``).
ALONE_META_KEY = "alone"
_MAGIC = b"KYDM"
_VERSION = 1
_BODY = struct.Struct("<4sB3xQ")
_CRC = struct.Struct("<I")
SIZE_BYTES = _BODY.size + _CRC.size


def encode(seq: int) -> bytes:
    body = _BODY.pack(_MAGIC, _VERSION, seq)
    return body + _CRC.pack(zlib.crc32(body))


def decode(raw: bytes) -> int:
    """The mark's seq; 0 (nothing known) for bytes that are not a whole, valid mark."""
    if len(raw) != SIZE_BYTES:
        return 0
    body = raw[: _BODY.size]
    if _CRC.unpack(raw[_BODY.size :])[0] != zlib.crc32(body):
        return 0
    magic, version, seq = _BODY.unpack(body)
    if magic != _MAGIC or version != _VERSION:
        return 0
    return int(seq)


def cut_short(recorded_seq: int, recovered_last_seq: int) -> str | None:
    """Why a store that opened at ``recovered_last_seq`` lost entries it had made durable, or
    None when it holds at least what the mark recorded."""
    if recovered_last_seq >= recorded_seq:
        return None
    return (
        f"store recovered to seq {recovered_last_seq} below its durable mark {recorded_seq} "
        f"(cut short: {recorded_seq - recovered_last_seq} entries lost)"
    )


def known_on_open(commit_point: int, last_seq: int, *, ran_alone: bool) -> int:
    """The mark a replica opening may raise its mark to: what its store holds of the history it
    knows committed. A store that last ran as a chain of one committed everything it holds (each
    seq was acknowledged once durable there), even past a mark it had no time to raise."""
    return last_seq if ran_alone else min(commit_point, last_seq)


def read(directory: str) -> int:
    try:
        with open(os.path.join(directory, DURABLE_MARK_FILE), "rb") as handle:
            raw = handle.read(SIZE_BYTES + 1)
    except OSError:
        return 0
    return decode(raw)


def write(directory: str, seq: int) -> None:
    write_whole(os.path.join(directory, DURABLE_MARK_FILE), encode(seq))


def write_whole(path: str, raw: bytes) -> None:
    """Writes a small file beside a store whole (temporary file, fsync, rename, directory
    fsync): a crash leaves the old file or the new one."""
    temporary = path + ".tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(raw)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    with contextlib.suppress(OSError):
        dir_fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
