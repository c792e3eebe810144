"""How the replicas a node holds come, go and are copied back (docs/node-api.md, "Topology
changes", "Learners", "Self-repair"): ``reconfigure`` applies a new topology (replicas opened,
re-made, closed), ``learners`` copies a shard from outside its chain, ``repair`` has a damaged
head re-fetch what it lost before it leads. It imports replication and storage, never the node's
faces nor ``kayos.node.runtime`` (each module names what it uses of ``Node`` as a Protocol).
"""
