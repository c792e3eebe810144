"""What a shard store keeps on disk, with no store around it: the file format (``format``), file
I/O behind a fakeable interface (``fileops``), the copy-on-write sequence tree (``btree``), data
files and their headers (``datafile``), the walk back along the header chain (``headerwalk``) and
the derived key index and successor map (``index``); docs/storage-format.md.

May import the shared ground (kayos.errors, kayos.limits) and its own modules, nothing else of
kayos: the store (kayos.storage) and its maintenance (kayos.storage.maintenance) build on it.
"""
