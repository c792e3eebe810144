"""The node process: one member of the cluster's chains (docs/node-api.md).

- ``server``: running one node in this process (ports, lock, signals).
- ``runtime``: ``Node``, the shard replicas it holds and the operations its faces call.
- ``binary_port``: the binary port's face (clients' produce and wait, replication links).
- ``http/``: the HTTP face (aiohttp): routes, request parsing, metrics, operator and lease calls.
- ``replicas/``: how the replicas a node holds change: topology changes, learners, self-repair.
- ``pages``, ``marks``, ``status``, ``retention``: what ``Node`` reads or runs beside its replicas.

The faces (``http/``, ``binary_port``) call into ``Node``; nothing below them imports a face.
"""
