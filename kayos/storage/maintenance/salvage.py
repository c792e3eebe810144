"""Salvaging a damaged shard store: keep the newest earlier state that verifies.

The data file is append-only and copy-on-write, so a header refers only to chunks written before
it: every header that lies before the first damaged byte, and whose own region CRC matches,
describes a complete, undamaged earlier state of the store (docs/storage-format.md, "Salvage").
``salvage`` checks a store with the walk of ``kayos check``; on a problem it cuts the file back to
the newest such header (the cut bytes are kept beside it for forensics), checks again, and repeats
within ``limits.salvage_rounds_max`` rounds. When nothing before the damage verifies, the file is
moved aside and the store starts empty. Either way the replica re-fetches what was cut from its
peers; nothing here knows about peers.

Runs before the store is opened, in a worker thread (it reads the whole file).
"""

from __future__ import annotations

import io
import logging
import os
import shutil
from dataclasses import dataclass

from kayos import limits
from kayos.errors import CorruptionError, KayosError
from kayos.storage.disk import format as fmt
from kayos.storage.disk.datafile import read_header_at, region_matches
from kayos.storage.maintenance.check import CheckReport, check_store, data_file_of

log = logging.getLogger("kayos.storage")

DAMAGED_SUFFIX = ".damaged"
_COPY_BYTES = 1 << 20


@dataclass(slots=True)
class SalvageReport:
    """What a salvage found and kept. ``kept_seq`` is the store's last seq after it;
    ``lost_from_offset`` the first damaged byte found (the file was cut at or before it)."""

    path: str
    problem: str
    lost_from_offset: int
    kept_seq: int = 0
    cut_bytes: int = 0
    reset: bool = False
    rounds: int = 0

    def to_json(self) -> dict[str, object]:
        return {
            "problem": self.problem,
            "lost_from_offset": self.lost_from_offset,
            "kept_seq": self.kept_seq,
            "cut_bytes": self.cut_bytes,
            "reset": self.reset,
        }


def salvage(
    directory: str,
    *,
    verify_bytes_max: int = limits.store_verify_on_open_bytes_max,
    rounds_max: int = limits.salvage_rounds_max,
) -> SalvageReport | None:
    """Checks the store in ``directory`` and salvages it if it fails; None when it verified (or
    there is no data file yet, or it is over ``verify_bytes_max`` bytes: checked on read)."""
    try:
        data_path = data_file_of(directory)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if os.path.getsize(data_path) > verify_bytes_max:
        return None
    first = _checked(directory)
    if first.ok:
        return None
    report = SalvageReport(data_path, first.problem, first.offset)
    problem, offset = first.problem, first.offset
    for rounds in range(1, rounds_max + 1):
        report.rounds = rounds
        _drop_derived(directory)
        if offset < 0:
            # No offset: the derived index disagreed (rebuilt on open once deleted), or a
            # structural problem with no place in the file. Check again without the index.
            again = _checked(directory)
            if again.ok:
                report.kept_seq = again.last_seq
                break
            if again.offset < 0:
                if again.problem.startswith(_UNEXPECTED):
                    # Not a verdict on the bytes: leave the store as it is (its open says more).
                    log.error("%s: store not verified: %s", directory, again.problem)
                    return report
                _reset(data_path, report)
                break
            problem, offset = again.problem, again.offset
            continue
        kept = _cut_before(data_path, offset, report)
        if kept is None:
            _reset(data_path, report)
            break
        report.kept_seq = kept
        again = _checked(directory)
        if again.ok:
            break
        problem, offset = again.problem, again.offset
    else:
        _reset(data_path, report)
    log.error(
        "%s: store failed its check (%s at offset %d): %s",
        directory,
        report.problem,
        report.lost_from_offset,
        "nothing verified, starting empty"
        if report.reset
        else f"kept seqs 1..{report.kept_seq}, cut {report.cut_bytes} bytes ({problem})",
    )
    return report


_UNEXPECTED = "check failed unexpectedly: "


