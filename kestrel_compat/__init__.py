"""Kestrel 2.x compatibility front for Kayos (memcache, text and thrift protocols).

The rooms, from the bottom up (docs/kestrel-compat.md has the module table):

- ``limits`` and ``eager``: the front's bounds, and running a request in the caller until it waits;
- ``core/``: the queue semantics, pure (queues, the collection, configuration, server status);
- ``wire/``: the three protocols' codecs, sans-IO; ``backends/``: where items are kept;
- ``sessions/``: one session per connection over the shared service; ``migration/``: importing
  Kestrel journals (``kayos import-kestrel``);
- ``server`` (the only socket code) and ``cli`` (``kayos kestrel``, ``python -m kestrel_compat``).
"""
