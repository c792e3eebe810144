"""Offline verifier of a shard store (``kayos check PATH``).

Reads without writing: block type bytes, the header chain, every reachable chunk's CRC, tree
order and counts, commit-end markers (they hold nothing but a boundary, lie at or below the
compaction floor and never are the newest version of their key), the metadata chunk, and agreement
of the derived index with the tree. Stops at
the first problem and reports its file offset.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import lmdb

from kayos.errors import CorruptionError
from kayos.storage.disk import btree
from kayos.storage.disk import format as fmt
from kayos.storage.disk.datafile import find_last_header, parse_generation, read_header_at
from kayos.storage.disk.fileops import OS_FILEOPS, FileHandle
from kayos.storage.disk.index import LATEST_ROW
from kayos.storage.reads import Snapshot

_SCAN_BYTES = 1 << 20
_HEADER_CHAIN_MAX = 1_000_000


@dataclass(slots=True)
class CheckReport:
    path: str
    ok: bool = True
    offset: int = -1
    problem: str = ""
    headers: int = 0
    nodes: int = 0
    entries: int = 0
    last_seq: int = 0
    notes: list[str] = field(default_factory=list)

    def fail(self, problem: str, offset: int) -> CheckReport:
        self.ok = False
        self.problem = problem
        self.offset = offset
        return self


def data_file_of(path: str) -> str:
    if os.path.isfile(path):
        return path
    generations = [
        g for g in (parse_generation(name) for name in os.listdir(path)) if g is not None
    ]
    if not generations:
        raise FileNotFoundError(f"{path}: no data.<gen>.kys file")
    return os.path.join(path, f"data.{max(generations)}.kys")


def check_store(path: str) -> CheckReport:
    data_path = data_file_of(path)
    report = CheckReport(data_path)
    handle = OS_FILEOPS.open(data_path)
    try:
        return _check(handle, report, os.path.dirname(data_path) if os.path.isfile(path) else path)
    except CorruptionError as exc:
        return report.fail(str(exc), exc.offset)
    finally:
        handle.close()


def check_snapshot(snapshot: Snapshot, path: str) -> CheckReport:
    """The online part of ``check_store`` for a live store (``GET /v1/shards/{s}/check``): walks
    the tree of a pinned snapshot (every reachable chunk's CRC, seq order, counts, commit-end
    markers) and its metadata chunk. The block scan, the header chain and the derived index are
    left to the offline ``kayos check``: the file grows meanwhile and the index is the node's."""
    report = CheckReport(path)
    header = snapshot.header
    report.last_seq = header.last_seq
    reader = snapshot.reader()
    try:
        _check_tree(reader, header, report)
        if header.meta >= 0:
            reader.read_meta(header.meta)
        snapshot.check()
    except CorruptionError as exc:
        return report.fail(str(exc), exc.offset)
    return report


def _check(handle: FileHandle, report: CheckReport, directory: str) -> CheckReport:
    bad_block = _check_block_types(handle)
    if bad_block >= 0:
        return report.fail("block type byte is neither data (0x00) nor header (0x01)", bad_block)
    block_pos, header = find_last_header(handle)
    report.last_seq = header.last_seq
    end = block_pos + 1 + fmt.PREFIX_BYTES
    if handle.size() > end + fmt.BLOCK:
        report.notes.append(f"{handle.size() - end} bytes after the last header (torn commit?)")
    report.headers = _check_header_chain(handle, block_pos, header)
    reader = btree.NodeReader(handle)
    latest = _check_tree(reader, header, report)
    if header.meta >= 0:
        reader.read_meta(header.meta)
    _check_index(directory, header, latest, report)
    return report


def _check_block_types(handle: FileHandle) -> int:
    size = handle.size()
    pos = 0
    while pos < size:
        data = handle.pread(min(_SCAN_BYTES, size - pos), pos)
        for offset in range(0, len(data), fmt.BLOCK):
            if data[offset] not in (fmt.BLOCK_DATA, fmt.BLOCK_HEADER):
                return pos + offset
        pos += len(data)
    return -1


def _check_header_chain(handle: FileHandle, block_pos: int, header: fmt.Header) -> int:
    count = 1
    last_seq = header.last_seq
    commit_no = header.commit_no
    while header.prev_header >= 0 and count < _HEADER_CHAIN_MAX:
        previous_pos = header.prev_header
        if previous_pos >= block_pos:
            raise CorruptionError("header chain does not go backwards", offset=block_pos)
        header = read_header_at(handle, previous_pos)
        if header.commit_no >= commit_no:
            raise CorruptionError("commit numbers do not decrease", offset=previous_pos)
        if header.last_seq > last_seq and commit_no - header.commit_no == 1:
            pass  # a rollback commit follows a higher seq; allowed
        block_pos, commit_no, last_seq = previous_pos, header.commit_no, header.last_seq
        count += 1
    return count


def _check_tree(
    reader: btree.NodeReader, header: fmt.Header, report: CheckReport
) -> dict[bytes, tuple[int, int, int]]:
    """Walks every node; returns key -> (newest seq, size, flags) over the whole tree."""
    latest: dict[bytes, tuple[int, int, int]] = {}
    root = header.root
    if root is None:
        if header.entry_count:
            raise CorruptionError("header counts entries but has no root")
        return latest
    state = {"previous_seq": 0}
    markers: list[tuple[bytes, int, int]] = []
    count, payload = _walk(
        reader, root.pos, root.height, root.first_seq, latest, state, report, markers
    )
    check_markers(markers, latest, header)
    if count != header.entry_count or count != root.count:
        raise CorruptionError(
            f"tree holds {count} entries, header says {header.entry_count}", offset=root.pos
        )
    if payload != header.payload_bytes:
        raise CorruptionError(
            f"tree holds {payload} payload bytes, header says {header.payload_bytes}",
            offset=root.pos,
        )
    if state["previous_seq"] > header.last_seq:
        raise CorruptionError("tree holds seqs above the header's last seq", offset=root.pos)
    report.entries = count
    return latest


