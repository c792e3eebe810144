"""A local cluster of real processes on loopback: what ``kayos up``, the benchmarks, the chaos
campaign and the integration tests start.

- ``cluster.py``: ``LocalCluster``, nodes and manager members under one data root;
- ``kestrel.py``: the Kestrel front as a child process, and a cluster that runs one;
- ``managers.py``: the manager members' ids, ports, command line and leader;
- ``up.py``: ``kayos up`` in the foreground (printing, supervising, stopping);
- ``supervisor.py``: when a member that died is started again (pure decisions);
- ``processes.py``, ``ports.py``, ``http.py``: stopping a process and reading its log, free
  ports, plain JSON requests.

A face (the top floor): it starts and signals processes and reaches them over HTTP only; it
imports no node or storage code, only the topology, identity, the data directory's lock and the
manager member's topology-file tables.
"""
