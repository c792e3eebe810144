"""Benchmarks that change a chain's members under live load: ``kayos bench failover`` (kill -9
and SIGSTOP of each role, as connected producers see them), ``kayos bench heal`` (a dead and a
slow node spliced out, a returning node caught up), ``kayos bench grow`` (a node added and the
cluster rebalanced onto it), the learner catch-up (``python -m
kayos.bench.membership.catchup``), and the closed- and open-loop producers they share
(``load.py``)."""