def _walk(
    reader: btree.NodeReader,
    pos: int,
    height: int,
    first_seq: int,
    latest: dict[bytes, tuple[int, int, int]],
    state: dict[str, int],
    report: CheckReport,
    markers: list[tuple[bytes, int, int]],
) -> tuple[int, int]:
    node = reader.read_node(pos)
    report.nodes += 1
    if height == 1:
        if not isinstance(node, fmt.Leaf):
            raise CorruptionError("expected a leaf", offset=pos)
        if node.seqs[0] != first_seq:
            raise CorruptionError("leaf's first seq disagrees with its pointer", offset=pos)
        for index, seq in enumerate(node.seqs):
            if seq <= state["previous_seq"]:
                raise CorruptionError(f"seq {seq} out of order", offset=pos)
            state["previous_seq"] = seq
            flags = node.flags[index]
            if flags & fmt.FLAG_COMMIT_MARKER:
                check_marker(node, index, pos)
                markers.append((node.keys[index], seq, pos))
                continue  # not a version of its key
            if flags & fmt.FLAG_VALUE_OUT_OF_LINE:
                reader.read_value(node.vals[index])
            latest[node.keys[index]] = (seq, node.sizes[index], flags)
        return len(node.seqs), sum(node.sizes)
    if not isinstance(node, fmt.Interior):
        raise CorruptionError("expected an interior node", offset=pos)
    if node.children[0].first_seq != first_seq:
        raise CorruptionError("interior first seq disagrees with its pointer", offset=pos)
    total_count = total_bytes = 0
    for child in node.children:
        count, payload = _walk(
            reader, child.pos, height - 1, child.first_seq, latest, state, report, markers
        )
        if count != child.count or payload != child.payload_bytes:
            raise CorruptionError("child counts disagree with its pointer", offset=child.pos)
        total_count += count
        total_bytes += payload
    return total_count, total_bytes


def check_marker(leaf: fmt.Leaf, index: int, pos: int) -> None:
    """Raises ``CorruptionError`` unless the commit-end marker at ``leaf[index]`` (a leaf at
    file offset ``pos``) holds nothing but its seq, key and prev (docs/storage-format.md,
    "Commit boundaries")."""
    if (
        leaf.flags[index] != fmt.COMMIT_MARKER_FLAGS
        or leaf.vals[index] is not None
        or leaf.sizes[index] != 0
        or (leaf.expiries is not None and leaf.expiries[index] != 0)
        or (leaf.headers is not None and leaf.headers[index] is not None)
    ):
        raise CorruptionError(
            f"commit-end marker at seq {leaf.seqs[index]} holds more than a boundary", offset=pos
        )


def check_markers(
    markers: list[tuple[bytes, int, int]],
    latest: dict[bytes, tuple[int, int, int]],
    header: fmt.Header,
) -> None:
    """Raises ``CorruptionError`` unless every ``(key, seq, offset)`` marker lies at or below the
    compaction floor and a newer version of its key exists in ``latest`` (compaction leaves one
    only for a superseded entry)."""
    for key, seq, pos in markers:
        if seq > header.min_rollback_seq:
            raise CorruptionError(
                f"commit-end marker at seq {seq} above min_rollback_seq {header.min_rollback_seq}",
                offset=pos,
            )
        newest = latest.get(key)
        if newest is None or newest[0] <= seq:
            raise CorruptionError(
                f"commit-end marker at seq {seq} is the newest version of its key", offset=pos
            )


def _check_index(
    directory: str,
    header: fmt.Header,
    latest: dict[bytes, tuple[int, int, int]],
    report: CheckReport,
) -> None:
    index_dir = os.path.join(directory, "derived", "index.lmdb")
    if not os.path.isdir(index_dir):
        report.notes.append("no derived index (it is rebuilt on open)")
        return
    env = lmdb.open(index_dir, readonly=True, lock=False, max_dbs=4)
    try:
        latest_db = env.open_db(b"latest", create=False)
        state_db = env.open_db(b"state", create=False)
        with env.begin() as txn:
            applied = int(txn.get(b"applied_seq", b"0", db=state_db))
            if applied != header.last_seq:
                report.notes.append(
                    f"derived index applied through {applied}, file through {header.last_seq}"
                    " (replayed on open)"
                )
                return
            indexed = 0
            for key, raw in txn.cursor(db=latest_db):
                indexed += 1
                seq, size = LATEST_ROW.unpack(raw)
                expected = latest.get(bytes(key))
                if expected is None:
                    raise CorruptionError(f"index has key {bytes(key)!r}, the tree does not")
                if (expected[0], expected[1]) != (seq, size):
                    raise CorruptionError(
                        f"index says key {bytes(key)!r} is at seq {seq}, tree says {expected[0]}"
                    )
            missing = len(latest) - indexed
            if missing > 0:
                raise CorruptionError(f"{missing} keys of the tree are missing from the index")
    finally:
        env.close()
