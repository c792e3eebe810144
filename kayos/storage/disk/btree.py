"""The copy-on-write sequence tree: reading nodes, and the right edge that commits rewrite.

Seqs only grow, so every commit appends to the rightmost leaf. ``Edge`` holds that leaf's entries
and, per level, the finalized children of the rightmost interior node. Nodes left of the edge are
final and never rewritten; each commit writes the full nodes it finished plus a fresh copy of the
edge (docs/storage-format.md, "The sequence tree").
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING

from kayos import limits
from kayos.errors import CorruptionError
from kayos.storage.disk import format as fmt

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from kayos.storage.disk.fileops import FileHandle
    from kayos.storage.disk.format import Ptr

# Bytes msgpack spends per leaf entry beyond its payload (seq, prev, flags, size, bin headers).
_ENTRY_OVERHEAD_BYTES = 24
# One pread per node: a leaf is cut near leaf_bytes_target, so this covers nearly every one.
_READ_AHEAD_BYTES = 16 * 1024
# A scan reads sibling leaves in runs of up to this many bytes per pread (1 MiB: ~100 leaves, and
# the most one run keeps in memory).
_RUN_READ_BYTES = 1024 * 1024


class Appender:
    """Collects the physical bytes of one commit, starting at the file's current end."""

    def __init__(self, pos: int) -> None:
        self.start = pos
        self.pos = pos
        self._pieces: list[bytes] = []

    def add_chunk(self, chunk: bytes) -> int:
        # A chunk that starts on a block boundary is addressed by the boundary itself; readers skip
        # the block's type byte.
        at = self.pos
        pieces, self.pos = fmt.lay_out(self.pos, chunk)
        self._pieces.extend(pieces)
        return at

    def add_raw(self, data: bytes, new_pos: int) -> None:
        self._pieces.append(data)
        self.pos = new_pos

    def take(self) -> bytes:
        data = b"".join(self._pieces)
        self._pieces = []
        self.start = self.pos
        return data

    def pending_bytes(self) -> int:
        return self.pos - self.start


def _run_read_bytes(positions: Sequence[int], index: int) -> int:
    """Bytes to read at ``positions[index]`` to cover it and the following leaves that lie after
    it within ``_RUN_READ_BYTES`` (the last one's length is unknown: it gets the read-ahead)."""
    pos = previous = positions[index]
    for later in positions[index + 1 :]:
        if later < previous or later + _READ_AHEAD_BYTES - pos > _RUN_READ_BYTES:
            break
        previous = later
    return previous + _READ_AHEAD_BYTES - pos


class NodeReader:
    """Reads and verifies chunks of one file; caches decoded interior nodes (bounded LRU)."""

    def __init__(self, handle: FileHandle) -> None:
        self.handle = handle
        self.path = handle.path
        self._cache: OrderedDict[int, fmt.Interior] = OrderedDict()
        self._lock = threading.Lock()

    def read_chunk(self, pos: int, expect: int | None = None) -> tuple[int, bytes]:
        chunk_type, payload = self._read_chunk_view(pos, expect)
        return chunk_type, bytes(payload)

    def _read_chunk_view(self, pos: int, expect: int | None = None) -> tuple[int, memoryview]:
        """One chunk with one pread when it fits the read-ahead (leaves and interior nodes do),
        else two; the payload is a view of the bytes read."""
        raw = self.handle.pread(_READ_AHEAD_BYTES, pos)
        extent = self._extent(raw, pos)
        if extent[0] > len(raw):
            raw = self.handle.pread(extent[0], pos)
        return fmt.unframe_chunk(raw, 0, pos, extent, path=self.path, expect=expect)

    def _extent(self, raw: bytes, pos: int) -> tuple[int, int]:
        """(span, CRC) of the chunk at ``pos``, read into ``raw`` from ``pos`` on."""
        extent = fmt.chunk_extent(raw, 0, pos, path=self.path)
        if extent is None:
            raise CorruptionError("chunk runs past the end of the file", path=self.path, offset=pos)
        return extent

    def read_leaves(self, positions: Sequence[int]) -> Iterator[fmt.Leaf]:
        """The leaves at ``positions``, in that order. Sibling leaves are laid out left to right,
        mostly back to back, so each pread covers as many of the following leaves as fit in
        ``_RUN_READ_BYTES``; every leaf is still checked (block type bytes, CRC, type) on its
        own. A scan reads each leaf once, so leaves are not cached."""
        raw = b""
        base = 0
        for index, pos in enumerate(positions):
            start = pos - base
            # Most leaves lie inside one block: checked from their prefix alone, no extent walk.
            fast = fmt.unframe_within_block(raw, start, pos, path=self.path) if start >= 0 else None
            if fast is not None:
                chunk_type, payload = fast
            else:
                extent = fmt.chunk_extent(raw, start, pos, path=self.path) if start >= 0 else None
                if extent is None or start + extent[0] > len(raw):
                    raw = self.handle.pread(_run_read_bytes(positions, index), pos)
                    base, start = pos, 0
                    extent = self._extent(raw, pos)
                    if extent[0] > len(raw):
                        raw = self.handle.pread(extent[0], pos)
                chunk_type, payload = fmt.unframe_chunk(raw, start, pos, extent, path=self.path)
            node = fmt.decode_node(chunk_type, payload, path=self.path, offset=pos)
            if not isinstance(node, fmt.Leaf):
                raise CorruptionError("expected a leaf", path=self.path, offset=pos)
            yield node

    def read_node(self, pos: int) -> fmt.Leaf | fmt.Interior:
        cached = self._cache.get(pos)
        if cached is not None:
            return cached
        chunk_type, payload = self._read_chunk_view(pos)
        node = fmt.decode_node(chunk_type, payload, path=self.path, offset=pos)
        if isinstance(node, fmt.Interior):
            with self._lock:
                self._cache[pos] = node
                if len(self._cache) > limits.node_cache_entries_max:
                    self._cache.popitem(last=False)
        return node

    def read_value(self, pos: int) -> bytes:
        _, payload = self.read_chunk(pos, expect=fmt.CHUNK_VALUE)
        return payload

    def read_meta(self, pos: int) -> dict[str, object]:
        _, payload = self._read_chunk_view(pos, expect=fmt.CHUNK_META)
        return fmt.decode_meta(payload, path=self.path, offset=pos)


