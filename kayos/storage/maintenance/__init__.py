"""Looking after a shard store from outside its commit path: the offline check (``check``, behind
``kayos check``), pauseless compaction (``compact``), salvage of a damaged store (``salvage``) and
the pure retention rules whose floors compaction applies (``retention``).

May import the store (kayos.storage.engine), its on-disk layer (kayos.storage.disk) and the shared
ground; the store never imports these modules.
"""