def _checked(directory: str) -> CheckReport:
    """``check_store``, with any other failure than a CorruptionError (the derived index's lmdb
    refusing to open, say) as a problem without an offset: the index is dropped and the store
    checked again."""
    try:
        return check_store(directory)
    except Exception as exc:  # reported, never lost: see the docstring
        report = CheckReport(directory)
        return report.fail(f"{_UNEXPECTED}{exc!r}", -1)


def _cut_before(data_path: str, offset: int, report: SalvageReport) -> int | None:
    """Cuts the file after the newest verified header that ends at or before ``offset``; returns
    that header's last seq, or None when there is none."""
    with open(data_path, "r+b") as raw:
        handle = _Handle(raw, data_path)
        size = handle.size()
        limit = min(offset, size)
        block = (limit - 1) // fmt.BLOCK * fmt.BLOCK if limit > 0 else -1
        while block >= 0:
            if handle.pread(1, block) == bytes((fmt.BLOCK_HEADER,)):
                try:
                    header = read_header_at(handle, block)
                    end = _header_end(handle, block)
                    if end <= limit and region_matches(handle, header, block):
                        _keep_cut(raw, data_path, end, size)
                        report.cut_bytes += size - end
                        return header.last_seq
                except (CorruptionError, ValueError):
                    pass
            block -= fmt.BLOCK
    return None


def _header_end(handle: _Handle, block: int) -> int:
    raw = handle.pread(1 + fmt.PREFIX_BYTES, block)
    length, _ = fmt.parse_chunk_prefix(raw[1:], path=handle.path, offset=block)
    return block + 1 + fmt.PREFIX_BYTES + length


def _keep_cut(raw: io.BufferedRandom, data_path: str, end: int, size: int) -> None:
    """Prepends bytes ``[end, size)`` to the ``.damaged`` file, then truncates the data file at
    ``end`` and makes both durable."""
    damaged = data_path + DAMAGED_SUFFIX
    temp = damaged + ".new"
    with open(temp, "wb") as out:
        pos = end
        while pos < size:
            raw.seek(pos)
            chunk = raw.read(min(_COPY_BYTES, size - pos))
            if not chunk:
                break
            out.write(chunk)
            pos += len(chunk)
        if os.path.exists(damaged):
            with open(damaged, "rb") as older:
                shutil.copyfileobj(older, out, _COPY_BYTES)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temp, damaged)
    raw.truncate(end)
    raw.flush()
    os.fsync(raw.fileno())
    _sync_dir(os.path.dirname(data_path))


def _reset(data_path: str, report: SalvageReport) -> None:
    """Nothing before the damage verifies: the file goes aside whole, the store starts empty."""
    damaged = data_path + DAMAGED_SUFFIX
    with open(data_path, "rb") as whole, open(damaged + ".new", "wb") as out:
        shutil.copyfileobj(whole, out, _COPY_BYTES)
        if os.path.exists(damaged):
            with open(damaged, "rb") as older:
                shutil.copyfileobj(older, out, _COPY_BYTES)
        out.flush()
        os.fsync(out.fileno())
    os.replace(damaged + ".new", damaged)
    report.cut_bytes += os.path.getsize(data_path)
    os.unlink(data_path)
    _drop_derived(os.path.dirname(data_path))
    _sync_dir(os.path.dirname(data_path))
    report.reset = True
    report.kept_seq = 0


def _drop_derived(directory: str) -> None:
    shutil.rmtree(os.path.join(directory, "derived"), ignore_errors=True)


def _sync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _Handle:
    """The read side of ``kayos.storage.disk.fileops.FileHandle`` over an open file object."""

    def __init__(self, raw: io.BufferedRandom, path: str) -> None:
        self._raw = raw
        self.path = path

    def pread(self, size: int, offset: int) -> bytes:
        return os.pread(self._raw.fileno(), size, offset)

    def size(self) -> int:
        return os.fstat(self._raw.fileno()).st_size

    def append(self, data: bytes) -> None:  # pragma: no cover - never written through
        raise KayosError("salvage reads headers only")

    def truncate(self, size: int) -> None:  # pragma: no cover
        raise KayosError("salvage reads headers only")

    def sync(self) -> None:  # pragma: no cover
        raise KayosError("salvage reads headers only")

    def close(self) -> None:  # pragma: no cover
        pass
