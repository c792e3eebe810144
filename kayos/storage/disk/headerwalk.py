"""The metadata as of an earlier seq: a walk back along a store's header chain.

A store's metadata map is one chunk per header, not kept per seq (docs/storage-format.md,
"Rollback"): the map as of seq ``s`` is the one of the newest header with ``last_seq <= s``. A
rollback restores the replicated keys from it (``ShardStore.rollback_to``), and a link's read-back
piece carries it instead of its snapshot's map, which may be ahead of the piece
(docs/replication-protocol.md, "Applying batches"). Apart from the engine so that the read path
(``kayos.storage.reads.Snapshot``) walks the same way without importing it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kayos import limits
from kayos.storage.disk import btree
from kayos.storage.disk import format as fmt
from kayos.storage.disk.datafile import read_header_at
from kayos.storage.disk.fileops import FileHandle


@dataclass(frozen=True)
class MetaAsOf:
    """The map of the newest header at or below a seq: ``at`` is that header's ``last_seq``;
    ``exact``: no commit in ``(at, seq]`` changed the metadata (``at`` is the seq, or the header
    after it in the chain kept the same metadata chunk: the group commit holding the seq changed
    none), so it is the map as of the seq itself."""

    meta: dict[str, Any]
    at: int
    exact: bool


def meta_as_of(
    handle: FileHandle,
    reader: btree.NodeReader,
    header: fmt.Header,
    header_block: int,
    seq: int,
    *,
    current: dict[str, Any] | None = None,
    headers_max: int = limits.rollback_meta_headers_max,
) -> MetaAsOf | None:
    """The metadata as of ``seq``, walking back from ``header`` (at block ``header_block``, or any
    position past it) along ``prev_header``, reading at most ``headers_max`` headers; None when no
    header with ``last_seq <= seq`` is reached (the chain begins at a compaction past ``seq``, or
    the bound). ``current`` is ``header``'s map if the caller holds it (not read again)."""
    newer: fmt.Header | None = None
    pos = header_block
    for _ in range(headers_max):
        if header.last_seq <= seq:
            exact = header.last_seq == seq or newer is None or newer.meta == header.meta
            if newer is None and current is not None:
                meta = current
            else:
                meta = reader.read_meta(header.meta) if header.meta >= 0 else {}
            return MetaAsOf(meta, header.last_seq, exact)
        if not 0 <= header.prev_header < pos:
            return None
        pos = header.prev_header
        newer, header = header, read_header_at(handle, pos)
    return None
