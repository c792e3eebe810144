"""``kayos import-kestrel``: a Kestrel 2.x journal directory into the queues the front serves.

``journal`` reads Kestrel's journal files (no I/O), ``plan`` decides what to import, ``importer``
produces it through ``kestrel_compat.backends.kayos_backend``, and ``cli`` is the command line
(docs/migrating-from-kestrel.md).
"""
