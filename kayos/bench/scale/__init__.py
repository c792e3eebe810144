"""``kayos bench scale``: scale-out on one machine. Node processes each capped to a CPU share with
the cgroup cpu controller (``cgroups.py``), acks=all throughput of one queue over one shard and
over several (``run.py``), each node's CPU seconds per message by its role in the chains, and
the capacity model that predicts a cluster's throughput from those costs (``model.py``,
docs/performance.md "Scale-out on capped nodes")."""
