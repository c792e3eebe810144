"""The benchmarks behind ``kayos bench`` (kayos/cli/bench.py) and a few ``python -m`` ones:
``storage.py`` (the shard store against lmdb), ``produce.py`` (a chain end to end),
``retention.py`` (the retention soak), ``spark.py`` with ``spark_floor.py`` (the Spark source),
``kestrel/`` (the Kestrel front) and ``membership/`` (failover, healing, growing, catch-up under
load). A face: each starts a local cluster (kayos/local/) and measures it through the client.

It ships in the wheel. ``kayos bench`` is a documented command of the installed ``kayos`` script
(README, docs/performance.md, docs/operations.md): an operator runs it to measure a machine
before trusting it with a cluster, and the figures in the docs are its output, so they can be
checked on the machine at hand. Leaving the package out would leave ``kayos bench`` listed in
``kayos --help`` and failing with an ImportError when run. Shipping it costs a few thousand lines
of pure Python and nothing at run time: the ``bench`` commands import their module when they
run, nothing in the product imports it, and what only some benchmarks need beyond the base
dependencies (python-memcached for the Kestrel ones, the ``spark`` extra) is imported by those
alone.
"""