def _leaf_bytes(leaf: fmt.Leaf, start: int, end: int) -> int:
    return sum(leaf.sizes[start:end]) + _ENTRY_OVERHEAD_BYTES * (end - start)


def slice_leaf(leaf: fmt.Leaf, start: int, end: int) -> fmt.Leaf:
    return fmt.Leaf(
        leaf.seqs[start:end],
        leaf.keys[start:end],
        leaf.vals[start:end],
        leaf.prevs[start:end],
        leaf.flags[start:end],
        leaf.sizes[start:end],
        None if leaf.expiries is None else leaf.expiries[start:end],
        None if leaf.headers is None else leaf.headers[start:end],
    )


def concat_leaves(left: fmt.Leaf, right: fmt.Leaf) -> fmt.Leaf:
    if not left.seqs:
        return right
    count_left, count_right = len(left.seqs), len(right.seqs)
    expiries: list[int] | None = None
    if left.expiries is not None or right.expiries is not None:
        expiries = (left.expiries or [0] * count_left) + (right.expiries or [0] * count_right)
    headers: list[dict[str, bytes] | None] | None = None
    if left.headers is not None or right.headers is not None:
        headers = (left.headers or [None] * count_left) + (right.headers or [None] * count_right)
    return fmt.Leaf(
        left.seqs + right.seqs,
        left.keys + right.keys,
        left.vals + right.vals,
        left.prevs + right.prevs,
        left.flags + right.flags,
        left.sizes + right.sizes,
        expiries,
        headers,
    )


def _ptr_for_leaf(leaf: fmt.Leaf, pos: int) -> fmt.Ptr:
    return fmt.Ptr(leaf.seqs[0], pos, len(leaf.seqs), sum(leaf.sizes))


def _ptr_for_children(children: list[fmt.Ptr], pos: int) -> fmt.Ptr:
    return fmt.Ptr(
        children[0].first_seq,
        pos,
        sum(c.count for c in children),
        sum(c.payload_bytes for c in children),
    )


@dataclass(frozen=True, slots=True)
class _PackedLevel:
    """The finalized children of one edge level, packed once for every commit that rewrites
    the level's open node: each interior column's msgpack items (no array header) and the sums
    a parent pointer needs. ``first_pos``/``last_pos`` tell whether it still matches the level
    (positions only grow within a file, and a level only gains children or is emptied)."""

    count: int
    first_pos: int
    last_pos: int
    columns: tuple[bytes, bytes, bytes, bytes]
    entries: int
    payload_bytes: int


def _pack_level(children: list[Ptr]) -> _PackedLevel:
    return _PackedLevel(
        len(children),
        children[0].pos,
        children[-1].pos,
        fmt.pack_interior_columns(children),
        sum(c.count for c in children),
        sum(c.payload_bytes for c in children),
    )


