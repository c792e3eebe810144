"""The right edge's caches (open leaf size, packed interior columns) write exactly the bytes the
plain algorithm writes, commit after commit, and the background index checkpoint."""

from __future__ import annotations

import random
import threading

import pytest

from kayos import limits
from kayos.storage.disk import btree
from kayos.storage.disk import format as fmt
from kayos.storage.disk.index import DerivedIndex
from kayos.storage.engine import ShardStore, StoreOptions

pytestmark = pytest.mark.unit


def _reference_write_root(edge: btree.Edge, out: btree.Appender) -> fmt.Root | None:
    """write_root as it was before the caches: every node encoded from its children."""
    current: fmt.Ptr | None = None
    height = 0
    if edge.leaf.seqs:
        leaf = edge.leaf
        pos = out.add_chunk(fmt.encode_leaf(leaf))
        current = fmt.Ptr(leaf.seqs[0], pos, len(leaf.seqs), sum(leaf.sizes))
        height = 1
    for level_index, level in enumerate(edge.levels):
        children = level + ([current] if current is not None else [])
        higher_empty = not any(edge.levels[level_index + 1 :])
        if not children:
            continue
        if len(children) == 1 and higher_empty:
            current = children[0]
            height = level_index + 1
            break
        pos = out.add_chunk(fmt.encode_interior(children))
        current = fmt.Ptr(
            children[0].first_seq,
            pos,
            sum(c.count for c in children),
            sum(c.payload_bytes for c in children),
        )
        height = level_index + 2
    if current is None:
        return None
    return fmt.Root(current.pos, current.count, current.payload_bytes, current.first_seq, height)


def _entries(rng: random.Random, first_seq: int, count: int) -> fmt.Leaf:
    sizes = [rng.randrange(1, 60) for _ in range(count)]
    return fmt.Leaf(
        list(range(first_seq, first_seq + count)),
        [b"k%d" % (first_seq + i) for i in range(count)],
        [b"v" * size for size in sizes],
        [0] * count,
        [0] * count,
        sizes,
        None,
        None,
    )


@pytest.mark.parametrize("seed", range(4))
def test_cached_edge_writes_the_reference_bytes(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    monkeypatch.setattr(limits, "leaf_bytes_target", 300)
    monkeypatch.setattr(limits, "interior_children_max", 4)
    rng = random.Random(seed)
    edge = btree.Edge()
    seq = 1
    pos = 0
    for _ in range(400):
        count = rng.choice((1, 1, 1, 2, 5, 20))
        entries = _entries(rng, seq, count)
        seq += count
        out = btree.Appender(pos)
        edge = edge.append(out, entries)
        # The same edge without caches, written by the reference algorithm.
        cold = btree.Edge(edge.leaf, [list(level) for level in edge.levels])
        mark = out.pos
        expect_out = btree.Appender(mark)
        expect_root = _reference_write_root(cold, expect_out)
        root = edge.write_root(out)
        assert root == expect_root
        assert out.take()[mark - pos :] == expect_out.take()
        assert edge.leaf_bytes() == sum(edge.leaf.sizes) + 24 * len(edge.leaf.seqs)
        pos = out.pos
    assert len(edge.levels) >= 3


def test_interior_packed_matches_encode_interior() -> None:
    rng = random.Random(7)
    for count in (1, 2, 15, 16, 17, 128, 300):
        children = [
            fmt.Ptr(
                rng.randrange(1 << 40),
                rng.randrange(1 << 35),
                rng.randrange(1, 1 << 20),
                rng.randrange(1 << 33),
            )
            for _ in range(count)
        ]
        whole = fmt.encode_interior(children)
        assert fmt.encode_interior_packed(count, fmt.pack_interior_columns(children), None) == whole
        if count > 1:
            head = fmt.pack_interior_columns(children[:-1])
            assert fmt.encode_interior_packed(count - 1, head, children[-1]) == whole


def test_checkpoint_runs_off_the_commit_path(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = threading.Event()
    threads: list[str] = []
    original = DerivedIndex.checkpoint

    def checkpoint(self: DerivedIndex) -> None:
        threads.append(threading.current_thread().name)
        original(self)
        ran.set()

    monkeypatch.setattr(DerivedIndex, "checkpoint", checkpoint)
    store = ShardStore.open(str(tmp_path), options=StoreOptions(index_checkpoint_commits=4))
    try:
        for i in range(4):
            store.commit_columns([b"k%d" % i], [b"v"])
        assert ran.wait(10)
        assert threads == ["kayos-index-checkpoint"]
    finally:
        store.close()
    assert threads[-1] == threading.current_thread().name  # a clean close syncs in place