@dataclass(slots=True)
class Edge:
    """The right edge of the tree. ``levels[i]`` holds the finalized children (of height i + 1)
    of the rightmost node of height i + 2. Treat as immutable: ``append`` returns a new Edge.

    Two caches spare each commit from re-measuring the open leaf and re-packing the finalized
    children of the edge's interior nodes; both are derived from ``leaf`` and ``levels`` and
    rebuilt when they no longer match them."""

    leaf: fmt.Leaf = field(default_factory=fmt.empty_leaf)
    levels: list[list[fmt.Ptr]] = field(default_factory=list)
    # Packed bytes of ``leaf`` (sizes plus _ENTRY_OVERHEAD_BYTES each) and the leaf they measure.
    _leaf_bytes: tuple[fmt.Leaf, int] | None = field(default=None, repr=False, compare=False)
    _packed: list[_PackedLevel | None] = field(default_factory=list, repr=False, compare=False)

    def copy(self) -> Edge:
        return Edge(
            self.leaf, [list(level) for level in self.levels], self._leaf_bytes, list(self._packed)
        )

    def leaf_bytes(self) -> int:
        """The open leaf's running size, as ``append`` measures it for cutting."""
        cached = self._leaf_bytes
        if cached is not None and cached[0] is self.leaf:
            return cached[1]
        size = _leaf_bytes(self.leaf, 0, len(self.leaf.seqs))
        self._leaf_bytes = (self.leaf, size)
        return size

    def append(self, out: Appender, entries: fmt.Leaf) -> Edge:
        """Adds entries (seqs above every seq already in the tree), writing each leaf that fills.

        A leaf is cut after the first entry that brings its packed size to leaf_bytes_target,
        found by bisecting the running sizes (no per-entry step in Python). When no entry but
        the last could reach the target (every commit but the one that fills a leaf), nothing is
        cut and only the new entries are measured."""
        target = limits.leaf_bytes_target
        sizes = entries.sizes
        added = sum(sizes) + _ENTRY_OVERHEAD_BYTES * len(sizes)
        open_bytes = self.leaf_bytes()
        edge = self.copy()
        if not sizes or open_bytes + added - sizes[-1] - _ENTRY_OVERHEAD_BYTES < target:
            edge.leaf = concat_leaves(edge.leaf, entries)
            edge._leaf_bytes = (edge.leaf, open_bytes + added)
            return edge
        leaf = concat_leaves(edge.leaf, entries)
        total = len(leaf.seqs)
        ends = list(accumulate(map(_ENTRY_OVERHEAD_BYTES.__add__, leaf.sizes)))
        start = 0
        base = 0  # the running size before the current leaf's first entry
        while True:
            index = bisect.bisect_left(ends, base + target, lo=start)
            if index + 1 >= total:
                break
            full = slice_leaf(leaf, start, index + 1)
            pos = out.add_chunk(fmt.encode_leaf(full))
            edge._push(out, 0, _ptr_for_leaf(full, pos))
            start = index + 1
            base = ends[index]
        edge.leaf = slice_leaf(leaf, start, total) if start else leaf
        edge._leaf_bytes = (edge.leaf, ends[-1] - base)
        return edge

    def _push(self, out: Appender, level: int, ptr: fmt.Ptr) -> None:
        while len(self.levels) <= level:
            self.levels.append([])
        children = self.levels[level]
        children.append(ptr)
        # Finalize at the bound, not past it: write_root adds the open child to these, and a
        # node may hold at most interior_children_max children.
        if len(children) >= limits.interior_children_max:
            full = children[: limits.interior_children_max]
            self.levels[level] = children[limits.interior_children_max :]
            pos = out.add_chunk(fmt.encode_interior(full))
            self._push(out, level + 1, _ptr_for_children(full, pos))

    def _packed_level(self, index: int) -> _PackedLevel:
        level = self.levels[index]
        packed = self._packed
        while len(packed) <= index:
            packed.append(None)
        cached = packed[index]
        if (
            cached is None
            or cached.count != len(level)
            or cached.first_pos != level[0].pos
            or cached.last_pos != level[-1].pos
        ):
            cached = packed[index] = _pack_level(level)
        return cached

    def write_root(self, out: Appender) -> fmt.Root | None:
        """Writes the edge (open leaf, then each rightmost interior node) and returns the root."""
        current: fmt.Ptr | None = None
        height = 0
        if self.leaf.seqs:
            current = _ptr_for_leaf(self.leaf, out.add_chunk(fmt.encode_leaf(self.leaf)))
            height = 1
        levels = self.levels
        # The highest level holding a child: above it the edge is a chain of single children.
        top = len(levels) - 1
        while top >= 0 and not levels[top]:
            top -= 1
        for level_index, level in enumerate(levels):
            if not level:
                if current is None:
                    continue
                if level_index >= top:
                    break  # the open child is the root
                chunk = fmt.encode_interior([current])
                current = _ptr_for_children([current], out.add_chunk(chunk))
                height = level_index + 2
                continue
            if current is None and len(level) == 1 and level_index >= top:
                current = level[0]
                height = level_index + 1
                break
            packed = self._packed_level(level_index)
            pos = out.add_chunk(fmt.encode_interior_packed(packed.count, packed.columns, current))
            entries, payload_bytes = packed.entries, packed.payload_bytes
            if current is not None:
                entries += current.count
                payload_bytes += current.payload_bytes
            current = fmt.Ptr(level[0].first_seq, pos, entries, payload_bytes)
            height = level_index + 2
        if current is None:
            return None
        return fmt.Root(
            current.pos, current.count, current.payload_bytes, current.first_seq, height
        )

    @staticmethod
    def from_root(reader: NodeReader, root: fmt.Root | None, upto_seq: int | None = None) -> Edge:
        """Rebuilds the edge of a tree, cut after ``upto_seq`` if given (rollback)."""
        edge = Edge()
        if root is None:
            return edge
        height = root.height
        edge.levels = [[] for _ in range(height - 1)]
        pos = root.pos
        for level in range(height - 1, 0, -1):
            node = reader.read_node(pos)
            if not isinstance(node, fmt.Interior):
                raise CorruptionError("expected an interior node", path=reader.path, offset=pos)
            children = node.children
            if upto_seq is None:
                index = len(children) - 1
            else:
                firsts = [c.first_seq for c in children]
                index = bisect.bisect_right(firsts, upto_seq) - 1
                if index < 0:
                    edge.levels[level - 1] = []
                    return _trim_empty(edge)
            edge.levels[level - 1] = list(children[:index])
            pos = children[index].pos
        node = reader.read_node(pos)
        if not isinstance(node, fmt.Leaf):
            raise CorruptionError("expected a leaf", path=reader.path, offset=pos)
        if upto_seq is not None:
            keep = bisect.bisect_right(node.seqs, upto_seq)
            node = slice_leaf(node, 0, keep)
        edge.leaf = node
        return _trim_empty(edge)


def _trim_empty(edge: Edge) -> Edge:
    while edge.levels and not edge.levels[-1]:
        edge.levels.pop()
    return edge


def iter_leaves(
    reader: NodeReader, root: fmt.Root | None, after_seq: int, upto_seq: int
) -> Iterator[fmt.Leaf]:
    """Leaves holding seqs in ``(after_seq, upto_seq]``, in seq order."""
    if root is None or upto_seq <= after_seq:
        return
    yield from _iter_node(reader, root.pos, root.height, after_seq, upto_seq)


def _iter_node(
    reader: NodeReader, pos: int, height: int, after_seq: int, upto_seq: int
) -> Iterator[fmt.Leaf]:
    node = reader.read_node(pos)
    if height == 1:
        if not isinstance(node, fmt.Leaf):
            raise CorruptionError("expected a leaf", path=reader.path, offset=pos)
        yield node
        return
    if not isinstance(node, fmt.Interior):
        raise CorruptionError("expected an interior node", path=reader.path, offset=pos)
    children = node.children
    firsts = [c.first_seq for c in children]
    first = max(0, bisect.bisect_right(firsts, after_seq + 1) - 1)
    end = bisect.bisect_right(firsts, upto_seq, lo=first)
    if height == 2:
        yield from reader.read_leaves([child.pos for child in children[first:end]])
        return
    for child in children[first:end]:
        yield from _iter_node(reader, child.pos, height - 1, after_seq, upto_seq)


def find_entry(reader: NodeReader, root: fmt.Root | None, seq: int) -> tuple[fmt.Leaf, int] | None:
    """The leaf holding ``seq`` and its index there, or None."""
    if root is None:
        return None
    pos, height = root.pos, root.height
    while height > 1:
        node = reader.read_node(pos)
        if not isinstance(node, fmt.Interior):
            raise CorruptionError("expected an interior node", path=reader.path, offset=pos)
        firsts = [c.first_seq for c in node.children]
        index = bisect.bisect_right(firsts, seq) - 1
        if index < 0:
            return None
        pos = node.children[index].pos
        height -= 1
    leaf = reader.read_node(pos)
    if not isinstance(leaf, fmt.Leaf):
        raise CorruptionError("expected a leaf", path=reader.path, offset=pos)
    index = bisect.bisect_left(leaf.seqs, seq)
    if index < len(leaf.seqs) and leaf.seqs[index] == seq:
        return leaf, index
    return None
